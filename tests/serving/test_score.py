"""The Score RPC (CTranslate2's ``score_batch``) checked against PyTorch and the served model's
own generation.

The tiny random MarianMTModel of ``hf_repository`` served for real: each target token's
log-probability is the log-softmax of the teacher-forced logits (the entry's suppressed ids,
Marian's pad, never chosen) at its position, EOS's after the whole target; the same values come
in any batch (one request's ragged pairs, concurrent calls' pairs), agree with Translate's
``token_log_probs`` and ``score`` for the tokens it generated, and cross the engine process's
socket unchanged. The tiny random VisionEncoderDecoder captioner of the same repository scores
its own captions as Caption reported them. Bad requests are refused with the right status.
"""

from __future__ import annotations

import concurrent.futures
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402

from contract.repository import read_model_config  # noqa: E402
from models.data.translation import generate_pairs  # noqa: E402
from serving.client import AttnServeClient, ClientError, TargetScore  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402
from tests.export.hf_fixtures import marian_texts, sample_images  # noqa: E402
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.hf_marian import generate, load_marian  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

TOLERANCE = 2e-4  # ONNX Runtime against PyTorch (or against the step-by-step decoder)
SAME = 1e-5  # one graph, other batch companions
CAPTIONER = "hf-captioner"


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    return load_marian(hf_sources["marian"], 12, seed=31)


@pytest.fixture(scope="module")
def marian_config(hf_repository: Path) -> Any:
    return read_model_config(hf_repository / "marian")


@pytest.fixture(scope="module")
def captioner_tokenizer(hf_sources: dict[str, Path]) -> Any:
    return transformers.AutoTokenizer.from_pretrained(hf_sources[CAPTIONER])


@pytest.fixture(scope="module")
def channel(hf_server: ServerThread) -> Any:
    with grpc.insecure_channel(hf_server.address) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(channel: Any) -> Any:
    return pb_grpc.AttnServeStub(channel)


@pytest.fixture(scope="module")
def german() -> list[str]:
    """Real German target texts (the target SentencePiece model's own language)."""
    return [p.target for p in generate_pairs(200, seed=1, split="test") if p.lang == "de"][:16]


@pytest.fixture(scope="module")
def pairs(marian: dict[str, Any], german: list[str]) -> list[tuple[str, str]]:
    """8 (text, target) pairs of ragged lengths: German numbers, the start of ``generate``'s
    greedy outputs decoded, and an empty target."""
    tokenizer = marian["tokenizer"]
    texts = marian["texts"][:8]
    generated = generate(marian, texts[4:7])
    starts = [tokenizer.decode(ids[:3], skip_special_tokens=True) for ids in generated]
    targets = [german[0], german[1], german[2], german[3], *starts, ""]
    assert [len(target_ids(tokenizer, t)) for t in targets[:4]] == [5, 6, 5, 9]
    assert all(1 <= len(target_ids(tokenizer, t)) <= 19 for t in starts)
    return list(zip(texts, targets, strict=True))


# --- helpers ------------------------------------------------------------------------------------


def target_ids(tokenizer: Any, target: str) -> list[int]:
    """The target side's ids of ``target``, without the EOS the tokenizer appends."""
    ids = tokenizer(text_target=target).input_ids
    assert ids[-1] == tokenizer.eos_token_id
    return ids[:-1]


def score(stub: Any, pairs: list[tuple[str, str]], model: str = "marian", **fields: Any) -> Any:
    request = pb.ScoreRequest(
        model=model,
        texts=[text for text, _ in pairs],
        targets=[target for _, target in pairs],
        **fields,
    )
    return stub.Score(request, timeout=30)


def assert_scores_equal(got: Any, want: Any, atol: float = SAME) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a.token_ids) == list(b.token_ids)
        np.testing.assert_allclose(a.token_log_probs, b.token_log_probs, atol=atol)
        assert a.eos_log_prob == pytest.approx(b.eos_log_prob, abs=atol)
        assert a.score == pytest.approx(b.score, abs=atol * (len(a.token_ids) + 1))


