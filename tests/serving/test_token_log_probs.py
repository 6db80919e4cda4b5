"""Token log-probabilities (``DecodingOptions.return_log_probs``) checked against transformers.

The tiny random MarianMTModel of ``hf_repository`` served for real: each greedy token's
log-probability is ``generate``'s score for it (``output_scores``; the Marian generation config
renormalises, so those scores are the log-softmax after the token rules and the repetition
controls), the output's score their sum with EOS's; sampled tokens' are the log-softmax before
temperature, a forced EOS's is 0; requests without the option keep the fast path and a score of
0; beam hypotheses carry ``compute_transition_scores``'s values along their beams; streams carry
each message's tokens' values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402

from serving.client import AttnServeClient  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from tests.export.hf_fixtures import MARIAN_MAX_LENGTH, marian_texts  # noqa: E402
from tests.serving.hf_marian import generate_beams, generate_greedy  # noqa: E402
from tests.serving.hf_streams import stream_log_probs  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

TEXTS = 24
TOLERANCE = 2e-4  # ONNX Runtime against PyTorch logits, through a log-softmax


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    directory = hf_sources["marian"]
    return {
        "tokenizer": transformers.AutoTokenizer.from_pretrained(directory),
        "model": transformers.MarianMTModel.from_pretrained(directory).eval(),
        "texts": marian_texts(TEXTS, seed=23),
    }


def generate_scored(marian: dict[str, Any], text: str, **options: Any) -> tuple[list[int], list]:
    """``generate``'s greedy ids of ``text`` (no start token, no EOS) and the score of every
    chosen token, EOS included."""
    tokenizer = marian["tokenizer"]
    out = generate_greedy(marian, text, **options)
    chosen = out.sequences[0, 1:].tolist()
    scores = [float(step[0, token]) for step, token in zip(out.scores, chosen, strict=False)]
    eos = tokenizer.eos_token_id
    ids = chosen[: chosen.index(eos)] if eos in chosen else chosen
    return ids, scores[: len(ids) + (eos in chosen)]


@pytest.mark.parametrize("controls", [{}, {"repetition_penalty": 1.6}], ids=["plain", "penalty"])
def test_greedy_log_probs_are_generates_scores(
    hf_client: AttnServeClient, marian: dict[str, Any], controls: dict[str, Any]
) -> None:
    texts = marian["texts"]
    served = hf_client.translate(texts, to="de", model="marian", return_log_probs=True, **controls)
    ended = 0
    for text, result in zip(texts, served, strict=True):
        ids, scores = generate_scored(marian, text, **controls)
        assert result.token_ids == ids
        assert len(result.token_log_probs) == len(ids)
        np.testing.assert_allclose(result.token_log_probs, scores[: len(ids)], atol=TOLERANCE)
        assert result.score == pytest.approx(sum(scores), abs=TOLERANCE * len(scores))
        assert all(p <= 0 for p in result.token_log_probs)
        ended += len(scores) > len(ids)  # EOS's own log-prob is in the score
    assert ended == len(texts)  # the fixture's forced EOS: every output ends with EOS


def test_without_the_option_nothing_changes(hf_client: AttnServeClient, marian: dict) -> None:
    texts = marian["texts"][:8]
    plain = hf_client.translate(texts, to="de", model="marian")
    scored = hf_client.translate(texts, to="de", model="marian", return_log_probs=True)
    assert [r.token_ids for r in plain] == [r.token_ids for r in scored]
    assert all(r.score == 0 and r.token_log_probs == () for r in plain)


def test_sampled_log_probs_are_before_temperature(
    hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    """A sampled token's log-prob is the model's log-softmax (temperature and top-k do not
    change it): teacher-forcing the sampled ids through PyTorch gives the same values."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    text = marian["texts"][0]
    options = {"temperature": 1.5, "top_k": 20, "seed": 9, "return_log_probs": True}
    (result,) = hf_client.translate([text], to="de", model="marian", **options)
    start = model.config.decoder_start_token_id
    decoder = torch.tensor([[start, *result.token_ids]])
    with torch.no_grad():
        logits = model(**tokenizer([text], return_tensors="pt"), decoder_input_ids=decoder).logits
    logits[0, :, tokenizer.pad_token_id] = -np.inf  # the entry's token rule (Marian's pad)
    log_probs = torch.log_softmax(logits[0], -1)
    expected = [float(log_probs[i, t]) for i, t in enumerate(result.token_ids)]
    np.testing.assert_allclose(result.token_log_probs, expected, atol=TOLERANCE)


def test_a_forced_eos_scores_zero(hf_client: AttnServeClient, marian: dict[str, Any]) -> None:
    """At the last position the model's forced EOS is the only possible token: log-prob 0, so
    an output cut there scores the sum of its tokens alone."""
    longest = max(
        hf_client.translate(marian["texts"], to="de", model="marian", return_log_probs=True),
        key=lambda r: len(r.token_ids),
    )
    assert len(longest.token_ids) == MARIAN_MAX_LENGTH - 2  # forced EOS at the last position
    assert longest.score == pytest.approx(sum(longest.token_log_probs), abs=1e-5)


