"""Request traces served: real requests of every kind traced into Triton's JSON, the KServe
``TraceSetting`` RPC (ours and tritonclient's), its errors, and two frontend processes that
share one setting."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import attnserve_cli
from contract.images import encode_png
from models.data import digits
from serving.kserve.tensors import input_tensor
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as apb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.frontends import two_frontends
from tests.serving.server_thread import ServerThread

TIMEOUT = 60
TRITON = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"
ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]
Stub = pb_grpc.GRPCInferenceServiceStub


def trace_setting(stub: Stub, model: str = "", **settings: list[str]) -> dict[str, list[str]]:
    request = pb.TraceSettingRequest(model_name=model)
    for name, values in settings.items():
        request.settings[name].value.extend(values)
    reply = stub.TraceSetting(request, timeout=TIMEOUT)
    return {name: list(value.value) for name, value in reply.settings.items()}


def refused(
    stub: Stub, settings: dict[str, list[str]], model: str = ""
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        trace_setting(stub, model, **settings)
    return err.value.code(), err.value.details()


def traces_in(*paths: Path) -> list[dict[str, Any]]:
    """The traces of Triton-format files: each header's fields and ``stamps`` (name -> ns)."""
    traces: dict[tuple[Path, int], dict[str, Any]] = {}
    for path in paths:
        for record in json.loads(path.read_text()):
            trace = traces.setdefault((path, record["id"]), {"stamps": {}})
            for stamp in record.pop("timestamps", []):
                trace["stamps"][stamp["name"]] = stamp["ns"]
            trace.update({k: v for k, v in record.items() if k != "id"})
    return list(traces.values())


def kserve_vit(request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="vit", id=request_id)
    header, raw = input_tensor("pixel_values", "FP32", np.zeros((1, 3, 32, 32), np.float32))
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    return request


def digit_png() -> bytes:
    return encode_png(digits.load_digits_split("test")[0][0])


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return tmp_path / "trace.json"


@pytest.fixture
def server(tiny_repository: Path, trace_file: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, metrics_port=-1, trace_file=str(trace_file)) as running:
        yield running


@pytest.fixture
def stub(server: ServerThread) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield Stub(channel)


def test_requests_of_every_kind_are_traced(tiny_repository: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    settings = {"trace_level": "TIMESTAMPS", "trace_rate": 1, "trace_file": str(path)}
    with (
        ServerThread(tiny_repository, metrics_port=-1, **settings) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        ours, kserve = apb_grpc.AttnServeStub(channel), Stub(channel)
        options = apb.DecodingOptions(max_new_tokens=6, min_new_tokens=6)
        ours.Translate(
            apb.TranslateRequest(texts=["one", "two"], target_language="de", options=options),
            timeout=TIMEOUT,
        )
        streamed = ours.TranslateStream(
            apb.TranslateStreamRequest(text="three", target_language="de", options=options),
            timeout=TIMEOUT,
        )
        assert sum(len(message.token_ids) for message in streamed) == 6
        ours.Classify(apb.ClassifyRequest(image=digit_png(), top_k=2), timeout=TIMEOUT)
        kserve.ModelInfer(kserve_vit("request-7"), timeout=TIMEOUT)
        with pytest.raises(grpc.RpcError):  # no such model: not an inference of a model
            ours.Classify(apb.ClassifyRequest(image=digit_png(), model="nothing"), timeout=TIMEOUT)
        assert not path.exists()  # log_frequency 0: written when the server stops
    traces = traces_in(path)
    assert [t["model_name"] for t in traces] == ["translator", "translator", "vit", "vit"]
    for trace in traces:
        stamps = trace["stamps"]
        assert sorted(stamps, key=stamps.get) == ORDER, trace
        assert trace["model_version"] == 1
    assert traces[3]["request_id"] == "request-7"
    assert "request_id" not in traces[0]
    two_texts = traces[0]["stamps"]  # two sequences: first queue start ... last compute end
    assert two_texts["COMPUTE_END"] - two_texts["QUEUE_START"] > 0


def test_trace_setting_reads_and_changes_the_settings(stub: Stub, trace_file: Path) -> None:
    path = trace_file
    defaults = {
        "trace_level": ["OFF"],
        "trace_rate": ["1000"],
        "trace_count": ["-1"],
        "trace_file": [str(path)],
        "log_frequency": ["0"],
    }
    assert trace_setting(stub) == defaults
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert "trace" in meta.extensions
    vit = trace_setting(
        stub,
        "vit",
        trace_level=["TIMESTAMPS"],
        trace_rate=["2"],
        trace_count=["3"],
        log_frequency=["1"],
    )
    assert vit == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": ["2"],
        "trace_count": ["3"],
        "trace_file": [str(path)],
        "log_frequency": ["1"],
    }
    assert trace_setting(stub) == defaults  # the server's are unchanged
    assert trace_setting(stub, "translator") == defaults  # a model without its own: the server's
    for _ in range(4):
        stub.ModelInfer(kserve_vit(), timeout=TIMEOUT)
    assert trace_setting(stub, "vit")["trace_count"] == ["1"]  # what is left
    assert [len(traces_in(Path(f"{path}.{n}"))) for n in (0, 1)] == [1, 1]  # every 2nd, 1 a file
    assert trace_setting(stub, "vit", trace_level=[])["trace_level"] == ["OFF"]  # the server's
    for _ in range(4):
        stub.ModelInfer(kserve_vit(), timeout=TIMEOUT)
    assert not Path(f"{path}.2").exists()


def test_trace_setting_errors(stub: Stub, tmp_path: Path, tiny_repository: Path) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for settings, message in [
        ({"trace_mode": ["triton"]}, "unknown trace setting 'trace_mode'"),
        ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
        ({"trace_rate": ["0"]}, "trace_rate must be >= 1"),
        ({"trace_count": ["many"]}, "trace_count must be an integer"),
        ({"trace_file": [str(tmp_path / "elsewhere.json")]}, "only be set when the server starts"),
        ({"trace_file": []}, "does not let a client choose where the server writes"),
    ]:
        code, details = refused(stub, settings)
        assert (code, message in details) == (invalid, True), details
    code, details = refused(stub, {"trace_rate": ["1"]}, "nothing")
    assert code == grpc.StatusCode.NOT_FOUND and "nothing" in details
    assert trace_setting(stub)["trace_level"] == ["OFF"]  # none of them changed anything
    with (
        ServerThread(tiny_repository, metrics_port=-1) as bare,  # no --trace-file
        grpc.insecure_channel(bare.address) as channel,
    ):
        code, details = refused(Stub(channel), {"trace_level": ["TIMESTAMPS"]}, "vit")
        assert code == invalid and "start the server with --trace-file" in details


def test_bad_trace_flags_are_refused_at_start(tiny_repository: Path) -> None:
    with pytest.raises(ValueError, match="--trace-file"):
        ServerThread(tiny_repository, metrics_port=-1, trace_level="TIMESTAMPS")


def test_tritonclient_reads_and_changes_trace_settings(
    server: ServerThread, trace_file: Path
) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON)
    client = grpcclient.InferenceServerClient(url=server.address)
    path = trace_file
    try:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        settings = client.get_trace_settings(as_json=True)["settings"]
        assert settings["trace_level"]["value"] == ["TIMESTAMPS"]
        assert settings["trace_rate"]["value"] == ["1"]
        client.infer("vit", [grpc_input(grpcclient)])
        client.update_trace_settings(settings={"trace_level": ["OFF"]})  # writes what it has
        assert [t["model_name"] for t in traces_in(path)] == ["vit"]
    finally:
        client.close()


