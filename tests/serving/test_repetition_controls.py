"""Repetition controls (``repetition_penalty``, ``no_repeat_ngram_size``) checked against
transformers itself.

The rules against HF's logits processors on random rows (hypothesis); then the tiny random
MarianMTModel of ``hf_repository`` served for real: greedy decoding and beam search with each
control give exactly ``generate``'s token ids with the same options (the attnserve API, KServe
parameters, a stream, requests of other options batched beside them, two frontend processes,
the CLI); seeded sampling never repeats a banned n-gram; bad values are INVALID_ARGUMENT naming
the field.
"""

from __future__ import annotations

import concurrent.futures
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402

import attnserve_cli  # noqa: E402
from serving.client import AttnServeClient, ClientError  # noqa: E402
from serving.generation.history_rules import HistoryRules  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.hf_marian import generate, load_marian, translate  # noqa: E402
from tests.serving.hf_streams import stream_log_probs  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

TEXTS = 40
CONTROLS: list[dict[str, Any]] = [
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.5},
    {"no_repeat_ngram_size": 1},
    {"no_repeat_ngram_size": 2},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3},
]


# --- the rules against HF's processors ----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    vocab=st.integers(2, 12),
    data=st.data(),
    penalty=st.sampled_from([1.0, 0.4, 1.25, 3.0]),
    ngram=st.integers(0, 5),
)
def test_rules_are_hf_logits_processors(
    vocab: int, data: st.DataObject, penalty: float, ngram: int
) -> None:
    tokens = st.integers(0, vocab - 1)
    start = data.draw(tokens)
    generated = np.asarray(data.draw(st.lists(tokens, max_size=12)), dtype=np.int64)
    scores = np.asarray(
        data.draw(st.lists(st.floats(-5, 5, width=32), min_size=vocab, max_size=vocab))
    )
    rules = HistoryRules(penalty, ngram, start)
    ours = scores.copy()
    rules.apply(ours, generated)
    ids = torch.tensor([[start, *generated.tolist()]])
    theirs = torch.tensor(scores[None])
    if penalty != 1:
        theirs = transformers.RepetitionPenaltyLogitsProcessor(penalty)(ids, theirs)
    if ngram:
        theirs = transformers.NoRepeatNGramLogitsProcessor(ngram)(ids, theirs)
    np.testing.assert_array_equal(ours, theirs[0].numpy())


def test_the_rules_of_options() -> None:
    from serving.generation.options import DecodingOptions

    assert HistoryRules.of(DecodingOptions(), 5) is None  # the fast greedy path stays
    rules = HistoryRules.of(DecodingOptions(repetition_penalty=2.0), 5)
    assert rules == HistoryRules(2.0, 0, 5)
    assert rules.history(np.array([7, 8])).tolist() == [5, 7, 8]


# --- served, against generate() -----------------------------------------------------------------


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    return load_marian(hf_sources["marian"], TEXTS)


def _name(controls: dict[str, Any]) -> str:
    return ",".join(f"{key}={value}" for key, value in controls.items())


@pytest.mark.parametrize("controls", CONTROLS, ids=_name)
def test_greedy_with_controls_is_generate(
    hf_client: AttnServeClient, marian: dict[str, Any], controls: dict[str, Any]
) -> None:
    texts = marian["texts"]
    expected = generate(marian, texts, num_beams=1, **controls)
    assert expected != generate(marian, texts, num_beams=1)  # the controls change outputs
    served = translate(hf_client, texts[:20], **controls) + translate(
        hf_client, texts[20:], **controls
    )
    assert served == expected
    streamed = hf_client.translate_stream(texts[0], to="de", model="marian", **controls)
    assert "".join(streamed) == marian["tokenizer"].decode(expected[0], skip_special_tokens=True)


@pytest.mark.parametrize("controls", CONTROLS[1:4], ids=_name)
def test_beam_search_with_controls_is_generate(
    hf_client: AttnServeClient, marian: dict[str, Any], controls: dict[str, Any]
) -> None:
    texts = marian["texts"][:12]
    expected = generate(marian, texts, num_beams=4, **controls)
    assert expected != generate(marian, texts, num_beams=4)
    served = [translate(hf_client, [text], beam_size=4, **controls)[0] for text in texts]
    assert served == expected


