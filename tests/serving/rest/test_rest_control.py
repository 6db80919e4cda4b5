"""The KServe v2 control plane over HTTP/REST on real servers: health, metadata, model
configuration, statistics (and the Prometheus counters), the repository index, trace and log
settings, system shared memory, model control, error statuses, the body limit and the drain.

The unmodified ``tritonclient.http`` client talks to the package's server; every answer is
compared with what ``tritonclient.grpc`` gets from the same server's gRPC port (its JSON holds
64-bit integers as strings and leaves defaults out: ``canonical`` brings both to one form).
Plain HTTP (``request``) sends what tritonclient does not. Servers with other settings (a small
body limit, model control, a slow model to drain) are started only by the tests that need them.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from prometheus_client.parser import text_string_to_metric_families

from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.reliability.harness import copy_repository, says_what_to_fix
from tests.serving.rest.conftest import Answer, request
from tests.serving.server_thread import ServerThread

TIMEOUT = 60
MODELS = ("captioner", "translator", "vit")
HTTP_EXTENSIONS = {"binary_tensor_data", "generate"}
IMAGE = np.random.default_rng(7).integers(0, 255, (1, 32, 32, 3), dtype=np.uint8)
PROBABILITIES_BYTES = 10 * 4  # the ViT's FP32 [1, 10] output
INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
CONFIG = pb.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"].message_type
REGION = pb.SystemSharedMemoryStatusResponse.RegionStatus.DESCRIPTOR
VIT_JSON = {
    "inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 32, 32, 3], "data": [0] * 3072}]
}
MODEL_CONTROL_OFF = "model control is off on this server"
SHUTTING_DOWN = "the server is shutting down"


# --- helpers --------------------------------------------------------------------------------------
def canonical(document: dict[str, Any], descriptor: Descriptor, *, http: bool) -> dict[str, Any]:
    """A message's JSON in one form: 64-bit integers as numbers, defaults left out (a oneof's
    member is kept), every key checked against the proto's field names.

    ``http``: the document is an HTTP answer, whose 64-bit integers must already be numbers
    (Triton's REST endpoints write them so); gRPC's JSON writes them as strings.
    """
    result: dict[str, Any] = {}
    for key, value in document.items():
        field = descriptor.fields_by_name.get(key)
        assert field is not None, f"{descriptor.full_name} has no field {key!r} (answer: {value!r})"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            value = {k: _element(value_field, v, http) for k, v in value.items()}
        elif field.is_repeated:
            value = [_element(field, v, http) for v in value]
        else:
            value = _element(field, value, http)
        if field.containing_oneof is None and _is_default(field, value):
            continue
        result[key] = value
    return result


def _element(field: FieldDescriptor, value: Any, http: bool) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return canonical(value, field.message_type, http=http)
    if field.type in INT64:
        if http:
            assert isinstance(value, int) and not isinstance(value, bool), (
                f"{field.full_name} is a 64-bit integer: the HTTP answer must write it as a JSON "
                f"number, not {value!r}"
            )
            return value
        return int(value)
    return value


def _is_default(field: FieldDescriptor, value: Any) -> bool:
    if field.is_repeated:
        return not value
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return False  # a set message stays, even when all its fields are defaults
    if field.type == FieldDescriptor.TYPE_ENUM:
        return value in (0, field.enum_type.values_by_number[0].name)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value == ""
    return value == field.default_value


def trace_from_grpc(answer: dict[str, Any]) -> dict[str, Any]:
    """gRPC's TraceSetting JSON in Triton's HTTP form: trace_level a list, one value a string."""
    values = {key: setting.get("value", []) for key, setting in answer["settings"].items()}
    return {
        key: value if key == "trace_level" or len(value) != 1 else value[0]
        for key, value in values.items()
    }


def log_from_grpc(answer: dict[str, Any]) -> dict[str, Any]:
    """gRPC's LogSettings JSON in Triton's HTTP form: each setting's value itself."""
    return {key: next(iter(value.values())) for key, value in answer["settings"].items()}


def requests_total(
    server: ServerThread, model: str, code: str, method: str = "ModelInfer"
) -> float:
    """attnserve_requests_total{model, method, code} scraped from the server's /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=TIMEOUT) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "attnserve_requests_total"
        and (sample.labels.get("model"), sample.labels.get("method")) == (model, method)
        and sample.labels.get("code") == code
    )


def vit_input(httpclient: ModuleType, image: np.ndarray = IMAGE) -> Any:
    tensor = httpclient.InferInput("image", list(image.shape), "UINT8")
    tensor.set_data_from_numpy(image, binary_data=True)
    return tensor


def error_of(answer: Answer) -> str:
    """The ``error`` of a JSON error answer (fails unless the body is one)."""
    assert answer.headers.get("content-type", "").startswith("application/json"), answer
    document = answer.json()
    assert isinstance(document, dict) and set(document) == {"error"}, document
    assert isinstance(document["error"], str) and document["error"], document
    return document["error"]


def refused(call: Any, *args: Any, **kwargs: Any) -> Any:
    """The tritonclient InferenceServerException that ``call`` raises."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as err:
        call(*args, **kwargs)
    return err.value


@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The package server's KServe gRPC stub (for requests tritonclient.grpc cannot send)."""
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def grpc_details(call: Any, message: Any) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call(message, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return err.value.details()


# --- health and server metadata -------------------------------------------------------------------
def test_live_and_ready(url: str, triton_http: tuple[ModuleType, Any]) -> None:
    _, client = triton_http
    for route in ("/v2/health/live", "/v2/health/ready"):
        answer = request(url + route)
        assert answer.status == 200, f"GET {route}: {answer}"
    assert client.is_server_live() and client.is_server_ready()


def test_model_ready_for_served_and_unknown_models(
    url: str, triton_http: tuple[ModuleType, Any]
) -> None:
    _, client = triton_http
    for name in MODELS:
        for route in (f"/v2/models/{name}/ready", f"/v2/models/{name}/versions/1/ready"):
            assert request(url + route).status == 200, f"GET {route} of a served model"
        assert client.is_model_ready(name) and client.is_model_ready(name, "1")
    for route in ("/v2/models/nothing/ready", "/v2/models/vit/versions/7/ready"):
        answer = request(url + route)
        assert answer.status == 400, f"GET {route} (no such model / version) must be 400: {answer}"
    assert not client.is_model_ready("nothing")


def test_server_metadata_lists_grpc_extensions_and_http_ones(
    triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    over_http = triton_http[1].get_server_metadata()
    expected = triton_grpc[1].get_server_metadata(as_json=True)
    assert (over_http["name"], over_http["version"]) == (expected["name"], expected["version"])
    extensions = over_http["extensions"]
    assert extensions == sorted({*expected["extensions"], *HTTP_EXTENSIONS})
    assert {"system_shared_memory", "trace", "logging", "statistics"} <= set(extensions)
    assert "model_repository" not in extensions  # model control is off here


# --- metadata, configuration and statistics equal gRPC's ------------------------------------------
@pytest.mark.parametrize("version", ["", "1"], ids=["newest", "version 1"])
@pytest.mark.parametrize("name", MODELS)
def test_metadata_config_and_statistics_equal_grpc(
    name: str,
    version: str,
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
) -> None:
    http, grpc_client = triton_http[1], triton_grpc[1]
    metadata = http.get_model_metadata(name, model_version=version)
    expected = grpc_client.get_model_metadata(name, model_version=version, as_json=True)
    descriptor = pb.ModelMetadataResponse.DESCRIPTOR
    assert canonical(metadata, descriptor, http=True) == canonical(expected, descriptor, http=False)
    assert metadata["name"] == name and metadata["versions"] == ["1"]

    config = http.get_model_config(name, model_version=version)
    expected = grpc_client.get_model_config(name, model_version=version, as_json=True)["config"]
    assert canonical(config, CONFIG, http=True) == canonical(expected, CONFIG, http=False)
    assert config["name"] == name

    stats = http.get_inference_statistics(name, model_version=version)
    expected = grpc_client.get_inference_statistics(name, model_version=version, as_json=True)
    descriptor = pb.ModelStatisticsResponse.DESCRIPTOR
    assert canonical(stats, descriptor, http=True) == canonical(expected, descriptor, http=False)
    assert [(s["name"], s["version"]) for s in stats["model_stats"]] == [(name, "1")]


def test_statistics_of_every_model_equal_grpc(
    url: str, triton_grpc: tuple[ModuleType, Any]
) -> None:
    answer = request(url + "/v2/models/stats")
    assert answer.status == 200, answer
    expected = triton_grpc[1].get_inference_statistics(as_json=True)
    descriptor = pb.ModelStatisticsResponse.DESCRIPTOR
    assert canonical(answer.json(), descriptor, http=True) == canonical(
        expected, descriptor, http=False
    )
    assert sorted(s["name"] for s in answer.json()["model_stats"]) == list(MODELS)


def test_unknown_models_and_versions_are_404_with_grpc_message(
    url: str, triton_grpc: tuple[ModuleType, Any]
) -> None:
    for route in ("", "/config", "/stats"):
        for model, version in (("nothing", ""), ("vit", "7")):
            path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + route
            answer = request(url + path)
            assert answer.status == 404, f"GET {path}: {answer}"
            expected = refused(triton_grpc[1].get_model_metadata, model, model_version=version)
            assert error_of(answer) == expected.message(), path
    answer = request(url + "/v2/models/nothing/trace/setting")
    assert answer.status == 404 and "no model named 'nothing'" in error_of(answer), answer


def test_http_infers_are_counted_in_statistics_and_metrics(
    server: ServerThread,
    url: str,
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
) -> None:
    httpclient, client = triton_http

    def vit_stats() -> dict[str, Any]:
        return client.get_inference_statistics("vit")["model_stats"][0]

    def successes(stats: dict[str, Any]) -> int:
        return stats["inference_stats"]["success"]["count"]

    before, ok, invalid = (
        vit_stats(),
        requests_total(server, "vit", "OK"),
        requests_total(server, "vit", "INVALID_ARGUMENT"),
    )
    count = 3
    for _ in range(count):
        result = client.infer("vit", [vit_input(httpclient)])
        assert result.as_numpy("probabilities").shape == (1, 10)
    bad = request(url + "/v2/models/vit/infer", {"inputs": "none"})  # refused before the RPC
    assert bad.status == 400, bad
    after = vit_stats()
    success = successes(after) - successes(before)
    assert success == count, f"{count} HTTP infers must add {count} successes, not {success}"
    assert after["inference_count"] - before["inference_count"] == count  # one image each
    assert after["execution_count"] > before["execution_count"]
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    assert requests_total(server, "vit", "OK") - ok == count, "HTTP infers missing in /metrics"
    assert requests_total(server, "vit", "INVALID_ARGUMENT") - invalid == 1
    expected = triton_grpc[1].get_inference_statistics("vit", as_json=True)
    descriptor = pb.ModelStatisticsResponse.DESCRIPTOR
    over_http = canonical({"model_stats": [after]}, descriptor, http=True)
    assert over_http == canonical(expected, descriptor, http=False)


# --- the repository index -------------------------------------------------------------------------
def test_repository_index_equals_grpc(
    url: str, triton_http: tuple[ModuleType, Any], stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    descriptor = pb.RepositoryIndexResponse.DESCRIPTOR
    for body, ready in (
        (b"", False),
        ({}, False),
        ({"ready": False}, False),
        ({"ready": True}, True),
    ):
        answer = request(url + "/v2/repository/index", body, method="POST")
        assert answer.status == 200, f"index with body {body!r}: {answer}"
        expected = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready), timeout=TIMEOUT)
        grpc_json = MessageToDict(expected, preserving_proto_field_name=True)
        assert canonical({"models": answer.json()}, descriptor, http=True) == canonical(
            grpc_json, descriptor, http=False
        ), body
        assert [m["name"] for m in answer.json()] == list(MODELS)
        assert all(m["state"] == "READY" for m in answer.json())
    assert (
        triton_http[1].get_model_repository_index()
        == request(url + "/v2/repository/index", b"", method="POST").json()
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[]", '{"ready": true | false}'),
        (b'{"ready": "yes"}', '{"ready": true | false}'),
        (b'{"ready": 1}', '{"ready": true | false}'),
        (b'{"ready": null}', '{"ready": true | false}'),
        (b"ready", "not valid JSON"),
        (b'{"ready": tru', "not valid JSON"),
    ],
)
def test_bad_index_bodies_are_400(url: str, body: bytes, words: str) -> None:
    answer = request(url + "/v2/repository/index", body)
    assert answer.status == 400, f"index body {body!r}: {answer}"
    message = error_of(answer)
    assert words in message, message


# --- trace settings -------------------------------------------------------------------------------
def test_trace_settings_changed_over_http_are_what_grpc_reads(
    triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    client, grpc_client = triton_http[1], triton_grpc[1]
    before = client.get_trace_settings()
    assert before == trace_from_grpc(grpc_client.get_trace_settings(as_json=True))
    assert before["trace_level"] == ["OFF"]  # no --trace-file: nothing else is possible
    try:
        changed = client.update_trace_settings(settings={"trace_rate": "7", "log_frequency": ["3"]})
        assert changed == {**before, "trace_rate": "7", "log_frequency": "3"}
        assert trace_from_grpc(grpc_client.get_trace_settings(as_json=True)) == changed
        assert client.get_trace_settings() == changed

        vit = client.update_trace_settings(model_name="vit", settings={"trace_count": "5"})
        assert vit == {**changed, "trace_count": "5"}
        assert trace_from_grpc(grpc_client.get_trace_settings("vit", as_json=True)) == vit
        assert client.get_trace_settings("vit") == vit
        assert client.get_trace_settings() == changed  # the server's are not the model's
        assert client.get_trace_settings("translator") == changed  # no own: the server's

        cleared = client.update_trace_settings(model_name="vit", settings={"trace_count": None})
        assert cleared == changed, "a null setting must fall back to the server's"
    finally:
        client.update_trace_settings(model_name="vit", settings={"trace_count": None})
        client.update_trace_settings(settings={"trace_rate": None, "log_frequency": None})
    assert client.get_trace_settings() == before, "a null setting must restore the start-up value"
    assert trace_from_grpc(grpc_client.get_trace_settings(as_json=True)) == before


@pytest.mark.parametrize(
    ("model", "settings"),
    [
        ("", {"trace_rate": "0"}),
        ("", {"trace_count": "many"}),
        ("", {"trace_rate": ["1", "2"]}),
        ("", {"trace_level": ["TENSORS"]}),
        ("", {"trace_level": ["TIMESTAMPS"]}),  # this server has no --trace-file
        ("", {"trace_mode": "triton"}),
        ("", {"trace_file": "/tmp/elsewhere.json"}),
        ("vit", {"trace_level": ["TIMESTAMPS"]}),
        ("vit", {"log_frequency": "-1"}),
    ],
)
def test_bad_trace_settings_are_400_with_grpc_message(
    model: str,
    settings: dict[str, Any],
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
) -> None:
    client, grpc_client = triton_http[1], triton_grpc[1]
    before = client.get_trace_settings(model)
    over_http = refused(client.update_trace_settings, model_name=model, settings=settings)
    expected = refused(grpc_client.update_trace_settings, model_name=model, settings=settings)
    assert "INVALID_ARGUMENT" in str(expected.status()), expected
    assert over_http.status() == "400", f"{settings}: {over_http}"
    assert over_http.message() == expected.message()
    assert says_what_to_fix(over_http.message()), over_http.message()
    assert client.get_trace_settings(model) == before, "a refused change must change nothing"


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/trace/setting", {"trace_rate": 5}, 400, "must be a string, an array of strings"),
        ("/v2/trace/setting", {"trace_rate": [1]}, 400, "must be a string, an array of strings"),
        ("/v2/trace/setting", [], 400, "trace settings must be a JSON object"),
        ("/v2/trace/setting", b"{", 400, "not valid JSON"),
        ("/v2/models/nothing/trace/setting", {"trace_rate": "2"}, 404, "no model named"),
    ],
)
def test_trace_bodies_tritonclient_cannot_send(
    url: str, path: str, body: Any, status: int, words: str
) -> None:
    answer = request(url + path, body)
    assert answer.status == status, f"POST {path} {body!r}: {answer}"
    assert words in error_of(answer)