def grpc_input(grpcclient: Any) -> Any:
    pixels = grpcclient.InferInput("pixel_values", [1, 3, 32, 32], "FP32")
    pixels.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    return pixels


def test_two_frontends_share_one_setting(tiny_repository: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    with two_frontends(tiny_repository, "--trace-file", str(path)) as (_, stubs):
        assert trace_setting(stubs[0], trace_level=["TIMESTAMPS"], trace_rate=["1"])
        for stub in stubs:  # every frontend has it once the call returned
            assert trace_setting(stub)["trace_level"] == ["TIMESTAMPS"]
            for _ in range(3):
                stub.ModelInfer(kserve_vit(), timeout=TIMEOUT)
        code, _ = refused(stubs[1], {"trace_rate": ["0"]})
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert all(trace_setting(stub)["trace_rate"] == ["1"] for stub in stubs)
    files = sorted(tmp_path.glob("trace.json*"))
    assert files and {f.name for f in files} <= {"trace.json.frontend0", "trace.json.frontend1"}
    traces = traces_in(*files)
    assert len(traces) == 18
    for trace in traces:  # the classification ran in the engine process: its times came back
        stamps = trace["stamps"]
        assert sorted(stamps, key=stamps.get) == ORDER, trace


def test_the_trace_commands(
    server: ServerThread, stub: Stub, trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def trace(*args: str) -> int:
        return attnserve_cli.main(["trace", *args, "--server", server.address])

    assert trace() == 0
    shown = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert shown == {
        "log_frequency": "0",
        "trace_count": "-1",
        "trace_file": str(trace_file),
        "trace_level": "OFF",
        "trace_rate": "1000",
    }
    assert trace("trace_level=TIMESTAMPS", "trace_rate=1", "--model", "vit", "--json") == 0
    vit = json.loads(capsys.readouterr().out)
    assert (vit["trace_level"], vit["trace_rate"]) == ("TIMESTAMPS", "1")
    assert trace("trace_rate") == 2 and "is not NAME=VALUE" in capsys.readouterr().err
    assert trace("trace_rate=0") == 2 and "trace_rate must be >= 1" in capsys.readouterr().err
    for _ in range(5):
        stub.ModelInfer(kserve_vit(), timeout=TIMEOUT)
    assert trace("trace_level=", "--model", "vit") == 0  # back to the server's: written
    capsys.readouterr()

    assert attnserve_cli.main(["trace-summary", str(trace_file), "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["model"], row["version"], row["traces"], row["partial"]) == ("vit", 1, 5, 0)
    assert row["request_ms"] >= row["queue_ms"] + row["compute_ms"] > 0
    assert row["overhead_ms"] >= 0 and row["request_p99_ms"] >= row["request_p50_ms"]
    assert attnserve_cli.main(["trace-summary", str(trace_file)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["model", "version", "traces", "partial"]
    assert table[1].split()[:4] == ["vit", "1", "5", "0"]
    not_traces = trace_file.parent / "other.json"
    not_traces.write_text('{"a": 1}')
    assert attnserve_cli.main(["trace-summary", str(not_traces)]) == 2
    assert "not a trace file" in capsys.readouterr().err