def teacher_forced(
    marian: dict[str, Any], suppress: list[int], text: str, ids: list[int]
) -> np.ndarray:
    """PyTorch's log-probability of each of ``ids`` and then EOS after ``text``, the entry's
    suppressed ids (Marian's pad) set to -inf first."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    decoder = torch.tensor([[model.config.decoder_start_token_id, *ids]])
    with torch.no_grad():
        logits = model(**tokenizer([text], return_tensors="pt"), decoder_input_ids=decoder).logits
    logits[0, :, [tokenizer.pad_token_id, *suppress]] = -np.inf
    log_probs = torch.log_softmax(logits[0], -1)
    chosen = [*ids, tokenizer.eos_token_id]
    return np.array([float(log_probs[i, t]) for i, t in enumerate(chosen)])


def images_png(count: int, seed: int = 7) -> list[bytes]:
    return sample_images(count, seed=seed)


# --- 1. PyTorch parity, one request and pair by pair -------------------------------------------


def test_scores_are_pytorchs_teacher_forced_log_probs(
    stub: Any,
    marian: dict[str, Any],
    marian_config: Any,
    pairs: list[tuple[str, str]],
) -> None:
    suppress = list(marian_config.decoder.suppress_ids)
    assert marian["tokenizer"].pad_token_id in suppress
    response = score(stub, pairs)
    assert len(response.scores) == len(pairs)
    lengths = set()
    for (text, target), scored in zip(pairs, response.scores, strict=True):
        ids = target_ids(marian["tokenizer"], target)
        lengths.add(len(ids))
        assert list(scored.token_ids) == ids
        expected = teacher_forced(marian, suppress, text, ids)
        assert len(scored.token_log_probs) == len(ids)
        np.testing.assert_allclose(scored.token_log_probs, expected[:-1], atol=TOLERANCE)
        assert scored.eos_log_prob == pytest.approx(expected[-1], abs=TOLERANCE)
        assert scored.score == pytest.approx(expected.sum(), abs=TOLERANCE * len(expected))
        assert scored.score == pytest.approx(
            sum(scored.token_log_probs) + scored.eos_log_prob, abs=1e-4
        )
        assert all(v <= 0 for v in scored.token_log_probs) and scored.eos_log_prob <= 0
    assert len(lengths) >= 5 and 0 in lengths  # ragged: the batch's targets are padded


def test_each_pair_alone_scores_as_in_the_batch(stub: Any, pairs: list[tuple[str, str]]) -> None:
    together = score(stub, pairs).scores
    alone = [score(stub, [pair]).scores[0] for pair in pairs]
    assert_scores_equal(alone, together)
    reversed_order = score(stub, pairs[::-1]).scores
    assert_scores_equal(list(reversed_order)[::-1], together)


# --- 2. consistency with generation ---------------------------------------------------------------


def test_translations_score_as_translate_reported_them(
    stub: Any, marian: dict[str, Any], marian_config: Any, german: list[str]
) -> None:
    """Greedy translations with return_log_probs, started by target prefixes (the random model's
    own outputs rarely tokenize back to the ids it wrote; a German prefix makes most of them
    do): Score of the translation's text gives its token ids and, after the prefix (whose
    tokens Translate reports as 0), its log-probabilities; Translate's score is their sum with
    EOS's, or without it where EOS was forced at max_new_tokens (forced: 0)."""
    tokenizer = marian["tokenizer"]
    texts, prefixes = marian["texts"][:12], german[:12]
    request = pb.TranslateRequest(
        model="marian",
        texts=texts,
        target_language="de",
        target_prefixes=prefixes,
        options=pb.DecodingOptions(return_log_probs=True),
    )
    translations = list(stub.Translate(request, timeout=30).translations)
    chosen = [
        (text, len(target_ids(tokenizer, prefix)), t)
        for text, prefix, t in zip(texts, prefixes, translations, strict=True)
        if target_ids(tokenizer, t.text) == list(t.token_ids)
    ]
    assert len(chosen) >= 8
    scored = score(stub, [(text, t.text) for text, _, t in chosen]).scores
    longest = marian_config.limits.max_new_tokens
    forced = free = 0
    for (_, prefix, translation), s in zip(chosen, scored, strict=True):
        assert list(s.token_ids) == list(translation.token_ids)
        assert list(translation.token_log_probs[:prefix]) == [0.0] * prefix
        np.testing.assert_allclose(
            s.token_log_probs[prefix:], translation.token_log_probs[prefix:], atol=TOLERANCE
        )
        generated = float(np.sum(np.asarray(s.token_log_probs[prefix:], dtype=np.float64)))
        assert translation.finish_reason == pb.FINISH_REASON_STOP
        if len(translation.token_ids) == longest - 1:  # EOS forced as the last token
            forced += 1
            assert translation.score == pytest.approx(generated, abs=2e-3)
        else:
            free += 1
            assert translation.score == pytest.approx(generated + s.eos_log_prob, abs=2e-3)
    assert forced and free