# --- log settings ---------------------------------------------------------------------------------
def test_log_settings_changed_over_http_are_what_grpc_reads(
    triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    client, grpc_client = triton_http[1], triton_grpc[1]
    before = client.get_log_settings()
    assert before == log_from_grpc(grpc_client.get_log_settings(as_json=True))
    assert isinstance(before["log_verbose_level"], int) and isinstance(before["log_info"], bool)
    change = {"log_verbose_level": 2, "log_format": "ISO8601", "log_warning": False}
    try:
        changed = client.update_log_settings(settings=change)
        assert changed == {**before, **change}
        assert log_from_grpc(grpc_client.get_log_settings(as_json=True)) == changed
        assert client.get_log_settings() == changed
    finally:
        client.update_log_settings(settings={key: before[key] for key in change})
    assert client.get_log_settings() == before
    assert log_from_grpc(grpc_client.get_log_settings(as_json=True)) == before


@pytest.mark.parametrize(
    "settings",
    [{"log_format": "plain"}, {"log_file": "/tmp/elsewhere.log"}],
    ids=["log_format", "log_file"],
)
def test_bad_log_settings_are_400_with_grpc_message(
    settings: dict[str, Any],
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
) -> None:
    client = triton_http[1]
    before = client.get_log_settings()
    over_http = refused(client.update_log_settings, settings=settings)
    expected = refused(triton_grpc[1].update_log_settings, settings=settings)
    assert "INVALID_ARGUMENT" in str(expected.status()), expected
    assert (over_http.status(), over_http.message()) == ("400", expected.message())
    assert says_what_to_fix(over_http.message()), over_http.message()
    assert client.get_log_settings() == before


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"log_info": 1}, "log_info takes a bool_param, got 1"),  # a uint32_param over gRPC
        ({"log_verbose_level": True}, "log_verbose_level takes a uint32_param"),
        ({"log_level": "INFO"}, "unknown log setting 'log_level'"),
        ({"log_verbose_level": -1}, "must be a boolean, an integer 0..2**32-1 or a string"),
        ({"log_verbose_level": 2**32}, "must be a boolean, an integer 0..2**32-1 or a string"),
        ({"log_info": None}, "must be a boolean, an integer 0..2**32-1 or a string"),
        ([], "log settings must be a JSON object"),
    ],
)
def test_log_bodies_tritonclient_cannot_send(
    url: str, body: Any, words: str, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    before = request(url + "/v2/logging").json()
    answer = request(url + "/v2/logging", body)
    assert answer.status == 400, f"POST /v2/logging {body!r}: {answer}"
    message = error_of(answer)
    assert words in message, message
    if isinstance(body, dict) and all(isinstance(v, bool | int | str) for v in body.values()):
        grpc_request = pb.LogSettingsRequest()  # the same values as gRPC parameters
        for key, value in body.items():
            kind = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
            if kind == "uint32_param" and not 0 <= value < 2**32:
                continue
            setattr(grpc_request.settings[key], kind, value)
            assert message == grpc_details(stub.LogSettings, grpc_request)
    assert request(url + "/v2/logging").json() == before


# --- system shared memory -------------------------------------------------------------------------
@pytest.fixture
def regions() -> Iterator[dict[str, Any]]:
    """Two fresh shared memory objects, the ViT's input (IMAGE written in) and output; the
    regions registered under these names are unregistered and the objects destroyed after."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    made = {
        "input": (f"rest_in_{tag}", f"/attnserve_rest_in_{tag}", IMAGE.nbytes),
        "output": (f"rest_out_{tag}", f"/attnserve_rest_out_{tag}", PROBABILITIES_BYTES),
    }
    handles = {role: shm.create_shared_memory_region(*made[role]) for role in made}
    shm.set_shared_memory_region(handles["input"], [IMAGE])
    try:
        yield {"shm": shm, "handles": handles, **made}
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def _register(client: Any, regions: dict[str, Any], *roles: str) -> None:
    for role in roles:
        name, key, size = regions[role]
        client.register_system_shared_memory(name, key, size)


def _unregister(client: Any, regions: dict[str, Any]) -> None:
    for role in ("input", "output"):
        client.unregister_system_shared_memory(regions[role][0])


def test_shared_memory_output_equals_a_plain_infer(
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
    regions: dict[str, Any],
) -> None:
    httpclient, client = triton_http
    shm = regions["shm"]
    out_name, out_key, out_size = regions["output"]
    try:
        _register(client, regions, "input", "output")
        status = client.get_system_shared_memory_status()
        mine = [r for r in status if r["name"] in (regions["input"][0], out_name)]
        assert sorted((r["name"], r["key"], r["offset"], r["byte_size"]) for r in mine) == sorted(
            (name, key, 0, size) for name, key, size in (regions["input"], regions["output"])
        )
        expected = triton_grpc[1].get_system_shared_memory_status(as_json=True)["regions"]
        assert sorted((canonical(r, REGION, http=True) for r in status), key=str) == sorted(
            (canonical(r, REGION, http=False) for r in expected.values()), key=str
        )
        assert client.get_system_shared_memory_status(out_name) == [
            {"name": out_name, "key": out_key, "offset": 0, "byte_size": out_size}
        ]

        output = httpclient.InferRequestedOutput("probabilities", binary_data=True)
        output.set_shared_memory(out_name, out_size)
        result = client.infer("vit", [vit_input(httpclient)], outputs=[output])
        described = result.get_output("probabilities")
        assert described["shape"] == [1, 10] and "data" not in described, described
        assert "binary_data_size" not in described.get("parameters", {}), "nothing after the JSON"
        written = shm.get_contents_as_numpy(regions["handles"]["output"], np.float32, [1, 10])
        plain = client.infer("vit", [vit_input(httpclient)]).as_numpy("probabilities")
        np.testing.assert_allclose(written, plain, rtol=1e-6, atol=1e-7)
        assert written.sum() == pytest.approx(1.0, abs=1e-4)  # probabilities, really written
    finally:
        _unregister(client, regions)
    names = {r["name"] for r in client.get_system_shared_memory_status()}
    assert not names & {regions["input"][0], out_name}, "unregistered regions still listed"
    gone = refused(client.get_system_shared_memory_status, out_name)
    assert gone.status() == "404" and "register it first" in gone.message()


def test_shared_memory_input_equals_a_plain_infer(
    triton_http: tuple[ModuleType, Any], regions: dict[str, Any]
) -> None:
    httpclient, client = triton_http
    in_name, _, in_size = regions["input"]
    out_name, _, out_size = regions["output"]
    try:
        _register(client, regions, "input", "output")
        tensor = httpclient.InferInput("image", list(IMAGE.shape), "UINT8")
        tensor.set_shared_memory(in_name, in_size)
        output = httpclient.InferRequestedOutput("probabilities", binary_data=True)
        output.set_shared_memory(out_name, out_size)
        client.infer("vit", [tensor], outputs=[output])
        written = regions["shm"].get_contents_as_numpy(
            regions["handles"]["output"], np.float32, [1, 10]
        )
        plain = client.infer("vit", [vit_input(httpclient)]).as_numpy("probabilities")
        np.testing.assert_allclose(written, plain, rtol=1e-6, atol=1e-7)
    finally:
        _unregister(client, regions)


def test_registering_a_name_twice_is_409(
    triton_http: tuple[ModuleType, Any], regions: dict[str, Any]
) -> None:
    client = triton_http[1]
    name, key, size = regions["input"]
    try:
        client.register_system_shared_memory(name, key, size)
        again = refused(client.register_system_shared_memory, name, key, size)
        assert again.status() == "409", f"a second register of {name!r} must be 409: {again}"
        assert "unregister it first or pick another name" in again.message()
        assert client.get_system_shared_memory_status(name)[0]["byte_size"] == size  # kept
    finally:
        client.unregister_system_shared_memory(name)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({}, 400, '{"key": "/name", "offset": bytes, "byte_size": bytes}'),
        ({"key": 5, "byte_size": 8}, 400, '{"key": "/name"'),
        ({"key": "/x", "byte_size": -1}, 400, "integers >= 0"),
        ({"key": "/x", "byte_size": True}, 400, "integers >= 0"),
        ({"key": "/x", "byte_size": 8, "offset": 1.5}, 400, "integers >= 0"),
        ({"key": "/x", "byte_size": "8"}, 400, "integers >= 0"),
        ([], 400, "must be a JSON object"),
        (b"key=/x", 400, "not valid JSON"),
        ({"key": "/a/b", "byte_size": 8}, 400, "is not an shm_open name"),
        ({"key": "/x", "byte_size": 0}, 400, "byte_size must be > 0"),
        ({"key": f"/attnserve_absent_{uuid.uuid4().hex}", "byte_size": 8}, 404, "create it"),
    ],
)
def test_bad_register_bodies(
    url: str, triton_http: tuple[ModuleType, Any], body: Any, status: int, words: str
) -> None:
    name = f"bad_{uuid.uuid4().hex[:8]}"
    answer = request(url + f"/v2/systemsharedmemory/region/{name}/register", body)
    assert answer.status == status, f"register body {body!r}: {answer}"
    assert words in error_of(answer)
    assert all(r["name"] != name for r in triton_http[1].get_system_shared_memory_status())


# --- errors ---------------------------------------------------------------------------------------
def test_unknown_route_is_404_json(url: str) -> None:
    for method, path in (("GET", "/v2/nothing"), ("POST", "/v3/models/vit/infer"), ("GET", "/")):
        answer = request(url + path, b"{}" if method == "POST" else None, method=method)
        assert answer.status == 404, f"{method} {path}: {answer}"
        message = error_of(answer)
        assert f"no route {method} {path}" in message and "/v2/models/NAME" in message


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v2/models/vit/infer", "POST"),
        ("PUT", "/v2/models/vit/generate", "POST"),
        ("POST", "/v2/health/ready", "GET"),
        ("DELETE", "/v2/models/vit", "GET"),
        ("GET", "/v2/repository/index", "POST"),
    ],
)
def test_wrong_method_is_405_naming_the_allowed_one(
    url: str, method: str, path: str, allowed: str
) -> None:
    answer = request(url + path, b"{}" if method in ("POST", "PUT") else None, method=method)
    assert answer.status == 405, f"{method} {path}: {answer}"
    message = error_of(answer)
    assert f"{method} is not served on {path}" in message and message.endswith(f"use {allowed}")


def test_wrong_method_answer_has_an_allow_header(url: str) -> None:
    answer = request(url + "/v2/models/vit/infer")
    assert answer.status == 405 and answer.headers.get("allow") == "POST", answer.headers


def test_unknown_model_infer_is_404(url: str, triton_http: tuple[ModuleType, Any]) -> None:
    answer = request(url + "/v2/models/nothing/infer", VIT_JSON)
    assert answer.status == 404, answer
    assert "no model named 'nothing'" in error_of(answer) and "vit" in error_of(answer)
    httpclient, client = triton_http
    assert refused(client.infer, "nothing", [vit_input(httpclient)]).status() == "404"


def test_model_control_off_is_400_with_grpc_message(
    url: str, triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    client, grpc_client = triton_http[1], triton_grpc[1]
    for call, grpc_call in (
        (client.load_model, grpc_client.load_model),
        (client.unload_model, grpc_client.unload_model),
    ):
        over_http = refused(call, "vit")
        expected = refused(grpc_call, "vit")
        assert "FAILED_PRECONDITION" in str(expected.status()), expected
        assert (over_http.status(), over_http.message()) == ("400", expected.message())
        assert MODEL_CONTROL_OFF in over_http.message() and "--model-control-mode explicit" in (
            over_http.message()
        )
    for action in ("load", "unload"):
        answer = request(url + f"/v2/repository/models/vit/{action}", b"")
        assert answer.status == 400 and MODEL_CONTROL_OFF in error_of(answer), answer
    assert client.is_model_ready("vit")


def test_a_body_over_the_limit_is_413(
    tiny_repository: Path, triton_http: tuple[ModuleType, Any]
) -> None:
    httpclient = triton_http[0]
    with ServerThread(
        tiny_repository, http_port=0, max_message_bytes=4096, metrics_port=-1, models=("vit",)
    ) as small:
        for path, body in (
            ("/v2/models/vit/infer", VIT_JSON),  # about 6 KB of JSON
            ("/v2/models/vit/generate", b" " * 5000),
            ("/v2/repository/index", b" " * 5000),
        ):
            answer = request(small.http_url + path, body)
            assert answer.status == 413, f"a {path} body past 4096 bytes: {answer}"
            message = error_of(answer)
            assert "4096 bytes" in message and "--max-message-bytes" in message, message
        client = httpclient.InferenceServerClient(small.http_url.removeprefix("http://"))
        try:
            small_image = vit_input(httpclient)  # 3072 bytes of binary data: under the limit
            assert client.infer("vit", [small_image]).as_numpy("probabilities").shape == (1, 10)
            big = httpclient.InferInput("pixel_values", [1, 3, 32, 32], "FP32")  # 12 KB
            big.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32), binary_data=True)
            err = refused(client.infer, "vit", [big])
            assert err.status() == "413" and "4096 bytes" in err.message()
        finally:
            client.close()


# --- model control --------------------------------------------------------------------------------
def test_explicit_model_control_over_http(
    tiny_repository: Path, tmp_path: Path, triton_http: tuple[ModuleType, Any]
) -> None:
    httpclient = triton_http[0]
    repository = copy_repository(tiny_repository, tmp_path / "repository")
    with ServerThread(
        repository, http_port=0, metrics_port=-1, models=("vit",), model_control_mode="explicit"
    ) as running:
        url = running.http_url
        client = httpclient.InferenceServerClient(url.removeprefix("http://"))
        try:
            extensions = client.get_server_metadata()["extensions"]
            assert {"model_repository", "model_repository(unload_dependents)"} <= set(extensions)
            assert client.is_model_ready("vit") and not client.is_model_ready("translator")
            ready = request(url + "/v2/repository/index", {"ready": True}).json()
            assert [(m["name"], m["state"]) for m in ready] == [("vit", "READY")]

            client.unload_model("vit")
            assert not client.is_model_ready("vit")
            assert request(url + "/v2/models/vit/ready").status == 400
            index = {m["name"]: m for m in client.get_model_repository_index()}
            assert index["vit"]["state"] == "UNAVAILABLE" and "unloaded" in index["vit"]["reason"]
            assert request(url + "/v2/repository/index", {"ready": True}).json() == []
            answer = request(url + "/v2/models/vit/infer", VIT_JSON)
            assert answer.status == 404 and "RepositoryModelLoad loads it" in error_of(answer)

            client.load_model("vit")
            assert client.is_model_ready("vit")
            assert client.get_model_repository_index()[-1]["state"] == "READY"
            assert client.infer("vit", [vit_input(httpclient)]).as_numpy("probabilities").shape == (
                1,
                10,
            )

            missing = refused(client.load_model, "nothing")
            assert missing.status() == "404" and "has no entry 'nothing'" in missing.message()
            override = refused(client.load_model, "vit", config="{}")
            assert override.status() == "400" and "is not supported" in override.message()
            answer = request(
                url + "/v2/repository/models/vit/unload", {"parameters": {"unload_dependents": 1}}
            )
            assert answer.status == 400 and "must be a bool" in error_of(answer)
            assert client.is_model_ready("vit"), "a refused unload must leave the model served"
        finally:
            client.close()


# --- drain ----------------------------------------------------------------------------------------
def slow_vit(tiny_repository: Path, target: Path, delay_s: float) -> Path:
    """A copy of the repository whose ViT holds a lone request ``delay_s`` in its queue (Triton's
    max_queue_delay): a request that stays in flight while a test drains the server."""
    delay_us = int(delay_s * 1e6)
    return copy_repository(
        tiny_repository, target, vit={"batching": {"max_queue_delay_us": delay_us}}
    )


def wait_for_call(running: ServerThread) -> None:
    """Wait until a request reached the servicer (and waits in the ViT's queue)."""
    assert running.running is not None
    deadline = time.monotonic() + 10
    while running.running.state.active == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.running.state.active == 1, "the in-flight request never reached the server"


def test_drain_refuses_new_requests_and_finishes_in_flight_ones(
    tiny_repository: Path, tmp_path: Path
) -> None:
    repository = slow_vit(tiny_repository, tmp_path / "slow", 1.5)
    with (
        ServerThread(repository, http_port=0, metrics_port=-1, models=("vit",)) as running,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        assert running.running is not None
        url = running.http_url
        assert request(url + "/v2/health/ready").status == 200
        in_flight = pool.submit(request, url + "/v2/models/vit/infer", VIT_JSON)
        wait_for_call(running)
        drain = pool.submit(running.call, running.running.stop(10.0))
        deadline = time.monotonic() + 5
        while not running.running.state.draining and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not in_flight.done(), "the request must still be in flight (1.5 s queue delay)"

        assert request(url + "/v2/health/ready").status == 400, "ready while draining"
        assert request(url + "/v2/models/vit/ready").status == 400
        assert request(url + "/v2/health/live").status == 200, "live must stay true in a drain"
        for path, body in (
            ("/v2/models/vit/infer", VIT_JSON),
            ("/v2/models/vit/generate", {"image": IMAGE[0].tolist()}),
        ):
            answer = request(url + path, body)
            assert answer.status == 503, f"a new {path} while draining: {answer}"
            assert SHUTTING_DOWN in error_of(answer) and "retry" in error_of(answer)

        finished = in_flight.result(30)
        assert finished.status == 200, f"the in-flight request must complete: {finished}"
        assert finished.json()["outputs"][0]["shape"] == [1, 10]
        drain.result(30)
        with pytest.raises(urllib.error.URLError):  # the port is closed once drained
            urllib.request.urlopen(url + "/v2/health/live", timeout=5)


def test_drain_of_an_http_request_keeps_to_the_grace_period(
    tiny_repository: Path, tmp_path: Path
) -> None:
    repository = slow_vit(tiny_repository, tmp_path / "slower", 6.0)
    with (
        ServerThread(
            repository, http_port=0, metrics_port=-1, models=("vit",), grace_period_s=1.0
        ) as running,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert running.running is not None
        in_flight = pool.submit(request, running.http_url + "/v2/models/vit/infer", VIT_JSON)
        wait_for_call(running)
        started = time.monotonic()
        running.call(running.running.stop(1.0))
        took = time.monotonic() - started
        assert took < 1.6, f"stop(1.0) took {took:.2f} s with an HTTP request in flight"
        with pytest.raises((ConnectionError, HTTPException, urllib.error.URLError)):
            in_flight.result(10)  # cut off at the end of the grace period, as a gRPC call is