def test_requests_of_other_options_in_one_batch_keep_their_own_tokens(
    hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    """Plain greedy, penalised greedy and n-gram-banned beams at once: each its own tokens."""
    texts = marian["texts"][:16]
    calls = [{}, CONTROLS[0], CONTROLS[3], {"beam_size": 4, **CONTROLS[3]}] * 4
    expected = {}
    for options in calls:
        key = tuple(sorted(options.items()))
        hf = {"num_beams": options.get("beam_size", 1)} | {
            k: v for k, v in options.items() if k != "beam_size"
        }
        expected[key] = generate(marian, texts, **hf)
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = {
            pool.submit(lambda i, o: translate(hf_client, [texts[i]], **o)[0], i, options): (
                i,
                tuple(sorted(options.items())),
            )
            for i, options in enumerate(calls)
        }
        for future, (i, key) in futures.items():
            assert future.result(timeout=60) == expected[key][i]


def test_kserve_parameters_carry_the_controls(
    hf_server: ServerThread, marian: dict[str, Any]
) -> None:
    texts = marian["texts"][:8]
    expected = generate(marian, texts, num_beams=1, **CONTROLS[4])
    # numeric strings work too
    as_strings: dict[str, Any] = {k: str(v) for k, v in CONTROLS[4].items()}
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        for params in (CONTROLS[4], as_strings):
            text = ("text", "BYTES", [t.encode() for t in texts])
            request = infer_request("marian", text, **params)
            rows = decode_outputs(stub.ModelInfer(request, timeout=30))["token_ids"].tolist()
            assert [[t for t in row if t != -1] for row in rows] == expected


def _ngrams(tokens: list[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]


def test_sampling_never_repeats_a_banned_ngram(
    hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    """Seeded sampling at a low temperature repeats bigrams; with the ban it never does, and
    the same seed gives the same tokens."""
    start = marian["model"].config.decoder_start_token_id
    texts = marian["texts"][:20]
    sampling = {"temperature": 0.5, "seed": 3}
    free = translate(hf_client, texts, **sampling)
    assert any(len(set(g)) < len(g) for g in (_ngrams([start, *t], 2) for t in free))
    banned = translate(hf_client, texts, no_repeat_ngram_size=2, **sampling)
    for tokens in banned:
        grams = _ngrams([start, *tokens], 2)
        assert len(set(grams)) == len(grams), tokens
    assert translate(hf_client, texts, no_repeat_ngram_size=2, **sampling) == banned


BAD = [
    ({"repetition_penalty": 0.0}, "repetition_penalty 0 is not a penalty"),
    ({"repetition_penalty": -1.5}, "repetition_penalty -1.5 is out of range"),
    ({"repetition_penalty": math.inf}, "repetition_penalty inf is not finite"),
    ({"repetition_penalty": 101.0}, "repetition_penalty 101"),
    ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size -2 is out of range: must be >= 0"),
]


@pytest.mark.parametrize(("options", "message"), BAD)
def test_bad_controls_are_invalid_argument(
    hf_server: ServerThread, hf_client: AttnServeClient, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClientError, match="INVALID_ARGUMENT") as caught:
        hf_client.translate(["one two"], to="de", model="marian", **options)
    assert message in str(caught.value)
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request("marian", ("text", "BYTES", [b"one two"]), **options)
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(request, timeout=30)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in rpc.value.details()


def test_the_cli_passes_the_controls(
    hf_server: ServerThread, marian: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text = marian["texts"][0]
    tokenizer = marian["tokenizer"]
    for flags, controls in (
        (["--repetition-penalty", "1.8"], CONTROLS[0]),
        (["--no-repeat-ngram-size", "2"], CONTROLS[3]),
    ):
        ids = generate(marian, [text], num_beams=1, **controls)[0]
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        args = ["translate", text, "--to", "de", "--model", "marian", "--server", hf_server.address]
        assert attnserve_cli.main([*args, *flags]) == 0
        assert capsys.readouterr().out.strip() == expected


def test_two_frontend_processes_carry_the_controls(
    hf_repository: Path, hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    """The options cross to the engine process, and the tokens' log-probabilities
    (``return_log_probs``) come back: the same as from one process."""
    texts = marian["texts"][:6]
    expected = generate(marian, texts, num_beams=1, **CONTROLS[4])
    options = {**CONTROLS[4], "return_log_probs": True}
    one_process = hf_client.translate(texts, to="de", model="marian", **options)
    with two_frontends(hf_repository, models=("marian",), connections=3) as (server, stubs):
        for stub in stubs:
            text = ("text", "BYTES", [t.encode() for t in texts])
            outputs = decode_outputs(stub.ModelInfer(infer_request("marian", text, **options)))
            rows = outputs["token_ids"].tolist()
            assert [[t for t in row if t != -1] for row in rows] == expected
            for log_probs, ids, result in zip(
                outputs["token_log_probs"], outputs["token_ids"], one_process, strict=True
            ):
                np.testing.assert_allclose(log_probs[ids != -1], result.token_log_probs, atol=1e-6)
        # a stream's tokens and their log-probabilities cross from the engine process too
        for text, result in zip(texts, one_process, strict=True):
            ids, streamed, score = stream_log_probs(server.address, text, **CONTROLS[4])
            assert ids == result.token_ids
            np.testing.assert_allclose(streamed, result.token_log_probs, atol=1e-6)
            assert score == pytest.approx(result.score, abs=1e-5)