def test_plain_greedy_translations_score_as_translate_reported_them(
    stub: Any, marian: dict[str, Any]
) -> None:
    """Without a prefix: the texts whose greedy translation tokenizes back to its ids (among
    them empty translations, whose score is EOS's log-probability after the start token)."""
    tokenizer = marian["tokenizer"]
    texts = marian_texts(64, seed=31)
    request = pb.TranslateRequest(
        model="marian",
        texts=texts[:32],
        target_language="de",
        options=pb.DecodingOptions(return_log_probs=True),
    )
    more = pb.TranslateRequest(
        model="marian",
        texts=texts[32:],
        target_language="de",
        options=pb.DecodingOptions(return_log_probs=True),
    )
    translations = [
        *stub.Translate(request, timeout=30).translations,
        *stub.Translate(more, timeout=30).translations,
    ]
    chosen = [
        (text, t)
        for text, t in zip(texts, translations, strict=True)
        if target_ids(tokenizer, t.text) == list(t.token_ids) and len(t.token_ids) < 18
    ]
    assert len(chosen) >= 3
    scored = score(stub, [(text, t.text) for text, t in chosen]).scores
    for (_, translation), s in zip(chosen, scored, strict=True):
        assert list(s.token_ids) == list(translation.token_ids)
        np.testing.assert_allclose(s.token_log_probs, translation.token_log_probs, atol=TOLERANCE)
        assert s.score == pytest.approx(translation.score, abs=2e-3)


# --- 3. concurrency -------------------------------------------------------------------------------


def test_concurrent_calls_each_get_their_own_scores(
    stub: Any, marian: dict[str, Any], german: list[str]
) -> None:
    """24 Score calls of 1 to 4 pairs each (targets of 0 to 12 tokens), with 6 Translate calls
    among them, sent at once twice over: their pairs share passes in the scoring batcher beside
    the in-flight engine, and each call gets what it got alone."""
    texts = marian["texts"]
    targets = ["", *german]
    requests = []
    for i in range(24):
        size = 1 + i % 4
        requests.append(
            [
                (texts[(i + j) % len(texts)], targets[(3 * i + j) % len(targets)])
                for j in range(size)
            ]
        )
    alone = [score(stub, pairs).scores for pairs in requests]
    translate = pb.TranslateRequest(
        model="marian",
        texts=texts[:3],
        target_language="de",
        options=pb.DecodingOptions(return_log_probs=True),
    )
    translated = stub.Translate(translate, timeout=30).translations
    for _ in range(2):
        score_calls = [
            stub.Score.future(
                pb.ScoreRequest(
                    model="marian",
                    texts=[t for t, _ in pairs],
                    targets=[g for _, g in pairs],
                ),
                timeout=60,
            )
            for pairs in requests
        ]
        translate_calls = [stub.Translate.future(translate, timeout=60) for _ in range(6)]
        for call, want in zip(score_calls, alone, strict=True):
            assert_scores_equal(call.result().scores, want)
        for call in translate_calls:
            got = call.result().translations
            assert [list(t.token_ids) for t in got] == [list(t.token_ids) for t in translated]


def test_threads_calling_at_once_get_their_own_scores(
    channel: Any, marian: dict[str, Any], german: list[str]
) -> None:
    texts = marian["texts"]
    stub = pb_grpc.AttnServeStub(channel)
    requests = [[(texts[i], german[i])] * (1 + i % 3) for i in range(12)]
    alone = [score(stub, pairs).scores for pairs in requests]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda pairs: score(stub, pairs).scores, requests * 3))
    for got, want in zip(results, alone * 3, strict=True):
        assert_scores_equal(got, want)


