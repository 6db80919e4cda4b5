"""KServe ``num_alternatives``: each element's beam runner-ups or further samples come back in
the outputs ``alternatives`` (BYTES [N, A]) and ``alternative_scores`` (FP32 [N, A]), the same
texts and scores as the attnserve API's ``alternatives`` on the same server; a streamed request
with them gets one final response; a request without them gets neither output."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from serving.kserve.tensors import decode_outputs
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as apb_grpc
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import TIMEOUT, translate
from tests.serving.server_thread import ServerThread

TEXTS = ["three hundred and twelve", "forty-two", "nine", "seventy-seven thousand"]


def _attnserve(server: ServerThread, options: dict[str, Any]) -> list[apb.Translation]:
    with grpc.insecure_channel(server.address) as channel:
        stub = apb_grpc.AttnServeStub(channel)
        request = apb.TranslateRequest(
            texts=TEXTS, target_language="de", options=apb.DecodingOptions(**options)
        )
        return list(stub.Translate(request, timeout=TIMEOUT).translations)


@pytest.mark.parametrize(
    "options",
    [
        {"beam_size": 4, "num_alternatives": 3},
        {"temperature": 0.9, "seed": 5, "num_alternatives": 2, "return_log_probs": True},
    ],
    ids=["beams", "samples"],
)
def test_alternatives_are_the_attnserve_apis(
    server: ServerThread, stub: pb_grpc.GRPCInferenceServiceStub, options: dict[str, Any]
) -> None:
    params = {"target_language": "de", **options}
    outputs = decode_outputs(stub.ModelInfer(translate([t.encode() for t in TEXTS], **params)))
    expected = _attnserve(server, options)
    texts, scores = outputs["alternatives"], outputs["alternative_scores"]
    assert texts.shape == scores.shape == (len(TEXTS), options["num_alternatives"])
    for row, translation in enumerate(expected):
        assert [t.decode() for t in texts[row]] == [a.text for a in translation.alternatives]
        np.testing.assert_allclose(scores[row], [a.score for a in translation.alternatives])
        assert outputs["translation"][row].decode() == translation.text
    assert len({t for row in texts for t in row}) > 1  # they are not all one text


def test_without_alternatives_no_such_outputs(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    outputs = decode_outputs(stub.ModelInfer(translate([b"nine"], target_language="de")))
    assert "alternatives" not in outputs and "alternative_scores" not in outputs


def test_a_streamed_request_with_alternatives_gets_one_final_response(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    params = {"target_language": "de", "beam_size": 3, "num_alternatives": 2}
    request = translate([b"forty-two"], **params)
    (message,) = stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT)
    outputs = decode_outputs(message.infer_response)
    assert outputs["alternatives"].shape == (1, 2)
    assert message.infer_response.parameters["final"].bool_param


def test_greedy_alternatives_say_what_to_change(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as rpc:
        stub.ModelInfer(translate([b"nine"], target_language="de", num_alternatives=2))
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "num_alternatives 2 needs more beams" in (rpc.value.details() or "")
