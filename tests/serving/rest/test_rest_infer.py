"""KServe v2 inference over HTTP/REST on a real server: the unmodified tritonclient.http gets
what tritonclient.grpc gets (JSON and binary tensors, classification, compression, concurrent
calls), plain JSON bodies, the binary tensor data extension's framing, and bad requests answered
with gRPC's message and the HTTP status of gRPC's code."""

from __future__ import annotations

import gzip
import json
import struct
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from contract.images import encode_png
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import digit_images, infer_request
from tests.serving.rest.conftest import request, requests_total
from tests.serving.server_thread import ServerThread

TEXTS = [b"three hundred and twelve", b"doce", b"trois cent douze"]
IMAGE = np.random.default_rng(0).integers(0, 255, (1, 48, 48, 3), dtype=np.uint8)


def _inputs(module: ModuleType, model: str, binary: bool) -> tuple[list[Any], dict[str, Any]]:
    """The inputs and request parameters of one request to ``model`` (``module``: a tritonclient
    flavour; ``binary``: inputs as binary data, where the flavour has the choice)."""

    def tensor(name: str, datatype: str, array: np.ndarray) -> Any:
        made = module.InferInput(name, list(array.shape), datatype)
        if module.__name__.endswith("http"):
            made.set_data_from_numpy(array, binary_data=binary)
        else:
            made.set_data_from_numpy(array)
        return made

    if model == "translator":
        texts = np.array([[t] for t in TEXTS], dtype=object)
        return [tensor("text", "BYTES", texts)], {"target_language": "fr", "max_new_tokens": 6}
    if model == "captioner":
        return [tensor("image", "UINT8", IMAGE)], {"max_new_tokens": 5}
    return [tensor("image", "UINT8", digit_images(4))], {}


def _text(element: bytes | str) -> str:
    return element.decode() if isinstance(element, bytes) else element


OUTPUTS = {
    "translator": ("translation", "token_ids"),
    "captioner": ("caption", "token_ids"),
    "vit": ("probabilities", "label"),
}


@pytest.mark.parametrize("model", sorted(OUTPUTS))
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_gets_what_grpc_gets(
    model: str,
    binary: bool,
    triton_http: tuple[ModuleType, Any],
    triton_grpc: tuple[ModuleType, Any],
) -> None:
    httpclient, http = triton_http
    grpcclient, grpc_client = triton_grpc
    inputs, parameters = _inputs(httpclient, model, binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in OUTPUTS[model]]
    by_http = http.infer(
        model, inputs, outputs=outputs, parameters=parameters or None, request_id="r1"
    )
    grpc_inputs, _ = _inputs(grpcclient, model, binary)
    by_grpc = grpc_client.infer(model, grpc_inputs, parameters=parameters or None)
    response = by_http.get_response()
    assert response["model_name"] == model and response["model_version"] == "1"
    assert response["id"] == "r1"
    for name in OUTPUTS[model]:
        got, want = by_http.as_numpy(name), by_grpc.as_numpy(name)
        assert got.shape == want.shape and got.dtype == want.dtype
        if got.dtype == np.float32:
            np.testing.assert_allclose(got, want, rtol=1e-6)
        elif got.dtype == object:  # tritonclient.http reads JSON strings as str
            assert [_text(e) for e in got.reshape(-1)] == [_text(e) for e in want.reshape(-1)]
        else:
            assert got.tolist() == want.tolist()
    shown = {o["name"]: o for o in response["outputs"]}
    for name in OUTPUTS[model]:  # binary outputs carry their size, JSON ones their data
        assert ("data" in shown[name]) is not binary
        assert ("binary_data_size" in shown[name].get("parameters", {})) is binary


