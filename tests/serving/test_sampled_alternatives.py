"""Sampled alternatives (``num_alternatives`` with ``temperature`` > 0): further samples of each
text, served for real over the attnserve API (the CI's tiny random translator, whose samples
differ). With a seed s the output is the one without alternatives and the i-th alternative is
what a request with seed s + i gets (tokens, text, finish reason, score); they decode side by
side; a cancelled call frees every sample's rows; greedy decoding and streams refuse them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from serving.client import AttnServeClient, ClientError
from serving.generation.options import MAX_SAMPLES
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.serving.server_thread import ServerThread

TEXTS = ["one two three", "four hundred and nine", "seventy"]
SAMPLING = {"temperature": 1.5, "top_k": 40, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def tiny(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, metrics_port=-1) as server:
        yield server


def _stub(server: ServerThread) -> pb_grpc.AttnServeStub:
    return pb_grpc.AttnServeStub(grpc.insecure_channel(server.address))


def test_each_alternative_is_the_sample_of_its_seed(tiny: ServerThread) -> None:
    stub = _stub(tiny)
    options = pb.DecodingOptions(seed=2**64 - 2, num_alternatives=3, return_log_probs=True)
    options.MergeFrom(pb.DecodingOptions(**SAMPLING))
    request = pb.TranslateRequest(texts=TEXTS, target_language="de", options=options)
    response = stub.Translate(request, timeout=60)
    again = stub.Translate(request, timeout=60)  # seeded: the same outputs again
    assert list(again.translations) == list(response.translations)
    distinct = 0
    for text, translation in zip(TEXTS, response.translations, strict=True):
        outputs = [translation, *translation.alternatives]
        assert len(outputs) == 4
        for i, output in enumerate(outputs):
            alone = pb.DecodingOptions(seed=(2**64 - 2 + i) % 2**64, return_log_probs=True)
            alone.MergeFrom(pb.DecodingOptions(**SAMPLING))
            (expected,) = stub.Translate(
                pb.TranslateRequest(texts=[text], target_language="de", options=alone),
                timeout=60,
            ).translations
            assert list(output.token_ids) == list(expected.token_ids)
            assert output.text == expected.text
            assert output.finish_reason == expected.finish_reason
            assert output.score == pytest.approx(expected.score, abs=1e-5)
            assert output.score < 0  # return_log_probs scores the alternatives too
        distinct += len({tuple(o.token_ids) for o in outputs})
    assert distinct > len(TEXTS)  # the samples differ
    assert response.usage.output_tokens == sum(len(t.token_ids) for t in response.translations)


def test_the_client_and_an_unseeded_request(tiny: ServerThread) -> None:
    with AttnServeClient(tiny.address) as client:
        (result,) = client.translate(["eight"], to="de", num_alternatives=5, **SAMPLING)
    assert len(result.alternatives) == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_alternatives": 1}, "raise beam_size, sample (temperature > 0)"),
        ({"num_alternatives": MAX_SAMPLES, **SAMPLING}, f"0..{MAX_SAMPLES - 1}"),
        ({"num_alternatives": -1, **SAMPLING}, "num_alternatives -1 is out of range"),
    ],
)
def test_bad_counts_are_invalid_argument(tiny: ServerThread, options: dict, message: str) -> None:
    with AttnServeClient(tiny.address) as client, pytest.raises(ClientError) as caught:
        client.translate(["eight"], to="de", **options)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details


def test_a_stream_refuses_alternatives(tiny: ServerThread) -> None:
    options = pb.DecodingOptions(num_alternatives=2, **SAMPLING)
    request = pb.TranslateStreamRequest(text="eight", target_language="de", options=options)
    with pytest.raises(grpc.RpcError) as caught:
        list(_stub(tiny).TranslateStream(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a stream sends one output" in (caught.value.details() or "")


def test_a_cancelled_call_frees_every_samples_rows(tiny: ServerThread) -> None:
    """A call cancelled while its texts' 16 samples each decode: CANCELLED, and the engine holds
    no row of any of them afterwards (the call is cancelled once more rows than texts run)."""
    options = pb.DecodingOptions(
        num_alternatives=15, temperature=1.0, max_new_tokens=32, min_new_tokens=32
    )
    request = pb.TranslateRequest(texts=TEXTS, target_language="de", options=options)
    engine = tiny.running.repository.get("translator").engine
    stub = _stub(tiny)
    for _ in range(5):  # a fast machine may finish a call before it is seen running
        call = stub.Translate.future(request, timeout=30)
        while not call.done() and engine.active_rows <= len(TEXTS):
            time.sleep(0.0005)
        if call.cancel():
            break
    else:
        pytest.fail("every call finished before its samples were seen decoding")
    with pytest.raises(grpc.FutureCancelledError):
        call.result()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and engine.active_rows:
        time.sleep(0.02)
    assert engine.active_rows == 0 and engine.waiting_rows == 0
