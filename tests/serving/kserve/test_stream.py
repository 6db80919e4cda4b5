"""KServe v2 ModelStreamInfer on a real server: token responses then one final response per
request, errors in error_message without ending the stream, batch and beam requests, cancelled
streams free their sequences, and an unmodified tritonclient's stream."""

from __future__ import annotations

import logging
import queue
import time
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from contract.images import encode_png
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


def _param(response: pb.ModelInferResponse, key: str) -> Any:
    parameter = response.parameters[key]
    return getattr(parameter, parameter.WhichOneof("parameter_choice"))


def test_stream_sends_tokens_then_final_and_survives_errors(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
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


def test_stream_batch_and_beam_requests_get_one_final_response(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = translate([b"three", b"twelve"], target_language="es", max_new_tokens=3)
    (message,) = list(stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT))
    assert not message.error_message and _param(message.infer_response, "final") is True
    assert decode_outputs(message.infer_response)["translation"].shape == (2,)
    beams = translate([b"three"], target_language="es", max_new_tokens=3, beam_size=2)
    (message,) = list(stub.ModelStreamInfer(iter([beams]), timeout=TIMEOUT))
    assert not message.error_message and _param(message.infer_response, "final") is True
    assert list(stub.ModelStreamInfer(iter([]), timeout=TIMEOUT)) == []


def test_cancelled_stream_frees_its_sequences(
    stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread, caplog: pytest.LogCaptureFixture
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


# --- unmodified tritonclient ----------------------------------------------------------------------
def test_tritonclient_stream(triton: tuple[ModuleType, Any]) -> None:
    grpcclient, client = triton
    results: queue.Queue[Any] = queue.Queue()
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