# --- 4. usage, timing, model ----------------------------------------------------------------------


def test_usage_timing_and_model_fields(
    stub: Any, marian: dict[str, Any], pairs: list[tuple[str, str]]
) -> None:
    tokenizer = marian["tokenizer"]
    response = score(stub, pairs)
    texts = [text for text, _ in pairs]
    translate = pb.TranslateRequest(model="marian", texts=texts, target_language="de")
    translated = stub.Translate(translate, timeout=30)
    assert response.usage.input_tokens == translated.usage.input_tokens
    assert response.usage.input_tokens == sum(len(tokenizer(t).input_ids) for t in texts)
    assert response.usage.output_tokens == sum(len(s.token_ids) for s in response.scores)
    assert response.usage.output_tokens == sum(
        len(target_ids(tokenizer, target)) for _, target in pairs
    )
    assert response.timing.total_time_ms > 0
    assert response.timing.compute_time_ms > 0
    assert response.timing.queue_time_ms >= 0
    assert response.timing.time_to_first_token_ms == 0
    assert response.timing.total_time_ms >= response.timing.compute_time_ms
    assert response.model == "marian"
    assert response.model_version == "1"
    versioned = score(stub, pairs[:1], model_version="1")
    assert versioned.model_version == "1"


# --- 5. an empty target ---------------------------------------------------------------------------


def test_an_empty_target_scores_eos_after_the_start_token(
    stub: Any, marian: dict[str, Any], marian_config: Any
) -> None:
    suppress = list(marian_config.decoder.suppress_ids)
    texts = marian["texts"][:4]
    response = score(stub, [(text, "") for text in texts])
    assert response.usage.output_tokens == 0
    for text, scored in zip(texts, response.scores, strict=True):
        assert list(scored.token_ids) == [] and list(scored.token_log_probs) == []
        (expected,) = teacher_forced(marian, suppress, text, [])
        assert scored.eos_log_prob == pytest.approx(expected, abs=TOLERANCE)
        assert scored.score == scored.eos_log_prob
        assert scored.eos_log_prob < 0


# --- 6. refusals ----------------------------------------------------------------------------------