def test_beam_hypotheses_carry_generates_transition_scores(
    hf_server: ServerThread, marian: dict[str, Any]
) -> None:
    """4 beams, the best and 2 runner-ups: each token's log-probability is what transformers'
    ``compute_transition_scores`` gives along the hypothesis's beams, and the score stays the
    beam score (``sequences_scores``); KServe's output carries the best one's."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    eos = tokenizer.eos_token_id
    options = pb.DecodingOptions(beam_size=4, num_alternatives=2, return_log_probs=True)
    channel = grpc.insecure_channel(hf_server.address)
    for text in marian["texts"][:8]:
        out = generate_beams(marian, text)
        with torch.no_grad():
            steps = model.compute_transition_scores(
                out.sequences, out.scores, out.beam_indices, normalize_logits=False
            )
        request = pb.TranslateRequest(
            texts=[text], target_language="de", model="marian", options=options
        )
        (best,) = pb_grpc.AttnServeStub(channel).Translate(request, timeout=30).translations
        for row, hypothesis in enumerate([best, *best.alternatives]):
            chosen = out.sequences[row, 1:].tolist()
            ids = chosen[: chosen.index(eos)] if eos in chosen else chosen
            assert list(hypothesis.token_ids) == ids
            np.testing.assert_allclose(
                hypothesis.token_log_probs, steps[row, : len(ids)], atol=TOLERANCE
            )
            assert hypothesis.score == pytest.approx(float(out.sequences_scores[row]), abs=1e-4)
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    request = infer_request(
        "marian", ("text", "BYTES", [text.encode()]), beam_size=4, return_log_probs=True
    )
    outputs = decode_outputs(stub.ModelInfer(request, timeout=30))
    kept = outputs["token_ids"][0] != -1
    np.testing.assert_allclose(outputs["token_log_probs"][0][kept], best.token_log_probs)
    channel.close()


@pytest.mark.parametrize("options", [{}, {"temperature": 0.7, "seed": 4}], ids=["greedy", "seed"])
def test_stream_messages_carry_the_log_probs(
    hf_server: ServerThread, hf_client: AttnServeClient, marian: dict, options: dict
) -> None:
    """Each message's token_log_probs are its tokens' (the unary call's values), the last
    message holds the score."""
    for text in marian["texts"][:4]:
        (unary,) = hf_client.translate(
            [text], to="de", model="marian", return_log_probs=True, **options
        )
        ids, log_probs, score = stream_log_probs(hf_server.address, text, **options)
        assert ids == unary.token_ids
        np.testing.assert_allclose(log_probs, unary.token_log_probs, atol=1e-6)
        assert score == pytest.approx(unary.score, abs=1e-5) and score < 0


def test_kserve_returns_the_log_probs_as_an_output(
    hf_server: ServerThread, hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    texts = marian["texts"][:6]
    served = hf_client.translate(texts, to="de", model="marian", return_log_probs=True)
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian", ("text", "BYTES", [t.encode() for t in texts]), return_log_probs=True
        )
        outputs = decode_outputs(stub.ModelInfer(request, timeout=30))
        plain = decode_outputs(
            stub.ModelInfer(
                infer_request("marian", ("text", "BYTES", [t.encode() for t in texts])),
                timeout=30,
            )
        )
        # ModelStreamInfer: the whole output in one final response, as for beam search
        one = infer_request("marian", ("text", "BYTES", [texts[0].encode()]), return_log_probs=True)
        (response,) = list(stub.ModelStreamInfer(iter([one]), timeout=30))
        assert response.infer_response.parameters["final"].bool_param
        stream_outputs = decode_outputs(response.infer_response)
    assert "token_log_probs" not in plain
    streamed = stream_outputs["token_log_probs"][0]
    np.testing.assert_allclose(streamed, served[0].token_log_probs, atol=1e-6)
    values = outputs["token_log_probs"]
    assert values.dtype == np.float32 and values.shape == outputs["token_ids"].shape
    for row, ids, result in zip(values, outputs["token_ids"], served, strict=True):
        assert [t for t in ids.tolist() if t != -1] == result.token_ids
        np.testing.assert_allclose(row[ids != -1], result.token_log_probs, atol=1e-6)
        assert (row[ids == -1] == 0).all()


def test_the_cli_prints_the_score_and_log_probs(
    hf_server: ServerThread,
    hf_client: AttnServeClient,
    marian: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    import attnserve_cli

    text = marian["texts"][1]
    (result,) = hf_client.translate([text], to="de", model="marian", return_log_probs=True)
    args = ["translate", text, "--to", "de", "--model", "marian", "--server", hf_server.address]
    assert attnserve_cli.main([*args, "--log-probs"]) == 0
    printed, values = capsys.readouterr().out.rstrip("\n").split("\n")
    assert printed == result.text
    numbers = [float(v) for v in values.split("\t")]
    assert numbers == pytest.approx([result.score, *result.token_log_probs], abs=1e-4)
    assert attnserve_cli.main([*args, "--log-probs", "--stream"]) == 2
    assert "leave out --stream" in capsys.readouterr().err