def test_classification_and_compression(
    triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    httpclient, http = triton_http
    grpcclient, grpc_client = triton_grpc
    images = digit_images(3)
    top = [httpclient.InferRequestedOutput("probabilities", class_count=3)]
    answers = []
    for request_algorithm, response_algorithm in (
        (None, None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
    ):
        inputs, _ = _inputs(httpclient, "vit", True)
        answers.append(
            http.infer(
                "vit",
                inputs,
                outputs=top,
                request_compression_algorithm=request_algorithm,
                response_compression_algorithm=response_algorithm,
            ).as_numpy("probabilities")
        )
    grpc_inputs, _ = _inputs(grpcclient, "vit", True)
    want = grpc_client.infer(
        "vit", grpc_inputs, outputs=[grpcclient.InferRequestedOutput("probabilities", 3)]
    ).as_numpy("probabilities")
    assert answers[0].shape == (len(images) + 1, 3)  # _inputs sends 4 digits
    for got in answers:
        assert got.tolist() == want.tolist()


def test_a_compressed_response_is_smaller(url: str) -> None:
    body = {
        "inputs": [
            {"name": "image", "shape": [4, 32, 32, 3], "datatype": "UINT8",
             "data": digit_images(4).tolist()}
        ],
    }  # fmt: skip
    plain = request(f"{url}/v2/models/vit/infer", body)
    packed = request(f"{url}/v2/models/vit/infer", body, {"Accept-Encoding": "gzip"})
    assert plain.status == packed.status == 200
    assert packed.headers.get("content-encoding") == "gzip"
    assert "content-encoding" not in plain.headers
    assert len(packed.body) < len(plain.body)  # urllib leaves the gzip body as it came
    assert json.loads(gzip.decompress(packed.body)) == plain.json()


def test_plain_json_nested_and_flat(url: str, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    images = digit_images(2)
    nested = {"name": "image", "shape": [2, 32, 32, 3], "datatype": "UINT8"}
    flat = dict(nested)
    nested["data"] = images.tolist()
    flat["data"] = images.reshape(-1).tolist()
    answers = [
        request(
            f"{url}/v2/models/vit/versions/1/infer",
            {"id": "x", "inputs": [tensor], "outputs": [{"name": "label"}]},
        )
        for tensor in (nested, flat)
    ]
    assert [a.status for a in answers] == [200, 200]
    documents = [a.json() for a in answers]
    assert documents[0] == documents[1]
    want = stub.ModelInfer(infer_request("vit", ("image", "UINT8", images)), timeout=30)
    labels = [e.decode() for e in _decoded(want)["label"]]
    assert documents[0] == {
        "model_name": "vit",
        "model_version": "1",
        "id": "x",
        "outputs": [{"name": "label", "datatype": "BYTES", "shape": [2], "data": labels}],
    }


def _decoded(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    from serving.kserve.tensors import decode_outputs

    return decode_outputs(response)


def test_binary_framing_by_hand(url: str) -> None:
    """The extension's layout as written by a client that is not tritonclient: the JSON part,
    then each binary input in order; binary outputs follow the response's JSON part."""
    texts = [b"doce", b"three hundred and twelve"]
    raw = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [2, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                },
                {"name": "target_language", "shape": [1], "datatype": "BYTES", "data": ["de"]},
            ],
            "parameters": {"binary_data_output": True, "max_new_tokens": 4},
        }
    ).encode()
    answer = request(
        f"{url}/v2/models/translator/infer",
        header + raw,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status == 200, answer.body
    length = int(answer.headers["inference-header-content-length"])
    document = json.loads(answer.body[:length])
    rest = answer.body[length:]
    sizes = [o["parameters"]["binary_data_size"] for o in document["outputs"]]
    assert [o["name"] for o in document["outputs"]] == ["translation", "token_ids"]
    assert sum(sizes) == len(rest)
    ids = np.frombuffer(rest[sizes[0] :], dtype="<i4").reshape(document["outputs"][1]["shape"])
    assert ids.shape[0] == 2 and (ids[:, 0] >= 0).all()
    as_json = request(
        f"{url}/v2/models/translator/infer",
        {
            "inputs": [
                {"name": "text", "shape": [2], "datatype": "BYTES",
                 "data": [t.decode() for t in texts]},
                {"name": "target_language", "shape": [1], "datatype": "BYTES", "data": ["de"]},
            ],
            "parameters": {"max_new_tokens": 4},
        },
    ).json()  # fmt: skip
    assert as_json["outputs"][1]["data"] == ids.reshape(-1).tolist()


# --- errors: gRPC's message, the HTTP status of gRPC's code -----------------------------------
BAD = {
    "unknown input": [{"name": "txt", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
    "wrong datatype": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}],
    "wrong rank": [{"name": "text", "shape": [1, 1, 1], "datatype": "BYTES", "data": ["a"]}],
    "no inputs": [],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_get_grpc_messages(
    case: str, url: str, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    import grpc

    inputs = BAD[case]
    parameters = {"target_language": "de"}
    answer = request(
        f"{url}/v2/models/translator/infer", {"inputs": inputs, "parameters": parameters}
    )
    message = pb.ModelInferRequest(model_name="translator")
    message.parameters["target_language"].string_param = "de"
    for entry in inputs:
        tensor = message.inputs.add(
            name=entry["name"], datatype=entry["datatype"], shape=entry["shape"]
        )
        if entry["datatype"] == "BYTES":
            tensor.contents.bytes_contents.extend(e.encode() for e in entry["data"])
        else:
            tensor.contents.fp32_contents.extend(entry["data"])
    with pytest.raises(grpc.RpcError) as failed:
        stub.ModelInfer(message, timeout=30)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert answer.status == 400
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json() == {"error": failed.value.details()}


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (b"{", {}, "not valid JSON"),
        (b"[]", {}, "JSON object"),
        (b'{"inputs": {}}', {}, '"inputs"'),
        (b'{"inputs": [{"name": "text", "shape": "1", "datatype": "BYTES"}]}', {}, "shape"),
        (
            b'{"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a"]}]}',
            {},
            "needs 2",
        ),
        (b'{"inputs": []}xx', {"Inference-Header-Content-Length": "99"}, "length of the JSON"),
        (b'{"inputs": []}xx', {"Inference-Header-Content-Length": "14"}, "2 bytes of binary"),
        (
            b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", '
            b'"parameters": {"binary_data_size": 50}}]}',
            {},
            "claims 50 bytes",
        ),
        (b'{"inputs": [], "parameters": {"x": [1]}}', {}, "parameter 'x'"),
        (b'{"inputs": [], "parameters": {"binary_data_output": 1}}', {}, "true or false"),
    ],
    ids=[
        "not json",
        "not an object",
        "inputs not a list",
        "bad shape",
        "count",
        "header too long",
        "bytes left over",
        "binary overrun",
        "list parameter",
        "binary flag",
    ],
)
def test_malformed_bodies(url: str, body: bytes, headers: dict[str, str], words: str) -> None:
    answer = request(f"{url}/v2/models/translator/infer", body, headers)
    assert answer.status == 400, answer.body
    assert words in answer.json()["error"]


def test_failed_parses_are_counted(url: str, server: ServerThread) -> None:
    before = requests_total(server, "vit", "ModelInfer", "INVALID_ARGUMENT")
    assert request(f"{url}/v2/models/vit/infer", b"{").status == 400
    assert requests_total(server, "vit", "ModelInfer", "INVALID_ARGUMENT") == before + 1


def test_unknown_model_and_version(url: str) -> None:
    body = {"inputs": [{"name": "image", "shape": [0, 32, 32, 3], "datatype": "UINT8", "data": []}]}
    nope = request(f"{url}/v2/models/nope/infer", body)
    assert nope.status == 404 and "no model named 'nope'" in nope.json()["error"]
    version = request(f"{url}/v2/models/vit/versions/7/infer", body)
    assert version.status == 404 and "7" in version.json()["error"]


def test_png_bytes_as_binary(
    triton_http: tuple[ModuleType, Any], triton_grpc: tuple[ModuleType, Any]
) -> None:
    """An encoded image is BYTES: binary data carries it (JSON strings cannot)."""
    httpclient, http = triton_http
    grpcclient, grpc_client = triton_grpc
    pngs = np.array([[encode_png(IMAGE[0])]], dtype=object)
    answers = []
    for module, client in ((httpclient, http), (grpcclient, grpc_client)):
        image = module.InferInput("image", [1, 1], "BYTES")
        image.set_data_from_numpy(pngs)
        answers.append(
            client.infer("captioner", [image], parameters={"max_new_tokens": 4}).as_numpy("caption")
        )
    assert answers[0].tolist() == answers[1].tolist()


def test_concurrent_calls(server: ServerThread, triton_http: tuple[ModuleType, Any]) -> None:
    httpclient, client = triton_http

    def tensor(text: bytes) -> Any:
        made = httpclient.InferInput("text", [1, 1], "BYTES")
        made.set_data_from_numpy(np.array([[text]], dtype=object))
        return made

    parameters = {"target_language": "es", "max_new_tokens": 5}
    alone = {
        t: client.infer("translator", [tensor(t)], parameters=parameters).as_numpy("translation")
        for t in TEXTS
    }
    texts = [t for t in TEXTS for _ in range(6)]
    pooled = httpclient.InferenceServerClient(
        url=server.http_url.removeprefix("http://"), concurrency=8
    )
    try:
        pending = [
            pooled.async_infer("translator", [tensor(t)], parameters=parameters) for t in texts
        ]
        together = [p.get_result().as_numpy("translation") for p in pending]
    finally:
        pooled.close()
    assert [a.tolist() for a in together] == [alone[t].tolist() for t in texts]
