"""The KServe v2 / Triton protocol on a real server: our stubs and unmodified tritonclient."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models.data import digits
from models.data.images import encode_png, pixel_values
from serving.kserve_tensors import decode_outputs, input_tensor
from serving.model_config import ImageSpec, ModelConfig
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.services.kserve import signature
from tests.serving.server_thread import ServerThread

TIMEOUT = 30
LABELS = [str(i) for i in range(10)]
TRITON = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, metrics_port=-1) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def digit_images(n: int) -> np.ndarray:
    images, _ = digits.load_digits_split("test")
    return images[:n]


def infer_request(model: str, *tensors: tuple[str, str, Any], raw: bool = True, **params: Any):
    """A ModelInferRequest of (name, datatype, values) inputs and plain request parameters."""
    request = pb.ModelInferRequest(model_name=model, id="req-1")
    for name, datatype, values in tensors:
        tensor, data = input_tensor(name, datatype, values, raw=raw)
        request.inputs.append(tensor)
        if data is not None:
            request.raw_input_contents.append(data)
    for key, value in params.items():
        field = {str: "string_param", int: "int64_param", float: "double_param"}[type(value)]
        setattr(request.parameters[key], field, value)
    return request


def translate(texts: list[bytes], **params: Any):
    return infer_request("translator", ("text", "BYTES", texts), **params)


# --- health, metadata, config ---------------------------------------------------------------------
def test_live_ready_and_server_metadata(stub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
    for name, version, ready in [
        ("vit", "", True),
        ("translator", "1", True),
        ("vit", "99", False),
        ("nope", "", False),
    ]:
        reply = stub.ModelReady(pb.ModelReadyRequest(name=name, version=version), timeout=TIMEOUT)
        assert reply.ready is ready, (name, version)
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert meta.name == "attnserve" and meta.version and list(meta.extensions) == []


def _tensors(items) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (t.datatype, list(t.shape)) for t in items}


def test_model_metadata_per_task(stub) -> None:
    vit = stub.ModelMetadata(pb.ModelMetadataRequest(name="vit"), timeout=TIMEOUT)
    assert vit.platform == "onnxruntime_onnx" and list(vit.versions) == ["1"]
    assert _tensors(vit.inputs) == {
        "pixel_values": ("FP32", [-1, 3, 32, 32]),
        "image": ("BYTES", [-1]),
    }
    assert _tensors(vit.outputs) == {"probabilities": ("FP32", [-1, 10]), "label": ("BYTES", [-1])}
    tr = stub.ModelMetadata(pb.ModelMetadataRequest(name="translator"), timeout=TIMEOUT)
    assert _tensors(tr.inputs) == {"text": ("BYTES", [-1]), "target_language": ("BYTES", [-1])}
    assert _tensors(tr.outputs) == {
        "translation": ("BYTES", [-1]),
        "token_ids": ("INT32", [-1, -1]),
    }
    cap = stub.ModelMetadata(pb.ModelMetadataRequest(name="captioner"), timeout=TIMEOUT)
    assert _tensors(cap.inputs) == {"image": ("BYTES", [-1])}
    assert set(_tensors(cap.outputs)) == {"caption", "token_ids"}
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "vit" in err.value.details()


def test_model_config(stub, server: ServerThread) -> None:
    vit_model = server.running.repository.get("vit")
    config = stub.ModelConfig(pb.ModelConfigRequest(name="vit"), timeout=TIMEOUT).config
    assert (config.name, config.platform, config.backend) == (
        "vit",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == vit_model.config.limits.max_batch_size
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = vit_model.config.batching
    assert config.dynamic_batching.max_queue_delay_microseconds == batching.max_queue_delay_us
    assert config.dynamic_batching.default_queue_policy.max_queue_size == batching.max_queue_size
    inputs = {i.name: i for i in config.input}
    assert list(inputs["pixel_values"].dims) == [3, 32, 32] and inputs["pixel_values"].optional
    assert inputs["image"].data_type == pb.TYPE_STRING
    assert not config.model_transaction_policy.decoupled
    translator = stub.ModelConfig(pb.ModelConfigRequest(name="translator"), timeout=TIMEOUT).config
    assert translator.model_transaction_policy.decoupled
    assert translator.parameters["languages"].string_value


# --- ModelInfer -----------------------------------------------------------------------------------
def test_vit_with_fp32_pixels_raw_and_typed(stub) -> None:
    pixels = pixel_values(digit_images(2))
    replies = [
        stub.ModelInfer(
            infer_request("vit", ("pixel_values", "FP32", pixels), raw=raw), timeout=TIMEOUT
        )
        for raw in (True, False)
    ]
    for reply in replies:
        assert reply.model_name == "vit" and reply.model_version == "1" and reply.id == "req-1"
        out = decode_outputs(reply)
        assert out["probabilities"].shape == (2, 10)
        np.testing.assert_allclose(out["probabilities"].sum(1), 1.0, atol=1e-5)
        assert [label.decode() for label in out["label"]] == [
            LABELS[i] for i in out["probabilities"].argmax(1)
        ]
    np.testing.assert_allclose(*(decode_outputs(r)["probabilities"] for r in replies), atol=1e-6)


def test_vit_with_png_bytes_matches_pixels(stub) -> None:
    images = digit_images(3)
    pngs = [encode_png(image) for image in images]
    by_png = decode_outputs(
        stub.ModelInfer(infer_request("vit", ("image", "BYTES", pngs)), timeout=TIMEOUT)
    )
    by_pixels = decode_outputs(
        stub.ModelInfer(
            infer_request("vit", ("pixel_values", "FP32", pixel_values(images))), timeout=TIMEOUT
        )
    )
    assert all(label.decode() in LABELS for label in by_png["label"])
    np.testing.assert_allclose(by_png["probabilities"], by_pixels["probabilities"], atol=1e-5)


def test_requested_outputs_and_classification(stub) -> None:
    request = infer_request("vit", ("image", "BYTES", [encode_png(digit_images(1)[0])]))
    request.outputs.add(name="probabilities").parameters["classification"].int64_param = 3
    request.outputs.add(name="label")
    reply = stub.ModelInfer(request, timeout=TIMEOUT)
    assert [o.name for o in reply.outputs] == ["probabilities", "label"]
    top = decode_outputs(reply)["probabilities"]
    assert top.shape == (1, 3)
    score, index, label = top[0, 0].decode().split(":")
    assert 0 < float(score) <= 1 and label == index == decode_outputs(reply)["label"][0].decode()


def test_translation_returns_n_outputs(stub) -> None:
    texts = [b"three hundred and twelve", b"twelve", b"doce"]
    reply = stub.ModelInfer(
        translate(texts, target_language="de", max_new_tokens=5), timeout=TIMEOUT
    )
    out = decode_outputs(reply)
    assert out["translation"].shape == (3,) and all(
        isinstance(t, bytes) for t in out["translation"]
    )
    assert out["token_ids"].dtype == np.int32 and out["token_ids"].shape[0] == 3
    assert 1 <= out["token_ids"].shape[1] <= 5
    by_input = infer_request(
        "translator",
        ("text", "BYTES", texts),
        ("target_language", "BYTES", [b"de"]),
        max_new_tokens=5,
    )
    assert decode_outputs(stub.ModelInfer(by_input, timeout=TIMEOUT))["translation"].tolist() == (
        out["translation"].tolist()
    )


def test_captioning(stub) -> None:
    image = np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    request = infer_request("captioner", ("image", "BYTES", [encode_png(image)]), max_new_tokens=4)
    out = decode_outputs(stub.ModelInfer(request, timeout=TIMEOUT))
    assert out["caption"].shape == (1,) and out["token_ids"].shape[1] <= 4


# --- errors ---------------------------------------------------------------------------------------
def _raw(model: str, name: str, datatype: str, shape: list[int], data: bytes):
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    return pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[data])


def _mixed():
    request = infer_request("vit", ("pixel_values", "FP32", np.zeros((1, 3, 32, 32))))
    request.inputs[0].contents.fp32_contents.append(1.0)
    return request


def _unknown_output():
    request = translate([b"x"], target_language="de")
    request.outputs.add(name="logits")
    return request


ONE_PIXELS = np.zeros((1, 3, 32, 32), np.float32)
BAD_REQUESTS = {
    "unknown input": (
        infer_request("vit", ("pixels", "FP32", ONE_PIXELS)),
        "INVALID_ARGUMENT",
        "has no input 'pixels'; its inputs are: 'pixel_values' (FP32 [N,3,32,32])",
    ),
    "wrong datatype": (
        infer_request("vit", ("pixel_values", "INT64", np.zeros((1, 3, 32, 32)))),
        "INVALID_ARGUMENT",
        "input 'pixel_values' must be FP32 or FP16, got INT64",
    ),
    "wrong shape": (
        infer_request("vit", ("pixel_values", "FP32", np.zeros((1, 3, 16, 16)))),
        "INVALID_ARGUMENT",
        "shape [1,3,16,16]; it must be [N,3,32,32]",
    ),
    "raw length": (
        _raw("vit", "pixel_values", "FP32", [1, 3, 32, 32], bytes(3072)),
        "INVALID_ARGUMENT",
        "has 3072 bytes of raw data but shape [1,3,32,32] FP32 needs 12288",
    ),
    "broken prefix": (
        _raw("translator", "text", "BYTES", [1], b"\x05\0\0\0ab"),
        "INVALID_ARGUMENT",
        "element 0 declares 5 bytes but only 2 follow",
    ),
    "missing input": (
        infer_request("translator", ("target_language", "BYTES", [b"de"])),
        "INVALID_ARGUMENT",
        "input 'text' (BYTES [N]) is missing",
    ),
    "raw and typed": (_mixed(), "INVALID_ARGUMENT", "one way"),
    "too many": (
        infer_request("vit", ("pixel_values", "FP32", np.zeros((33, 3, 32, 32)))),
        "RESOURCE_EXHAUSTED",
        "holds 33 elements; model 'vit' takes at most 32",
    ),
    "unknown model": (
        infer_request("nope", ("text", "BYTES", [b"x"])),
        "NOT_FOUND",
        "no model named 'nope'; this server has: captioner, translator, vit",
    ),
    "wrong version": (
        pb.ModelInferRequest(model_name="vit", model_version="7"),
        "NOT_FOUND",
        "has no version '7'; it serves version 1",
    ),
    "no language": (translate([b"twelve"]), "INVALID_ARGUMENT", "target_language is missing"),
    "bad language": (
        translate([b"twelve"], target_language="xx"),
        "INVALID_ARGUMENT",
        "target_language 'xx' is not supported",
    ),
    "bad option": (
        translate([b"twelve"], target_language="de", beam_size="many"),
        "INVALID_ARGUMENT",
        "parameter 'beam_size' must be an integer",
    ),
    "option range": (
        translate([b"a", b"b"], target_language="de", temperature=-1.0),
        "INVALID_ARGUMENT",
        "temperature -1.0 is out of range",
    ),
    "bad utf-8": (
        translate([b"ok", b"\xff"], target_language="de"),
        "INVALID_ARGUMENT",
        "input 'text' element 1 is not valid UTF-8",
    ),
    "bad image": (
        infer_request("vit", ("image", "BYTES", [b"png?", b"no"])),
        "INVALID_ARGUMENT",
        "element 0:",
    ),
    "unknown output": (_unknown_output(), "INVALID_ARGUMENT", "no output 'logits'"),
    "nan pixels": (
        infer_request("vit", ("pixel_values", "FP32", np.full((1, 3, 32, 32), np.nan))),
        "INVALID_ARGUMENT",
        "NaN or infinite",
    ),
    "huge pixels": (  # finite, but the model's softmax would overflow to NaN
        infer_request("vit", ("pixel_values", "FP32", np.full((1, 3, 32, 32), 1e38))),
        "INVALID_ARGUMENT",
        "send normalised pixels",
    ),
    "empty batch": (
        infer_request("vit", ("image", "BYTES", np.empty(0, object))),
        "INVALID_ARGUMENT",
        "is empty (N = 0)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_status_and_message(stub, case: str) -> None:
    request, code, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=TIMEOUT)
    assert err.value.code().name == code, err.value.details()
    assert message in err.value.details()


def test_bad_requests_do_not_disturb_good_ones(stub) -> None:
    good = infer_request("vit", ("pixel_values", "FP32", pixel_values(digit_images(1))))
    bad = _raw("vit", "pixel_values", "FP32", [1, 3, 32, 32], bytes(12))
    futures = [stub.ModelInfer.future(good if i % 2 else bad, timeout=TIMEOUT) for i in range(16)]
    for i, future in enumerate(futures):
        if i % 2:
            assert decode_outputs(future.result())["probabilities"].shape == (1, 10)
        else:
            assert future.exception().code() == grpc.StatusCode.INVALID_ARGUMENT


def test_draining_turns_ready_false_and_refuses_inference(stub, server: ServerThread) -> None:
    state = server.running.state
    state.draining = True
    try:
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
        assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
        assert not stub.ModelReady(pb.ModelReadyRequest(name="vit"), timeout=TIMEOUT).ready
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(translate([b"x"], target_language="de"), timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        state.draining = False
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready


# --- ModelStreamInfer -----------------------------------------------------------------------------
def _param(response: pb.ModelInferResponse, key: str) -> Any:
    parameter = response.parameters[key]
    return getattr(parameter, parameter.WhichOneof("parameter_choice"))


def test_stream_sends_tokens_then_final_and_survives_errors(stub) -> None:
    options = {"target_language": "fr", "min_new_tokens": 3, "max_new_tokens": 5}
    streamed = translate([b"three hundred and twelve"], **options)
    streamed.id = "tokens"
    broken = infer_request("nope", ("text", "BYTES", [b"x"]))
    broken.id = "broken"
    digit = infer_request("vit", ("image", "BYTES", [encode_png(digit_images(1)[0])]))
    digit.id = "digit"
    by_id: dict[str, list[pb.ModelStreamInferResponse]] = {}
    for message in stub.ModelStreamInfer(iter([streamed, broken, digit]), timeout=TIMEOUT):
        by_id.setdefault(message.infer_response.id, []).append(message)

    tokens = [m.infer_response for m in by_id["tokens"]]
    assert all(not m.error_message for m in by_id["tokens"])
    # 1..5 token responses (tokens ready together share one), then the final one
    assert 2 <= len(tokens) <= 6
    assert [_param(r, "final") for r in tokens] == [False] * (len(tokens) - 1) + [True]
    assert _param(tokens[-1], "triton_final_response") is True
    per_response = [decode_outputs(r)["token_ids"].reshape(-1).tolist() for r in tokens[:-1]]
    sent_before = [sum(len(ids) for ids in per_response[:i]) for i in range(len(per_response))]
    assert [_param(r, "index") for r in tokens[:-1]] == sent_before
    ids = [int(i) for chunk in per_response for i in chunk]
    assert 3 <= len(ids) <= 5 and _param(tokens[-1], "output_tokens") == len(ids)
    unary = decode_outputs(
        stub.ModelInfer(translate([b"three hundred and twelve"], **options), timeout=TIMEOUT)
    )
    assert ids == [i for i in unary["token_ids"][0].tolist() if i >= 0]

    (error,) = by_id["broken"]
    assert error.error_message.startswith("NOT_FOUND: no model named 'nope'")
    (label,) = by_id["digit"]
    assert decode_outputs(label.infer_response)["label"][0].decode() in LABELS
    assert _param(label.infer_response, "final") is True


def test_stream_batch_and_beam_requests_get_one_final_response(stub) -> None:
    request = translate([b"three", b"twelve"], target_language="es", max_new_tokens=3)
    (message,) = list(stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT))
    assert not message.error_message and _param(message.infer_response, "final") is True
    assert decode_outputs(message.infer_response)["translation"].shape == (2,)
    beams = translate([b"three"], target_language="es", max_new_tokens=3, beam_size=2)
    (message,) = list(stub.ModelStreamInfer(iter([beams]), timeout=TIMEOUT))
    assert not message.error_message and _param(message.infer_response, "final") is True
    assert list(stub.ModelStreamInfer(iter([]), timeout=TIMEOUT)) == []


def test_cancelled_stream_frees_its_sequences(
    stub, server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    model = server.running.repository.get("translator")
    limit = model.config.limits.max_new_tokens
    request = translate(
        [b"three"], target_language="de", min_new_tokens=limit, max_new_tokens=limit
    )
    call = stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT)
    assert not next(call).error_message
    call.cancel()
    deadline = time.monotonic() + 10
    while model.engine.active_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.engine.active_rows == 0
    reply = stub.ModelInfer(
        translate([b"three"], target_language="de", max_new_tokens=2), timeout=TIMEOUT
    )
    assert decode_outputs(reply)["translation"].shape == (1,)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_fp16_classifier_advertises_fp16_pixels() -> None:
    config = ModelConfig(
        name="v16",
        kind="classifier",
        task="classification",
        input="image",
        precision="fp16",
        image=ImageSpec(size=8),
        labels=("a", "b"),
    )
    sig = signature(config)
    pixels = sig.input("pixel_values")
    assert pixels is not None and pixels.datatype == "FP16" and pixels.shape == (-1, 3, 8, 8)
    assert set(pixels.accepts) == {"FP16", "FP32"}
    assert sig.output("probabilities").shape == (-1, 2)


def test_requests_are_counted_per_model_and_method(stub, server: ServerThread) -> None:
    stub.ModelInfer(infer_request("vit", ("pixel_values", "FP32", ONE_PIXELS)), timeout=TIMEOUT)
    list(
        stub.ModelStreamInfer(
            iter([infer_request("vit", ("pixel_values", "FP32", ONE_PIXELS))]), timeout=TIMEOUT
        )
    )
    text = server.running.metrics.render().decode()
    counts = {
        (s.labels["model"], s.labels["method"], s.labels["code"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "attnserve_requests_total"
    }
    assert counts[("vit", "ModelInfer", "OK")] >= 1
    assert counts[("vit", "ModelStreamInfer", "OK")] >= 1


# --- unmodified tritonclient ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def triton(server: ServerThread):
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON)
    client = grpcclient.InferenceServerClient(url=server.address)
    yield grpcclient, client
    client.close()


def test_tritonclient_health_and_metadata(triton) -> None:
    _, client = triton
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("vit") and not client.is_model_ready("nope")
    assert client.get_server_metadata().name == "attnserve"
    meta = client.get_model_metadata("vit", as_json=True)
    assert {i["name"]: i["shape"] for i in meta["inputs"]}["pixel_values"] == [
        "-1",
        "3",
        "32",
        "32",
    ]
    config = client.get_model_config("translator").config
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 32


def test_tritonclient_infer_vit_and_translator(triton) -> None:
    grpcclient, client = triton
    pixels = grpcclient.InferInput("pixel_values", [1, 3, 32, 32], "FP32")
    pixels.set_data_from_numpy(pixel_values(digit_images(1)))
    result = client.infer(
        "vit",
        [pixels],
        outputs=[
            grpcclient.InferRequestedOutput("label"),
            grpcclient.InferRequestedOutput("probabilities", class_count=2),
        ],
    )
    label = result.as_numpy("label")[0].decode()
    top = result.as_numpy("probabilities")
    assert label in LABELS and top.shape == (1, 2) and top[0, 0].decode().endswith(f":{label}")

    text = grpcclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"three", b"twelve"], dtype=object))
    by_param = client.infer(
        "translator", [text], parameters={"target_language": "es", "max_new_tokens": 4}
    )
    assert by_param.as_numpy("translation").shape == (2,)
    language = grpcclient.InferInput("target_language", [1], "BYTES")
    language.set_data_from_numpy(np.array([b"es"], dtype=object))
    by_input = client.infer("translator", [text, language], parameters={"max_new_tokens": 4})
    assert by_input.as_numpy("translation").tolist() == by_param.as_numpy("translation").tolist()

    with pytest.raises(grpcclient.InferenceServerException) as err:
        client.infer("nope", [text])
    assert err.value.status() == "StatusCode.NOT_FOUND"


def test_tritonclient_stream(triton) -> None:
    grpcclient, client = triton
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        text = grpcclient.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"twelve"], dtype=object))
        client.async_stream_infer(
            "translator",
            [text],
            request_id="s1",
            parameters={"target_language": "de", "min_new_tokens": 2, "max_new_tokens": 3},
        )
        deltas, token_ids = [], []
        while True:
            result, error = results.get(timeout=TIMEOUT)
            assert error is None, error
            response = result.get_response()
            assert response.id == "s1"
            deltas.append(result.as_numpy("translation")[0])
            token_ids.extend(result.as_numpy("token_ids").ravel().tolist())
            if response.parameters["triton_final_response"].bool_param:
                break
        # Tokens that are ready together may share a response, text held back at the end comes
        # in one more (no token ids); the last response only ends the stream.
        assert 2 <= len(deltas) <= 5 and deltas[-1] == b""
        assert 2 <= len(token_ids) <= 3
    finally:
        client.stop_stream()


def test_tritonclient_concurrent_infers(triton) -> None:
    grpcclient, client = triton

    def classify(i: int) -> str:
        image = grpcclient.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([encode_png(digit_images(8)[i])], dtype=object))
        return client.infer("vit", [image]).as_numpy("label")[0].decode()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(label in LABELS for label in pool.map(classify, range(8)))
