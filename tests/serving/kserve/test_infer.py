"""KServe v2 ModelInfer on a real server: every task with raw and typed tensors, requested
outputs and classification, bad requests (status and message), draining, request counting,
and an unmodified tritonclient (single and concurrent infers)."""

from __future__ import annotations

import concurrent.futures
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.images import encode_png, pixel_values
from serving.kserve.tensors import decode_outputs
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import (
    LABELS,
    TIMEOUT,
    digit_images,
    infer_request,
    translate,
)
from tests.serving.server_thread import ServerThread


def test_vit_with_fp32_pixels_raw_and_typed(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
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


def test_vit_with_png_bytes_matches_pixels(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
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


def test_vit_with_rgb_bytes_matches_png(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """The declared input: decoded RGB pixels (UINT8 [N,32,32,3]); PNG is lossless, so the
    server's normalisation of the pixels must give the same answer."""
    images = digit_images(3)
    by_rgb = decode_outputs(
        stub.ModelInfer(infer_request("vit", ("image", "UINT8", images)), timeout=TIMEOUT)
    )
    pngs = np.array([[encode_png(image)] for image in images], dtype=object)  # Triton's [N,1]
    by_png = decode_outputs(
        stub.ModelInfer(infer_request("vit", ("image", "BYTES", pngs)), timeout=TIMEOUT)
    )
    np.testing.assert_allclose(by_rgb["probabilities"], by_png["probabilities"], atol=1e-6)
    assert by_rgb["label"].tolist() == by_png["label"].tolist()


def test_one_string_per_item_as_n_by_1(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Texts and languages shaped [N,1], as Triton declares them, equal the [N] form."""
    texts = [b"three hundred and twelve", b"twelve"]
    column = np.array([[t] for t in texts], dtype=object)
    as_column = infer_request(
        "translator",
        ("text", "BYTES", column),
        ("target_language", "BYTES", np.array([[b"de"], [b"de"]], dtype=object)),
        max_new_tokens=5,
    )
    flat = translate(texts, target_language="de", max_new_tokens=5)
    outputs = [decode_outputs(stub.ModelInfer(r, timeout=TIMEOUT)) for r in (as_column, flat)]
    assert outputs[0]["translation"].tolist() == outputs[1]["translation"].tolist()


def test_requested_outputs_and_classification(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = infer_request("vit", ("image", "BYTES", [encode_png(digit_images(1)[0])]))
    request.outputs.add(name="probabilities").parameters["classification"].int64_param = 3
    request.outputs.add(name="label")
    reply = stub.ModelInfer(request, timeout=TIMEOUT)
    assert [o.name for o in reply.outputs] == ["probabilities", "label"]
    top = decode_outputs(reply)["probabilities"]
    assert top.shape == (1, 3)
    score, index, label = top[0, 0].decode().split(":")
    assert 0 < float(score) <= 1 and label == index == decode_outputs(reply)["label"][0].decode()


def test_translation_returns_n_outputs(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
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


def test_captioning(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    image = np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    request = infer_request("captioner", ("image", "BYTES", [encode_png(image)]), max_new_tokens=4)
    out = decode_outputs(stub.ModelInfer(request, timeout=TIMEOUT))
    assert out["caption"].shape == (1,) and out["token_ids"].shape[1] <= 4
    by_rgb = infer_request("captioner", ("image", "UINT8", image[None]), max_new_tokens=4)
    assert decode_outputs(stub.ModelInfer(by_rgb, timeout=TIMEOUT))["caption"] == out["caption"]


# --- errors ---------------------------------------------------------------------------------------
def _raw(
    model: str, name: str, datatype: str, shape: list[int], data: bytes
) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    return pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[data])


def _mixed() -> pb.ModelInferRequest:
    request = infer_request("vit", ("pixel_values", "FP32", np.zeros((1, 3, 32, 32))))
    request.inputs[0].contents.fp32_contents.append(1.0)
    return request


def _unknown_output() -> pb.ModelInferRequest:
    request = translate([b"x"], target_language="de")
    request.outputs.add(name="logits")
    return request


ONE_PIXELS = np.zeros((1, 3, 32, 32), np.float32)
BAD_REQUESTS = {
    "unknown input": (
        infer_request("vit", ("pixels", "FP32", ONE_PIXELS)),
        "INVALID_ARGUMENT",
        "has no input 'pixels'; its inputs are: 'image' (UINT8 [N,32,32,3]), 'image' (BYTES [N,1])",
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
        "input 'text' (BYTES [N,1]) is missing",
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
    "rgb wrong size": (
        infer_request("vit", ("image", "UINT8", np.zeros((1, 32, 32, 4), np.uint8))),
        "INVALID_ARGUMENT",
        "shape [1,32,32,4]; it must be [N,32,32,3]",
    ),
    "image as fp32": (
        infer_request("vit", ("image", "FP32", np.zeros((1, 32, 32, 3)))),
        "INVALID_ARGUMENT",
        "input 'image' must be UINT8 or BYTES, got FP32",
    ),
    "text as n by 2": (
        infer_request("translator", ("text", "BYTES", np.array([[b"a", b"b"]], dtype=object))),
        "INVALID_ARGUMENT",
        "shape [1,2]; it must be [N,1] or [N]",
    ),
    "empty batch": (
        infer_request("vit", ("image", "BYTES", np.empty(0, object))),
        "INVALID_ARGUMENT",
        "is empty (N = 0)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_status_and_message(
    stub: pb_grpc.GRPCInferenceServiceStub, case: str
) -> None:
    request, code, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request, timeout=TIMEOUT)
    assert err.value.code().name == code, err.value.details()
    assert message in err.value.details()


def test_bad_requests_do_not_disturb_good_ones(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    good = infer_request("vit", ("pixel_values", "FP32", pixel_values(digit_images(1))))
    bad = _raw("vit", "pixel_values", "FP32", [1, 3, 32, 32], bytes(12))
    futures = [stub.ModelInfer.future(good if i % 2 else bad, timeout=TIMEOUT) for i in range(16)]
    for i, future in enumerate(futures):
        if i % 2:
            assert decode_outputs(future.result())["probabilities"].shape == (1, 10)
        else:
            assert future.exception().code() == grpc.StatusCode.INVALID_ARGUMENT


def test_draining_turns_ready_false_and_refuses_inference(
    stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread
) -> None:
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


# --- requests counted per model and method --------------------------------------------------------
def test_requests_are_counted_per_model_and_method(
    stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread
) -> None:
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
def test_tritonclient_infer_vit_and_translator(triton: tuple[ModuleType, Any]) -> None:
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
    rgb = grpcclient.InferInput("image", [1, 32, 32, 3], "UINT8")  # the declared input
    rgb.set_data_from_numpy(digit_images(1))
    assert client.infer("vit", [rgb]).as_numpy("label")[0].decode() == label

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


def test_tritonclient_concurrent_infers(triton: tuple[ModuleType, Any]) -> None:
    grpcclient, client = triton

    def classify(i: int) -> str:
        image = grpcclient.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([encode_png(digit_images(8)[i])], dtype=object))
        return client.infer("vit", [image]).as_numpy("label")[0].decode()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(label in LABELS for label in pool.map(classify, range(8)))
