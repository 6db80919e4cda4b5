"""Scoring over KServe: a generator request with the ``target`` input is scored, not decoded
(ModelInfer, ModelStreamInfer and HTTP/REST), and answers what the attnserve API's Score does."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from serving.kserve.tensors import decode_outputs
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc
from tests.export.hf_fixtures import sample_images
from tests.serving.kserve.infer_requests import infer_request
from tests.serving.server_thread import ServerThread

pytestmark = pytest.mark.usefixtures("offline_hub")

TEXTS = ["eins zwei", "drei", "vier fünf sechs"]
TARGETS = ["eins", "zwei drei", ""]


@pytest.fixture(scope="module")
def server(hf_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(hf_repository, metrics_port=-1, http_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def stubs(server: ServerThread) -> Iterator[tuple[Any, Any]]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.AttnServeStub(channel), kserve_grpc.GRPCInferenceServiceStub(channel)


def scored(stub: Any) -> list[Any]:
    request = pb.ScoreRequest(texts=TEXTS, targets=TARGETS, model="marian")
    return list(stub.Score(request, timeout=30).scores)


def score_request(**params: Any) -> Any:
    return infer_request(
        "marian",
        ("text", "BYTES", [t.encode() for t in TEXTS]),
        ("target", "BYTES", [t.encode() for t in TARGETS]),
        **params,
    )


def assert_as_score(outputs: dict[str, Any], expected: list[Any]) -> None:
    assert [t.decode() for t in outputs["translation"].reshape(-1)] == TARGETS
    ids, values = outputs["token_ids"], outputs["token_log_probs"]
    assert ids.dtype == np.int32 and values.dtype == np.float32 and ids.shape == values.shape
    for row, want in enumerate(expected):
        count = len(want.token_ids)
        assert ids[row, :count].tolist() == list(want.token_ids)
        assert (ids[row, count:] == -1).all() and (values[row, count:] == 0).all()
        np.testing.assert_allclose(values[row, :count], want.token_log_probs, atol=1e-6)
    np.testing.assert_allclose(outputs["eos_log_prob"], [w.eos_log_prob for w in expected])
    np.testing.assert_allclose(outputs["score"], [w.score for w in expected], atol=1e-6)
    assert outputs["score"].shape == (len(TARGETS),)


def test_model_infer_scores_as_the_score_rpc(stubs: tuple[Any, Any]) -> None:
    attnserve, kserve = stubs
    outputs = decode_outputs(kserve.ModelInfer(score_request(), timeout=30))
    assert_as_score(outputs, scored(attnserve))
    assert len(outputs["token_ids"][1]) > 1 and outputs["score"][1] < 0


def test_a_stream_answers_once(stubs: tuple[Any, Any]) -> None:
    attnserve, kserve = stubs
    responses = list(kserve.ModelStreamInfer(iter([score_request()]), timeout=30))
    assert len(responses) == 1 and not responses[0].error_message
    final = responses[0].infer_response
    assert final.parameters["triton_final_response"].bool_param
    assert_as_score(decode_outputs(final), scored(attnserve))


def test_http_rest_scores_too(server: ServerThread, stubs: tuple[Any, Any]) -> None:
    body = {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS},
            {"name": "target", "datatype": "BYTES", "shape": [3], "data": TARGETS},
        ]
    }
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/marian/infer", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        outputs = {o["name"]: o for o in json.load(reply)["outputs"]}
    expected = scored(stubs[0])
    np.testing.assert_allclose(outputs["score"]["data"], [w.score for w in expected], atol=1e-6)
    assert outputs["token_ids"]["shape"] == [3, max(len(w.token_ids) for w in expected)]


@pytest.mark.parametrize(
    ("extra", "params", "message"),
    [
        ((), {"beam_size": 4}, "send no decoding parameters"),
        ((), {"return_log_probs": True}, "send no decoding parameters"),
        ((("target_prefix", "BYTES", [b"a", b"b", b"c"]),), {}, "'target_prefix'"),
        ((("stop", "BYTES", [b"x"]),), {}, "'stop'"),
    ],
)
def test_decoding_inputs_with_a_target_are_refused(
    stubs: tuple[Any, Any], extra: tuple, params: dict[str, Any], message: str
) -> None:
    request = infer_request(
        "marian",
        ("text", "BYTES", [t.encode() for t in TEXTS]),
        ("target", "BYTES", [t.encode() for t in TARGETS]),
        *extra,
        **params,
    )
    with pytest.raises(grpc.RpcError) as caught:
        stubs[1].ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")


def test_a_bad_target_names_its_element(stubs: tuple[Any, Any]) -> None:
    request = infer_request(
        "marian",
        ("text", "BYTES", [b"eins", b"zwei"]),
        ("target", "BYTES", [b"eins", "€€".encode()]),
    )
    with pytest.raises(grpc.RpcError) as caught:
        stubs[1].ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("element 1: the target")


def test_a_captioners_images_are_scored(stubs: tuple[Any, Any]) -> None:
    attnserve, kserve = stubs
    images, captions = sample_images(2, seed=7), ["a", ""]
    expected = attnserve.Score(
        pb.ScoreRequest(images=images, targets=captions, model="hf-captioner"), timeout=30
    ).scores
    request = infer_request(
        "hf-captioner",
        ("image", "BYTES", images),
        ("target", "BYTES", [c.encode() for c in captions]),
    )
    outputs = decode_outputs(kserve.ModelInfer(request, timeout=30))
    np.testing.assert_allclose(outputs["score"], [w.score for w in expected], atol=1e-6)
    assert [t.decode() for t in outputs["caption"].reshape(-1)] == captions


def test_the_generate_extension_scores_a_target(
    server: ServerThread, stubs: tuple[Any, Any]
) -> None:
    body = {"text": TEXTS[1], "target": TARGETS[1]}
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/marian/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.load(reply)
    (expected,) = (
        stubs[0]
        .Score(pb.ScoreRequest(texts=[TEXTS[1]], targets=[TARGETS[1]], model="marian"), timeout=30)
        .scores
    )
    assert answer["translation"] == TARGETS[1]
    assert answer["token_ids"] == list(expected.token_ids)
    assert answer["score"] == pytest.approx(expected.score, abs=1e-6)
    assert answer["token_log_probs"] == pytest.approx(list(expected.token_log_probs), abs=1e-6)
