"""Log settings (Triton's logging extension): what ``--log-level`` stands for, the checks, the
settings applied to a process's logging, the KServe ``LogSettings`` RPC (ours and
tritonclient's), and two frontend processes that get one change."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.errors import InvalidArgument
from serving.log_settings import TYPES, LogControl, LogSettings, parse_log_changes
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.reliability.harness import says_what_to_fix
from tests.serving.frontends import two_frontends
from tests.serving.server_thread import ServerThread

TIMEOUT = 60
TRITON = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"
Stub = pb_grpc.GRPCInferenceServiceStub
DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def log_settings(stub: Stub, **changes: Any) -> dict[str, Any]:
    request = pb.LogSettingsRequest()
    for name, value in changes.items():
        kind = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
        setattr(request.settings[name], kind, value)
    reply = stub.LogSettings(request, timeout=TIMEOUT)
    return {
        name: getattr(value, str(value.WhichOneof("parameter_choice")))
        for name, value in reply.settings.items()
    }


def test_the_log_level_stands_for_settings() -> None:
    assert LogSettings.for_level("info") == LogSettings()
    assert LogSettings.for_level("DEBUG").log_verbose_level == 1
    warning = LogSettings.for_level("WARNING")
    assert (warning.log_info, warning.log_warning, warning.log_error) == (False, True, True)
    error = LogSettings.for_level("ERROR")
    assert (error.log_warning, error.log_error) == (False, True)
    with pytest.raises(ValueError, match="use DEBUG, INFO"):
        LogSettings.for_level("loud")


def test_the_settings_apply_to_the_handlers() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root, log = logging.getLogger(), logging.getLogger("attnserve.test_log_settings")
    level = root.level
    root.addHandler(handler)
    try:
        control = LogControl(LogSettings(), [handler])
        log.debug("d1")
        log.info("i1")
        control.update({"log_info": False, "log_verbose_level": 2})
        log.debug("d2")
        log.info("i2")
        log.warning("w2")
        control.update({"log_warning": False, "log_format": "ISO8601"})
        log.warning("w3")
        log.error("e3")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = out.getvalue().splitlines()
    assert [line.split()[-1] for line in lines] == ["i1", "d2", "w2", "e3"]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO i1$", lines[0])
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ERROR e3$", lines[-1])


def test_parse_log_changes_examples() -> None:
    assert parse_log_changes({"log_info": False, "log_verbose_level": 3}) == {
        "log_info": False,
        "log_verbose_level": 3,
    }
    for changes, message in [
        ({"log_file": "/tmp/x.log"}, "log_file cannot be set"),
        ({"log_info": 1}, "log_info takes a bool_param"),
        ({"log_verbose_level": True}, "log_verbose_level takes a uint32_param"),
        ({"log_format": "json"}, "log_format must be one of default, ISO8601"),
        ({"log_level": "INFO"}, "unknown log setting 'log_level'"),
    ]:
        with pytest.raises(InvalidArgument, match=message) as err:
            parse_log_changes(changes)
        assert says_what_to_fix(str(err.value)), err.value


@given(
    st.dictionaries(
        st.one_of(st.sampled_from(tuple(TYPES)), st.text(max_size=10)),
        st.one_of(st.booleans(), st.integers(0, 2**32 - 1), st.text(max_size=10)),
        max_size=6,
    )
)
def test_parse_log_changes_takes_or_refuses_anything(changes: dict[str, Any]) -> None:
    try:
        parsed = parse_log_changes(changes)
    except InvalidArgument as err:
        assert says_what_to_fix(str(err))
        return
    assert parsed == changes and "log_file" not in parsed
    assert all(type(value) is TYPES[name] for name, value in parsed.items())
    LogSettings(**parsed)  # every parsed change fits the settings


@pytest.fixture
def stub(tiny_repository: Path) -> Iterator[Stub]:
    with (
        ServerThread(tiny_repository, metrics_port=-1, models=("vit",)) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        yield Stub(channel)


def test_log_settings_reads_and_changes_the_settings(stub: Stub) -> None:
    assert log_settings(stub) == DEFAULTS
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert "logging" in meta.extensions
    changed = log_settings(stub, log_verbose_level=1, log_format="ISO8601", log_info=False)
    assert changed == {
        **DEFAULTS,
        "log_verbose_level": 1,
        "log_format": "ISO8601",
        "log_info": False,
    }
    assert log_settings(stub) == changed
    for changes, message in [
        ({"log_file": "/tmp/elsewhere.log"}, "log_file cannot be set"),
        ({"log_error": 0}, "log_error takes a bool_param"),
        ({"log_format": "plain"}, "log_format must be one of"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            log_settings(stub, **changes)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
    request = pb.LogSettingsRequest()
    request.settings["log_info"].SetInParent()  # a value with no parameter set
    with pytest.raises(grpc.RpcError) as err:
        stub.LogSettings(request, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "set its bool_param" in err.value.details()
    assert log_settings(stub) == changed  # none of them changed anything


def test_tritonclient_reads_and_changes_log_settings(tiny_repository: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON)
    with ServerThread(tiny_repository, metrics_port=-1, models=("vit",)) as server:
        client = grpcclient.InferenceServerClient(url=server.address)
        try:
            client.update_log_settings(settings={"log_verbose_level": 2, "log_warning": False})
            settings = client.get_log_settings(as_json=True)["settings"]
            assert settings["log_verbose_level"] == {"uint32_param": 2}
            assert settings["log_warning"] == {"bool_param": False}
        finally:
            client.close()


def test_two_frontends_and_the_engine_get_one_change(tiny_repository: Path) -> None:
    with two_frontends(tiny_repository, "--model-control-mode", "explicit") as (server, stubs):
        assert log_settings(stubs[0], log_format="ISO8601")["log_format"] == "ISO8601"
        assert all(log_settings(stub)["log_format"] == "ISO8601" for stub in stubs)
        # a reload logs in the engine process and in each frontend: all in ISO 8601 now
        stubs[1].RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="vit"), timeout=60)
        for process in ("engine", "frontend-0", "frontend-1"):
            assert server.saw(f"Z attnserve-{process} INFO loaded vit", timeout=10), process
        assert log_settings(stubs[3], log_info=False)["log_info"] is False
        assert all(log_settings(stub)["log_info"] is False for stub in stubs)
        stubs[4].RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="vit"), timeout=60)
    loaded = [line for line in server.output if "INFO loaded vit" in line]
    assert len(loaded) == 3 + 3  # at the start, and at the first reload only
