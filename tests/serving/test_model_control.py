"""Model control (``--model-control-mode explicit``) on real servers: KServe's
RepositoryModelLoad / RepositoryModelUnload from our stub and from an unmodified tritonclient.

Asserted: a model left out at start is loaded and answers; an unloaded one is refused with
NOT_FOUND saying so, listed UNAVAILABLE, and its decode thread stops; a reload picks up the
entry's changed config and a new version while a stream on the old one runs to its end; a broken
entry fails with FAILED_PRECONDITION and leaves what was served serving; every bad request gets
its status; with the mode off both RPCs answer FAILED_PRECONDITION. With two frontend processes
a change made through one connection holds on every frontend once the call returns.
"""

from __future__ import annotations

import gc
import json
import shutil
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import attnserve_cli
from serving.errors import InvalidArgument
from serving.kserve.model_control import check_load_parameters, check_unload_parameters
from serving.kserve.tensors import decode_outputs, input_tensor
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as apb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.repository import UNLOADED
from tests.reliability.harness import copy_repository
from tests.serving.frontends import two_frontends
from tests.serving.server_thread import ServerThread

TIMEOUT = 60
TRITON = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"
Stub = pb_grpc.GRPCInferenceServiceStub


def vit_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="vit")
    header, raw = input_tensor("pixel_values", "FP32", np.zeros((1, 3, 32, 32), np.float32))
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    return request


def translate(stub: Stub) -> str:
    request = pb.ModelInferRequest(model_name="translator")
    header, raw = input_tensor("text", "BYTES", np.array([b"forty-two"], dtype=object))
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    request.parameters["target_language"].string_param = "de"
    request.parameters["max_new_tokens"].int64_param = 4
    return str(decode_outputs(stub.ModelInfer(request, timeout=TIMEOUT))["translation"][0])


def index(stub: Stub) -> dict[str, tuple[str, str, str]]:
    reply = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=TIMEOUT)
    return {m.name: (m.version, m.state, m.reason) for m in reply.models}


def load(stub: Stub, name: str, **parameters: pb.ModelRepositoryParameter) -> None:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    stub.RepositoryModelLoad(request, timeout=TIMEOUT)


def unload(stub: Stub, name: str, **parameters: pb.ModelRepositoryParameter) -> None:
    request = pb.RepositoryModelUnloadRequest(model_name=name)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    stub.RepositoryModelUnload(request, timeout=TIMEOUT)


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    return err.value.code(), err.value.details()


def engine_threads(name: str) -> int:
    return sum(t.name == f"engine-{name}" and t.is_alive() for t in threading.enumerate())


@pytest.fixture
def repository(tiny_repository: Path, tmp_path: Path) -> Path:
    return copy_repository(tiny_repository, tmp_path / "repository")


@pytest.fixture
def server(repository: Path) -> Iterator[ServerThread]:
    with ServerThread(
        repository, metrics_port=-1, models=("vit",), model_control_mode="explicit"
    ) as running:
        yield running


@pytest.fixture
def stub(server: ServerThread) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield Stub(channel)


def test_a_left_out_model_loads_serves_and_unloads(stub: Stub, server: ServerThread) -> None:
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert {"model_repository", "model_repository(unload_dependents)"} <= set(meta.extensions)
    code, details = refused(translate, stub)
    assert code == grpc.StatusCode.NOT_FOUND and "not served (not loaded" in details
    assert engine_threads("translator") == 0

    load(stub, "translator")
    assert translate(stub)
    assert index(stub)["translator"] == ("1", "READY", "")
    assert stub.ModelReady(pb.ModelReadyRequest(name="translator"), timeout=TIMEOUT).ready
    assert engine_threads("translator") == 1
    assert server.running is not None
    served = weakref.ref(server.running.repository.get("translator"))

    unload(stub, "translator", unload_dependents=pb.ModelRepositoryParameter(bool_param=True))
    code, details = refused(translate, stub)
    assert code == grpc.StatusCode.NOT_FOUND
    assert f"'translator' is not served ({UNLOADED})" in details
    assert "RepositoryModelLoad" in details
    assert index(stub)["translator"] == ("", "UNAVAILABLE", UNLOADED)
    assert not stub.ModelReady(pb.ModelReadyRequest(name="translator"), timeout=TIMEOUT).ready
    assert engine_threads("translator") == 0  # its decode loop stopped
    gc.collect()
    assert served() is None  # nothing holds the model (its sessions, its cache) any more
    # the other model served throughout
    assert decode_outputs(stub.ModelInfer(vit_request(), timeout=TIMEOUT))["probabilities"].shape
    code, _ = refused(unload, stub, "translator")
    assert code == grpc.StatusCode.NOT_FOUND
    # with every model unloaded the server stays ready (as Triton's), and loads them again
    unload(stub, "vit")
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
    assert {state for _, state, _ in index(stub).values()} == {"UNAVAILABLE"}
    load(stub, "vit")
    assert decode_outputs(stub.ModelInfer(vit_request(), timeout=TIMEOUT))["probabilities"].shape