PNG = sample_images(1, seed=3)[0]
REFUSED = [
    ("no targets", {"model": "marian", "texts": ["one"]}, "INVALID_ARGUMENT", "targets is empty"),
    (
        "counts differ",
        {"model": "marian", "texts": ["one", "two"], "targets": ["drei"]},
        "INVALID_ARGUMENT",
        "2 texts for 1 targets",
    ),
    (
        "no texts",
        {"model": "marian", "targets": ["drei"]},
        "INVALID_ARGUMENT",
        "0 texts for 1 targets",
    ),
    (
        "texts and images",
        {"model": "marian", "texts": ["one"], "images": [PNG], "targets": ["drei"]},
        "INVALID_ARGUMENT",
        "not both",
    ),
    (
        "images to the translator",
        {"model": "marian", "images": [PNG], "targets": ["drei"]},
        "INVALID_ARGUMENT",
        "model 'marian' takes texts, not images",
    ),
    (
        "texts to the captioner",
        {"model": CAPTIONER, "texts": ["one"], "targets": ["a"]},
        "INVALID_ARGUMENT",
        "model 'hf-captioner' takes images, not texts",
    ),
    (
        "unknown language",
        {"model": "marian", "texts": ["one"], "targets": ["drei"], "target_language": "fr"},
        "INVALID_ARGUMENT",
        "target_language 'fr' is not supported",
    ),
    (
        "characters outside the vocabulary",
        {"model": "marian", "texts": ["one"], "targets": ["drei €"]},
        "INVALID_ARGUMENT",
        "the target 'drei €' tokenizes to special tokens",
    ),
    (
        "an EOS written out",
        {"model": "marian", "texts": ["one", "two"], "targets": ["drei", "vier </s>"]},
        "INVALID_ARGUMENT",
        "the target 'vier </s>' tokenizes to special tokens",
    ),
    (
        "the captioner's end token written out",
        {"model": CAPTIONER, "images": [PNG], "targets": ["<|endoftext|>"]},
        "INVALID_ARGUMENT",
        "tokenizes to special tokens",
    ),
    (
        "an empty text",
        {"model": "marian", "texts": [""], "targets": ["drei"]},
        "INVALID_ARGUMENT",
        "text is empty",
    ),
    (
        "an undecodable image",
        {"model": CAPTIONER, "images": [b"not a png"], "targets": ["a"]},
        "INVALID_ARGUMENT",
        "is not a PNG or JPEG image",
    ),
    (
        "a target of 20 tokens",
        {"model": "marian", "texts": ["one"], "targets": ["sechs" * 19]},
        "RESOURCE_EXHAUSTED",
        "the target is 20 tokens long; model 'marian' writes at most 19 tokens",
    ),
    (
        "a target of a million characters",
        {"model": "marian", "texts": ["one"], "targets": ["sechs" * 200_000]},
        "RESOURCE_EXHAUSTED",
        "writes at most 19 tokens",
    ),
    (
        "a captioner target of 16 tokens",
        {"model": CAPTIONER, "images": [PNG], "targets": ["$" * 16]},
        "RESOURCE_EXHAUSTED",
        "writes at most 15 tokens",
    ),
    (
        "a source text too long",
        {"model": "marian", "texts": ["one " * 100], "targets": ["drei"]},
        "RESOURCE_EXHAUSTED",
        "accepts at most 64 source tokens",
    ),
    (
        "33 targets",
        {"model": "marian", "texts": ["one"] * 33, "targets": ["drei"] * 33},
        "RESOURCE_EXHAUSTED",
        "33 targets in one request; the limit is 32",
    ),
    (
        "an unknown model",
        {"model": "nope", "texts": ["one"], "targets": ["drei"]},
        "NOT_FOUND",
        "no model named 'nope'",
    ),
    (
        "an unknown version",
        {"model": "marian", "model_version": "7", "texts": ["one"], "targets": ["drei"]},
        "NOT_FOUND",
        "has no version '7'",
    ),
    (
        "a classifier",
        {"model": "hf-vit", "images": [PNG], "targets": ["cat"]},
        "INVALID_ARGUMENT",
        "model 'hf-vit' does classification: only translators and captioners score",
    ),
    (
        "texts go to the translator by default",
        {"texts": ["one"], "targets": ["drei"]},
        "NOT_FOUND",
        "no model named 'translator'",
    ),
    (
        "images go to the captioner by default",
        {"images": [PNG], "targets": ["a"]},
        "NOT_FOUND",
        "no model named 'captioner'",
    ),
]


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_bad_requests_are_refused(
    stub: Any, fields: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.Score(pb.ScoreRequest(**fields), timeout=30)
    assert refused.value.code() == getattr(grpc.StatusCode, code)
    assert message in (refused.value.details() or "")


def test_the_limits_themselves_are_accepted(stub: Any, marian: dict[str, Any]) -> None:
    """19 tokens (limits.max_new_tokens) and 32 targets (max_texts_per_request) are allowed."""
    longest = "sechs" * 18
    assert len(target_ids(marian["tokenizer"], longest)) == 19
    (scored,) = score(stub, [("one", longest)]).scores
    assert len(scored.token_ids) == len(scored.token_log_probs) == 19
    response = score(stub, [("one", "drei")] * 32)
    assert len(response.scores) == 32
    assert_scores_equal(response.scores[1:], response.scores[:1] * 31)


def test_too_many_targets_are_refused_before_any_source_is_read(
    stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving.served import ServedGenerator

    decoded: list[int] = []
    image_pixels = ServedGenerator.image_pixels

    def counted(self: Any, data: bytes) -> np.ndarray:
        decoded.append(len(data))
        return image_pixels(self, data)

    monkeypatch.setattr(ServedGenerator, "image_pixels", counted)  # the in-process server's
    texts = ["", *["one"] * 32]
    translate = pb.TranslateRequest(model="marian", texts=texts, target_language="de")
    with pytest.raises(grpc.RpcError) as translated:
        stub.Translate(translate, timeout=30)
    assert translated.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    images = pb.ScoreRequest(model=CAPTIONER, images=[PNG] * 40, targets=["a"] * 40)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Score(images, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "40 targets in one request" in (refused.value.details() or "")
    assert decoded == []  # refused for its size: no image decoded (40 are, first)
    score_texts = pb.ScoreRequest(model="marian", texts=texts, targets=["drei"] * 33)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Score(score_texts, timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # INVALID_ARGUMENT


def test_a_deadline_far_too_short_is_exceeded(stub: Any) -> None:
    request = pb.ScoreRequest(model="marian", texts=["one"], targets=["drei"])
    with pytest.raises(grpc.RpcError) as refused:
        stub.Score(request, timeout=1e-6)
    assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# --- 7. two frontend processes ----------------------------------------------------------------


def test_two_frontend_processes_score_as_one_process(
    hf_repository: Path, stub: Any, pairs: list[tuple[str, str]]
) -> None:
    """Pairs cross to the engine process's scoring batcher (token ids, an empty target, and
    48 x 48 pixels, which go through the shared memory arena) and come back unchanged; a
    refusal keeps its status and message."""
    images = images_png(3)
    captions = ["a", "", "blue $ square"]
    local = score(stub, pairs)
    local_captions = stub.Score(
        pb.ScoreRequest(model=CAPTIONER, images=images, targets=captions), timeout=30
    )
    bad = pb.ScoreRequest(model="marian", texts=["one"], targets=["drei €"])
    with two_frontends(hf_repository, models=("marian", CAPTIONER), connections=1) as (
        server,
        _,
    ):
        channel = grpc.insecure_channel(server.address)
        try:
            other = pb_grpc.AttnServeStub(channel)
            remote = [score(other, pairs) for _ in range(2)]
            alone = [score(other, [pair]).scores[0] for pair in pairs]
            remote_captions = other.Score(
                pb.ScoreRequest(model=CAPTIONER, images=images, targets=captions), timeout=60
            )
            with pytest.raises(grpc.RpcError) as refused:
                other.Score(bad, timeout=60)
            with pytest.raises(grpc.RpcError) as too_short:
                other.Score(
                    pb.ScoreRequest(model="marian", texts=["one"], targets=["drei"]), timeout=1e-6
                )
        finally:
            channel.close()
    for response in remote:
        assert_scores_equal(response.scores, local.scores)
        assert response.usage == local.usage
        assert response.model == "marian" and response.model_version == "1"
        assert response.timing.compute_time_ms > 0
    assert_scores_equal(alone, local.scores)
    assert_scores_equal(remote_captions.scores, local_captions.scores)
    assert remote_captions.usage == local_captions.usage
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the target 'drei €' tokenizes to special tokens" in (refused.value.details() or "")
    assert too_short.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# --- 8. a captioner ---------------------------------------------------------------------------


def test_captions_score_as_caption_reported_them(stub: Any, captioner_tokenizer: Any) -> None:
    """Greedy captions with return_log_probs; those whose text tokenizes back to the ids the
    captioner wrote (its byte-level BPE, random weights) score with those ids and log-probs;
    Caption's score is their sum with EOS's where the caption ended with EOS, without it where
    it ran to max_new_tokens."""
    images = images_png(40)
    captions = [
        stub.Caption(
            pb.CaptionRequest(
                model=CAPTIONER, image=image, options=pb.DecodingOptions(return_log_probs=True)
            ),
            timeout=30,
        )
        for image in images
    ]
    chosen = [
        (image, c)
        for image, c in zip(images, captions, strict=True)
        if captioner_tokenizer.encode(c.text) == list(c.token_ids)
    ]
    assert len(chosen) >= 4
    response = stub.Score(
        pb.ScoreRequest(
            model=CAPTIONER, images=[i for i, _ in chosen], targets=[c.text for _, c in chosen]
        ),
        timeout=30,
    )
    assert response.model == CAPTIONER
    assert response.usage.input_tokens == sum(c.usage.input_tokens for _, c in chosen)
    assert response.usage.output_tokens == sum(len(c.token_ids) for _, c in chosen)
    reasons = set()
    for (_, caption), s in zip(chosen, response.scores, strict=True):
        assert list(s.token_ids) == list(caption.token_ids)
        np.testing.assert_allclose(s.token_log_probs, caption.token_log_probs, atol=TOLERANCE)
        total = float(np.sum(np.asarray(s.token_log_probs, dtype=np.float64)))
        reasons.add(caption.finish_reason)
        if caption.finish_reason == pb.FINISH_REASON_STOP:
            assert caption.score == pytest.approx(total + s.eos_log_prob, abs=2e-3)
            assert s.score == pytest.approx(caption.score, abs=2e-3)
        else:
            assert caption.finish_reason == pb.FINISH_REASON_LENGTH
            assert caption.score == pytest.approx(total, abs=2e-3)
    assert reasons == {pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH}
    alone = [
        stub.Score(
            pb.ScoreRequest(model=CAPTIONER, images=[image], targets=[c.text]), timeout=30
        ).scores[0]
        for image, c in chosen
    ]
    assert_scores_equal(alone, response.scores)


# --- 9. the Python client ---------------------------------------------------------------------


def test_the_client_returns_what_the_stub_returns(
    hf_client: AttnServeClient, stub: Any, pairs: list[tuple[str, str]]
) -> None:
    texts, targets = [t for t, _ in pairs], [g for _, g in pairs]
    want = score(stub, pairs).scores
    got = hf_client.score(texts, targets, to="de", model="marian")
    assert all(isinstance(s, TargetScore) for s in got)
    assert [s.token_ids for s in got] == [list(s.token_ids) for s in want]
    for s, w in zip(got, want, strict=True):
        np.testing.assert_allclose(s.token_log_probs, w.token_log_probs, atol=SAME)
        assert isinstance(s.token_log_probs, tuple)
        assert s.eos_log_prob == pytest.approx(w.eos_log_prob, abs=SAME)
        assert s.score == pytest.approx(w.score, abs=SAME * 20)
    (one,) = hf_client.score(texts[0], targets[0], to="de", model="marian")
    assert one.token_ids == list(want[0].token_ids)
    assert one.score == pytest.approx(want[0].score, abs=SAME * 20)
    images = images_png(2)
    captions = ["a red", "circle"]
    got_captions = hf_client.score_captions(images, captions, model=CAPTIONER)
    want_captions = stub.Score(
        pb.ScoreRequest(model=CAPTIONER, images=images, targets=captions), timeout=30
    ).scores
    assert [s.token_ids for s in got_captions] == [list(s.token_ids) for s in want_captions]
    for s, w in zip(got_captions, want_captions, strict=True):
        np.testing.assert_allclose(s.token_log_probs, w.token_log_probs, atol=SAME)
        assert s.eos_log_prob == pytest.approx(w.eos_log_prob, abs=SAME)
    with pytest.raises(ClientError) as refused:
        hf_client.score(["one"], ["drei"], to="fr", model="marian")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "target_language 'fr'" in refused.value.details
    with pytest.raises(ClientError) as default:
        hf_client.score(["one"], ["drei"], to="de")
    assert default.value.code == grpc.StatusCode.NOT_FOUND
    assert "'translator'" in default.value.details


# --- a version folder without decoder.onnx ---------------------------------------------------


def test_without_decoder_onnx_scoring_fails_and_translation_goes_on(
    hf_repository: Path, tmp_path: Path, marian: dict[str, Any]
) -> None:
    """A server decoding in place loads decoder.onnx on the first Score: where the export's
    folder lacks it, Score fails with FAILED_PRECONDITION naming the file (every time), and
    Translate is unaffected."""
    shutil.copytree(hf_repository / "marian", tmp_path / "marian")
    (tmp_path / "marian" / "1" / "decoder.onnx").unlink()
    text = marian["texts"][0]
    with (
        ServerThread(tmp_path, metrics_port=-1) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        other = pb_grpc.AttnServeStub(channel)
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as failed:
                score(other, [(text, "drei")])
            assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "decoder.onnx" in (failed.value.details() or "")
        request = pb.TranslateRequest(model="marian", texts=[text], target_language="de")
        assert other.Translate(request, timeout=30).translations[0].token_ids