def test_a_reload_reads_the_changed_entry(
    stub: Stub, repository: Path, server: ServerThread
) -> None:
    def vit_config() -> tuple[list[str], int]:
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="vit"), timeout=TIMEOUT)
        config = stub.ModelConfig(pb.ModelConfigRequest(name="vit"), timeout=TIMEOUT).config
        return list(meta.versions), config.max_batch_size

    versions, batch = vit_config()
    assert versions == ["1"]
    config = repository / "vit" / "config.yaml"
    text = config.read_text()
    assert f"max_batch_size: {batch}" in text
    config.unlink()  # the copy's files are links to the session's repository: replace, not edit
    config.write_text(text.replace(f"max_batch_size: {batch}", f"max_batch_size: {batch // 2}"))
    shutil.copytree(repository / "vit" / "1", repository / "vit" / "2")
    assert server.running is not None
    replaced = weakref.ref(server.running.repository.get("vit"))
    gc.collect()
    gc.freeze()  # as `attnserve serve` freezes its start-up heap, the model in it
    try:
        load(stub, "vit")
        assert replaced() is None  # the classifier's cycle collected though it was frozen
    finally:
        gc.unfreeze()
    assert vit_config() == (["2"], batch // 2)
    assert index(stub)["vit"] == ("2", "READY", "")
    assert decode_outputs(stub.ModelInfer(vit_request(), timeout=TIMEOUT))["probabilities"].shape


def test_a_reload_lets_running_streams_finish(stub: Stub, server: ServerThread) -> None:
    load(stub, "translator")
    channel = grpc.insecure_channel(server.address)
    text_stub = apb_grpc.AttnServeStub(channel)
    options = apb.DecodingOptions(max_new_tokens=32, min_new_tokens=32)
    requests = [
        apb.TranslateStreamRequest(text=f"{n} forty-two", target_language="de", options=options)
        for n in range(8)
    ]
    streams = [text_stub.TranslateStream(request, timeout=TIMEOUT) for request in requests]
    firsts = [next(stream) for stream in streams]  # every stream runs on the loaded version
    load(stub, "translator")  # returns once the old version's requests have finished
    for first, stream in zip(firsts, streams, strict=True):
        assert len([*first.token_ids, *(t for m in stream for t in m.token_ids)]) == 32
        assert stream.code() == grpc.StatusCode.OK
    channel.close()
    assert translate(stub)  # served by the new version
    assert engine_threads("translator") == 1


def test_a_reload_whose_caller_gives_up_runs_to_its_end(stub: Stub, server: ServerThread) -> None:
    load(stub, "translator")
    assert server.running is not None
    repository = server.running.repository
    before = weakref.ref(repository.get("translator"))
    request = pb.RepositoryModelLoadRequest(model_name="translator")
    code, _ = refused(stub.RepositoryModelLoad, request, timeout=0.05)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + TIMEOUT
    while repository.get("translator") is before() or engine_threads("translator") != 1:
        assert time.monotonic() < deadline, "the reload stopped halfway"
        time.sleep(0.05)
    assert translate(stub)  # the new version serves, the old one stopped


def test_broken_entries_and_bad_requests(stub: Stub, repository: Path) -> None:
    # a new entry with a broken config: FAILED_PRECONDITION, listed with the reason
    shutil.copytree(repository / "vit", repository / "broken", copy_function=shutil.copy)
    (repository / "broken" / "config.yaml").write_text("name: broken\nkind: [not, a, kind]\n")
    code, details = refused(load, stub, "broken")
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot serve" in details and "fix the entry" in details
    version, state, reason = index(stub)["broken"]
    assert (version, state) == ("", "UNAVAILABLE") and reason.startswith("load failed: ")
    # a served model whose entry breaks keeps serving its loaded version
    config = repository / "vit" / "config.yaml"
    good = config.read_text()
    config.unlink()
    config.write_text("max_batch_size: [")
    code, details = refused(load, stub, "vit")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stays served" in details
    assert index(stub)["vit"] == ("1", "READY", "")
    assert decode_outputs(stub.ModelInfer(vit_request(), timeout=TIMEOUT))["probabilities"].shape
    config.write_text(good)
    load(stub, "vit")

    flag = pb.ModelRepositoryParameter
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any], grpc.StatusCode, str]] = [
        (load, ("nothing",), {}, grpc.StatusCode.NOT_FOUND, "has no entry 'nothing'"),
        (load, ("../vit",), {}, grpc.StatusCode.INVALID_ARGUMENT, "is not a model name"),
        (
            load,
            ("vit",),
            {"config": flag(string_param="{}")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "'config' is not supported",
        ),
        (
            load,
            ("vit",),
            {"file:1/model.onnx": flag(bytes_param=b"x")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "is not supported",
        ),
        (
            unload,
            ("vit",),
            {"unload_dependents": flag(string_param="yes")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "must be a bool",
        ),
        (
            unload,
            ("vit",),
            {"force": flag(bool_param=True)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown unload parameter 'force'",
        ),
        (unload, ("captioner",), {}, grpc.StatusCode.NOT_FOUND, "not served (not loaded"),
        (unload, ("",), {}, grpc.StatusCode.INVALID_ARGUMENT, "is not a model name"),
    ]
    for call, args, parameters, status, message in cases:
        code, details = refused(call, stub, *args, **parameters)
        assert (code, message in details) == (status, True), (args, parameters, details)
    request = pb.RepositoryModelLoadRequest(model_name="vit", repository_name="elsewhere")
    code, details = refused(stub.RepositoryModelLoad, request, timeout=TIMEOUT)
    assert code == grpc.StatusCode.NOT_FOUND and "no repository named 'elsewhere'" in details
    assert index(stub)["vit"] == ("1", "READY", "")  # nothing above changed what is served


def test_tritonclient_loads_and_unloads(server: ServerThread) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON)
    utils = pytest.importorskip("tritonclient.utils", reason=TRITON)
    client = grpcclient.InferenceServerClient(url=server.address)
    try:
        client.load_model("captioner")
        assert client.is_model_ready("captioner")
        client.unload_model("captioner", unload_dependents=True)
        assert not client.is_model_ready("captioner")
        with pytest.raises(utils.InferenceServerException, match="not supported"):
            client.load_model("captioner", config='{"max_batch_size": 2}')
    finally:
        client.close()


def test_off_by_default(tiny_repository: Path) -> None:
    with (
        ServerThread(tiny_repository, metrics_port=-1, models=("vit",)) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = Stub(channel)
        for call in (load, unload):
            code, details = refused(call, stub, "vit")
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--model-control-mode explicit" in details
        meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
        assert "model_repository" not in meta.extensions
        assert index(stub)["vit"] == ("1", "READY", "")


def test_two_frontends_apply_a_change_before_it_returns(repository: Path) -> None:
    with two_frontends(repository, "--model-control-mode", "explicit") as (_, stubs):
        for round_ in range(2):  # load, unload, load again through different connections
            load(stubs[round_], "translator")
            assert all(translate(stub) for stub in stubs)
            assert all(index(stub)["translator"] == ("1", "READY", "") for stub in stubs)
            unload(stubs[-1 - round_], "translator")
            for stub in stubs:
                code, details = refused(translate, stub)
                assert code == grpc.StatusCode.NOT_FOUND and UNLOADED in details
        load(stubs[0], "translator")
        code, details = refused(load, stubs[1], "nothing")
        assert code == grpc.StatusCode.NOT_FOUND and "has no entry 'nothing'" in details
        assert all(translate(stub) for stub in stubs)


def parameter_maps() -> st.SearchStrategy[dict[str, pb.ModelRepositoryParameter]]:
    value = st.one_of(
        st.booleans().map(lambda b: pb.ModelRepositoryParameter(bool_param=b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: pb.ModelRepositoryParameter(int64_param=i)),
        st.text(max_size=8).map(lambda s: pb.ModelRepositoryParameter(string_param=s)),
        st.binary(max_size=8).map(lambda b: pb.ModelRepositoryParameter(bytes_param=b)),
        st.just(pb.ModelRepositoryParameter()),
    )
    keys = st.one_of(st.sampled_from(["unload_dependents", "config", "file:1/x"]), st.text())
    return st.dictionaries(keys, value, max_size=3)


@given(parameter_maps())
def test_parameter_checks_accept_only_what_is_served(
    parameters: dict[str, pb.ModelRepositoryParameter],
) -> None:
    def accepted(check: Any) -> bool:
        try:
            check(parameters)
        except InvalidArgument as err:
            assert str(err)
            return False
        return True

    assert accepted(check_load_parameters) == (not parameters)
    unload_ok = all(
        key == "unload_dependents" and value.WhichOneof("parameter_choice") == "bool_param"
        for key, value in parameters.items()
    )
    assert accepted(check_unload_parameters) == unload_ok


def test_the_models_command(
    server: ServerThread, stub: Stub, capsys: pytest.CaptureFixture[str]
) -> None:
    def models(*args: str) -> int:
        return attnserve_cli.main(["models", *args, "--server", server.address])

    assert models() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model", "version", "state", "reason"]
    assert lines[3].split()[:2] == ["vit", "1"] and lines[3].split()[2] == "READY"
    assert lines[2].split()[:3] == ["translator", "-", "UNAVAILABLE"]

    assert models("load", "translator") == 0
    assert capsys.readouterr().out == "loaded translator\n"
    assert translate(stub)
    assert models("list", "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1] == {"model": "translator", "version": "1", "state": "READY", "reason": ""}
    assert models("unload", "translator") == 0
    assert capsys.readouterr().out == "unloaded translator\n"
    assert index(stub)["translator"] == ("", "UNAVAILABLE", UNLOADED)

    assert models("unload", "translator") == 2  # not served: NOT_FOUND, a usage error
    assert "is not served (unloaded" in capsys.readouterr().err
    assert models("load") == 2
    assert "name the model" in capsys.readouterr().err
