"""Top log-probabilities on the OpenAI-compatible routes (``/v1/completions``' ``"logprobs": N``,
``/v1/chat/completions``' ``"logprobs": true, "top_logprobs": N``), on this package's server.

The tiny models have random weights, so each answer is checked against the attnserve gRPC API's
``top_log_probs`` for the same input and options on the same server (greedy on both sides, or
the same seed): the values, most likely first, and the texts, which are what the model's
tokenizer adds to the output so far with each listed token in the chosen one's place
(``expected_tops``, computed here from the gRPC token ids). Streams against the unary answers;
seeded samples against the native calls with the same seeds; refusals in OpenAI's error shape.
Greedy requests use ``no_repeat_ngram_size`` 1, as ``test_openai_client`` does (varied tokens,
ending with EOS).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import grpc
import openai
import pytest

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.served import ServedGenerator
from tests.serving.rest.conftest import Answer, request
from tests.serving.rest.test_openai_client import (
    DATA_URL,
    EXTRA,
    GREEDY,
    IMAGE,
    LANGUAGE,
    PROMPTS,
    TIMEOUT,
    assert_openai_error,
    outputs,
    sse,
    translate,
)
from tests.serving.server_thread import ServerThread

TOLERANCE = 1e-6
Pairs = list[tuple[str, float]]  # one position's alternatives: (text, log-probability)


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=TIMEOUT) as made:
        yield made


@pytest.fixture(scope="module")
def native(server: ServerThread) -> Iterator[pb_grpc.AttnServeStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


@pytest.fixture(scope="module")
def tokenizers(server: ServerThread) -> dict[str, Any]:
    """The served models' target tokenizers (what the routes write token texts with)."""
    assert server.running is not None
    repository = server.running.repository
    found = {}
    for name in ("translator", "captioner"):
        model = repository.get(name)
        assert isinstance(model, ServedGenerator)
        found[name] = model.tokenizer
    return found


# --- the expected answers ----------------------------------------------------------------------
def scored(**options: Any) -> dict[str, Any]:
    return {**options, "return_log_probs": True}


def expected_tops(tokenizer: Any, output: Any) -> list[Pairs]:
    """Per token of a gRPC output: its ``top_log_probs`` entries as (text, value), the text
    being what decoding the tokens before it and that entry's token adds to decoding the tokens
    before it (all of the decoding where it changes the text before)."""
    ids = list(output.token_ids)
    assert len(output.top_log_probs) == len(ids), "one TopLogProbs per token id"
    found = []
    for position, top in enumerate(output.top_log_probs):
        before = tokenizer.decode(ids[:position])
        pairs = []
        for token, value in zip(top.token_ids, top.log_probs, strict=True):
            text = tokenizer.decode([*ids[:position], token])
            pairs.append((text[len(before) :] if text.startswith(before) else text, value))
        found.append(pairs)
    return found


def by_text(pairs: Pairs) -> Pairs:
    """The completions' dict: each text once, with its first (likelier) value."""
    seen: dict[str, float] = {}
    for text, value in pairs:
        seen.setdefault(text, value)
    return list(seen.items())


def assert_pairs(got: Iterable[tuple[str, float]], want: Pairs) -> None:
    got = list(got)
    assert [text for text, _ in got] == [text for text, _ in want]
    for (_, value), (_, wanted) in zip(got, want, strict=True):
        assert value == pytest.approx(wanted, abs=TOLERANCE)


def assert_native_tops(output: Any, count: int, greedy: bool) -> None:
    """A gRPC output's own ``top_log_probs``: one per token, ``count`` entries (the tiny vocabulary
    always has that many possible tokens), distinct ids, most likely first, ties by id; greedy:
    the chosen token first, with its token_log_probs value; sampled: the chosen token's value
    where listed, and never above the first."""
    assert len(output.top_log_probs) == len(output.token_ids) == len(output.token_log_probs)
    for token, value, top in zip(
        output.token_ids, output.token_log_probs, output.top_log_probs, strict=True
    ):
        ids, values = list(top.token_ids), list(top.log_probs)
        assert len(ids) == len(values) == count
        assert len(set(ids)) == count
        ranked = sorted(zip(values, ids, strict=True), key=lambda pair: (-pair[0], pair[1]))
        assert [i for _, i in ranked] == ids
        assert all(v <= 0 and math.isfinite(v) for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        if greedy:
            assert (ids[0], values[0]) == (token, pytest.approx(value, abs=TOLERANCE))
        else:
            assert value <= values[0] + TOLERANCE
            if token in ids:
                assert values[ids.index(token)] == pytest.approx(value, abs=TOLERANCE)


def completion_body(**fields: Any) -> dict[str, Any]:
    return {"model": "translator", "prompt": PROMPTS[0], **EXTRA, **fields}


def chat_body(content: Any = PROMPTS[0], **fields: Any) -> dict[str, Any]:
    return {
        "model": "translator",
        "messages": [{"role": "user", "content": content}],
        **EXTRA,
        **fields,
    }


def completions(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = request(f"{url}/v1/completions", body)
    assert answer.status == 200, answer.body
    return answer.json()


def chats(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = request(f"{url}/v1/chat/completions", body)
    assert answer.status == 200, answer.body
    return answer.json()


def stream_completions(url: str, body: dict[str, Any]) -> dict[int, dict[str, list[Any]]]:
    """A completions stream's logprobs put together per choice index (each chunk's
    ``top_logprobs`` one per token; a chunk without tokens may have null)."""
    assembled: dict[int, dict[str, list[Any]]] = {}
    for chunk in sse(request(f"{url}/v1/completions", {**body, "stream": True})):
        for choice in chunk["choices"]:
            mine = assembled.setdefault(
                choice["index"], {"tokens": [], "token_logprobs": [], "top_logprobs": []}
            )
            logprobs = choice["logprobs"]
            if logprobs is None:
                continue
            tokens, tops = logprobs["tokens"], logprobs["top_logprobs"]
            assert tops is not None or not tokens, logprobs
            assert len(tops or []) == len(tokens)
            mine["tokens"] += tokens
            mine["token_logprobs"] += logprobs["token_logprobs"]
            mine["top_logprobs"] += tops or []
    return assembled


def stream_chat(url: str, body: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """A chat stream's ``logprobs.content`` entries put together per choice index."""
    assembled: dict[int, list[dict[str, Any]]] = {}
    for chunk in sse(request(f"{url}/v1/chat/completions", {**body, "stream": True})):
        for choice in chunk["choices"]:
            mine = assembled.setdefault(choice["index"], [])
            if choice.get("logprobs") is not None:
                mine += choice["logprobs"]["content"]
    return assembled


def native_stream(native: pb_grpc.AttnServeStub, text: str, options: dict[str, Any]) -> Any:
    """A TranslateStream's token ids, log-probabilities and top log-probabilities together (as a
    Translation-like message)."""
    call = pb.TranslateStreamRequest(
        text=text, target_language=LANGUAGE, options=pb.DecodingOptions(**options)
    )
    together = pb.Translation()
    for message in native.TranslateStream(call, timeout=TIMEOUT):
        assert len(message.top_log_probs) == len(message.token_ids)
        together.text += message.delta
        together.token_ids.extend(message.token_ids)
        together.token_log_probs.extend(message.token_log_probs)
        together.top_log_probs.extend(message.top_log_probs)
    return together


def chat_pairs(entries: Sequence[Any]) -> list[Pairs]:
    return [[(t["token"], t["logprob"]) for t in e["top_logprobs"]] for e in entries]


# --- /v1/completions ---------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 3, 20])
def test_completion_top_logprobs_are_translates(
    count: int,
    client: openai.OpenAI,
    native: pb_grpc.AttnServeStub,
    tokenizers: dict[str, Any],
) -> None:
    want = translate(native, PROMPTS, scored(**GREEDY, top_log_probs=count))
    answer = client.completions.create(
        model="translator", prompt=PROMPTS, temperature=0, logprobs=count, extra_body=EXTRA
    )
    assert len(answer.choices) == len(PROMPTS)
    duplicates = 0
    for choice, translation in zip(answer.choices, want.translations, strict=True):
        assert_native_tops(translation, count, greedy=True)
        assert choice.text == translation.text
        logprobs = choice.logprobs
        assert logprobs is not None and logprobs.tokens is not None
        assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
        assert len(logprobs.top_logprobs) == len(logprobs.tokens) == len(translation.token_ids)
        expected = expected_tops(tokenizers["translator"], translation)
        for position, top in enumerate(logprobs.top_logprobs):
            assert isinstance(top, dict)
            want_pairs = by_text(expected[position])
            duplicates += len(expected[position]) - len(want_pairs)
            assert_pairs(top.items(), want_pairs)
            first_text, first_value = next(iter(top.items()))
            assert first_text == logprobs.tokens[position]
            assert first_value == logprobs.token_logprobs[position]
            values = list(top.values())
            assert values == sorted(values, reverse=True)
            assert 1 <= len(top) <= count
    if count == 20:  # the tiny vocabulary's special tokens all decode to ""
        assert duplicates > 0, "a text written by two tokens should have been seen"


def test_completion_logprobs_zero_has_no_top(url: str) -> None:
    answer = completions(url, completion_body(temperature=0, logprobs=0))
    logprobs = answer["choices"][0]["logprobs"]
    assert logprobs["tokens"] and logprobs["top_logprobs"] is None
    plain = completions(url, completion_body(temperature=0))
    assert plain["choices"][0]["logprobs"] is None
    # an integral float is an integer, as for every integer field of these routes
    three = completions(url, completion_body(temperature=0, logprobs=3.0))
    assert [len(t) for t in three["choices"][0]["logprobs"]["top_logprobs"]] == [3] * len(
        logprobs["tokens"]
    )


def test_completion_prefix_tokens_list_only_themselves(
    url: str, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    prefix = "trois"
    prefix_ids = tokenizers["translator"].encode_target(prefix)
    assert prefix_ids
    want = translate(native, [PROMPTS[1]], scored(**GREEDY, top_log_probs=4), prefixes=[prefix])
    (translation,) = want.translations
    assert list(translation.token_ids[: len(prefix_ids)]) == prefix_ids
    assert len(translation.token_ids) > len(prefix_ids), "a vacuous comparison"
    for position, token in enumerate(prefix_ids):
        top = translation.top_log_probs[position]
        assert (list(top.token_ids), list(top.log_probs)) == ([token], [0.0])
        assert translation.token_log_probs[position] == 0.0
    after = pb.Translation()
    after.CopyFrom(translation)
    del after.token_ids[: len(prefix_ids)], after.token_log_probs[: len(prefix_ids)]
    del after.top_log_probs[: len(prefix_ids)]
    assert_native_tops(after, 4, greedy=True)
    answer = completions(
        url, completion_body(prompt=PROMPTS[1], temperature=0, logprobs=4, prefix=prefix)
    )
    logprobs = answer["choices"][0]["logprobs"]
    tops = logprobs["top_logprobs"]
    assert len(tops) == len(translation.token_ids)
    for position in range(len(prefix_ids)):
        assert tops[position] == {logprobs["tokens"][position]: 0.0}
    expected = expected_tops(tokenizers["translator"], translation)
    for top, pairs in zip(tops, expected, strict=True):
        assert_pairs(top.items(), by_text(pairs))
    body = completion_body(prompt=PROMPTS[1], temperature=0, logprobs=4, prefix=prefix)
    assert stream_completions(url, body)[0]["top_logprobs"] == tops


def test_completion_stream_top_logprobs_add_up_to_the_unary_answer(url: str) -> None:
    body = completion_body(prompt=PROMPTS[:2], temperature=0, logprobs=3)
    unary = completions(url, body)
    streamed = stream_completions(url, body)
    assert sorted(streamed) == [0, 1]
    for choice in unary["choices"]:
        mine = streamed[choice["index"]]
        assert choice["logprobs"]["top_logprobs"], "a vacuous comparison"
        for key in ("tokens", "token_logprobs", "top_logprobs"):
            assert mine[key] == choice["logprobs"][key], key
        # json keeps the dicts' order: most likely first in the stream too
        for got, want in zip(mine["top_logprobs"], choice["logprobs"]["top_logprobs"], strict=True):
            assert list(got) == list(want)


def test_completion_stream_with_a_stop_string(url: str) -> None:
    """Text held back for a stop string: every token still has its top log-probabilities, and
    the stream's are the unary answer's."""
    full = completions(url, completion_body(prompt="hello world", temperature=0))
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert len(stop) == 2 and text.index(stop) > 0, text
    body = completion_body(prompt="hello world", temperature=0, logprobs=2, stop=[stop])
    unary = completions(url, body)
    choice = unary["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == text[: text.index(stop)]
    logprobs = choice["logprobs"]
    assert len(logprobs["top_logprobs"]) == len(logprobs["tokens"]) > 0
    streamed = stream_completions(url, body)[0]
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert streamed[key] == logprobs[key], key
    # the stopped output's are the full output's first ones
    whole = completions(url, completion_body(prompt="hello world", temperature=0, logprobs=2))
    kept = len(logprobs["tokens"])
    assert whole["choices"][0]["logprobs"]["top_logprobs"][:kept] == logprobs["top_logprobs"]


def test_sampled_choices_with_a_stop_string(url: str) -> None:
    """n = 2 samples, a stop string that ends the second one: each choice keeps one entry per
    token, the first ones of its output without the stop string, unary and streamed."""
    sampled = completion_body(prompt=PROMPTS[:1], n=2, seed=13, max_tokens=12, logprobs=2)
    whole = completions(url, sampled)["choices"]
    text = whole[1]["text"]
    assert len(text) >= 4, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    body = {**sampled, "stop": [stop]}
    unary = completions(url, body)["choices"]
    streamed = stream_completions(url, body)
    assert unary[1]["finish_reason"] == "stop" and unary[1]["text"] == text[: text.index(stop)]
    for choice, full in zip(unary, whole, strict=True):
        logprobs = choice["logprobs"]
        kept = len(logprobs["tokens"])
        assert len(logprobs["top_logprobs"]) == len(logprobs["token_logprobs"]) == kept
        assert logprobs["top_logprobs"] == full["logprobs"]["top_logprobs"][:kept]
        assert streamed[choice["index"]]["top_logprobs"] == logprobs["top_logprobs"]
    assert len(unary[1]["logprobs"]["tokens"]) < len(whole[1]["logprobs"]["tokens"])


def test_sampled_choices_are_the_native_samples(
    url: str, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    """n = 2 with a seed: each choice's top log-probabilities are those of the native call's
    output and alternative (the same seeds), in the unary answer and the stream."""
    options = {"temperature": 1.0, "seed": 11, "max_new_tokens": 6, "no_repeat_ngram_size": 1}
    want = translate(native, PROMPTS[:2], scored(**options, num_alternatives=1, top_log_probs=3))
    expected = outputs(want)
    assert len(expected) == 4
    body = completion_body(prompt=PROMPTS[:2], n=2, seed=11, max_tokens=6, logprobs=3)
    answer = completions(url, body)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    for choice, output in zip(answer["choices"], expected, strict=True):
        assert_native_tops(output, 3, greedy=False)
        assert choice["text"] == output.text
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"] == pytest.approx(list(output.token_log_probs))
        pairs = expected_tops(tokenizers["translator"], output)
        assert len(logprobs["top_logprobs"]) == len(pairs) == len(output.token_ids)
        for top, want_pairs in zip(logprobs["top_logprobs"], pairs, strict=True):
            assert_pairs(top.items(), by_text(want_pairs))
    assert len({c["text"] for c in answer["choices"]}) > 1, "sampled choices should differ"
    streamed = stream_completions(url, body)
    for choice in answer["choices"]:
        assert streamed[choice["index"]]["top_logprobs"] == choice["logprobs"]["top_logprobs"]


def test_top_logprobs_are_before_temperature_top_k_and_top_p(
    url: str, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    """The listed values are the distribution before the sampling filters: a sample's first
    position (and every position up to where it leaves the greedy output) lists what the greedy
    output's does, and a seeded sample lists what the native call with that seed does."""
    filters = {"temperature": 0.7, "top_k": 4, "top_p": 0.9, "seed": 5}
    greedy = completions(url, completion_body(temperature=0, logprobs=5, max_tokens=8))
    sampled = completions(url, completion_body(logprobs=5, max_tokens=8, **filters))
    greedy_lp = greedy["choices"][0]["logprobs"]
    sampled_lp = sampled["choices"][0]["logprobs"]
    shared = 0
    while (
        shared < min(len(greedy_lp["tokens"]), len(sampled_lp["tokens"]))
        and greedy_lp["tokens"][shared] == sampled_lp["tokens"][shared]
    ):
        shared += 1
    assert shared < len(sampled_lp["tokens"]), "the sample should leave the greedy output"
    upto = shared + 1  # the position where it leaves lists the same tokens too
    assert sampled_lp["top_logprobs"][:upto] == greedy_lp["top_logprobs"][:upto]
    for token, value, top in zip(
        sampled_lp["tokens"], sampled_lp["token_logprobs"], sampled_lp["top_logprobs"], strict=True
    ):
        assert token in list(top)[:4], "top_k 4 keeps the four most likely tokens"
        assert top[token] == value
    options = scored(**filters, max_new_tokens=8, no_repeat_ngram_size=1, top_log_probs=5)
    (translation,) = translate(native, [PROMPTS[0]], options).translations
    assert_native_tops(translation, 5, greedy=False)
    assert sampled["choices"][0]["text"] == translation.text
    expected = expected_tops(tokenizers["translator"], translation)
    assert len(sampled_lp["top_logprobs"]) == len(expected)
    for top, pairs in zip(sampled_lp["top_logprobs"], expected, strict=True):
        assert_pairs(top.items(), by_text(pairs))
    streamed = native_stream(native, PROMPTS[0], options)
    assert list(streamed.token_ids) == list(translation.token_ids)
    assert list(streamed.top_log_probs) == list(translation.top_log_probs)


# --- /v1/chat/completions ----------------------------------------------------------------------
def test_chat_top_logprobs_are_translates(
    client: openai.OpenAI, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    want = translate(native, [PROMPTS[1]], scored(**GREEDY, top_log_probs=5))
    (translation,) = want.translations
    assert_native_tops(translation, 5, greedy=True)
    answer = client.chat.completions.create(
        model="translator",
        messages=[{"role": "user", "content": PROMPTS[1]}],
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body=EXTRA,
    )
    (choice,) = answer.choices
    assert choice.message.content == translation.text
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    expected = expected_tops(tokenizers["translator"], translation)
    assert len(entries) == len(expected) == len(translation.token_ids) > 0
    for entry, pairs in zip(entries, expected, strict=True):
        assert len(entry.top_logprobs) == 5  # every token listed, even with equal texts
        assert_pairs(((t.token, t.logprob) for t in entry.top_logprobs), pairs)
        assert all(t.bytes == list(t.token.encode()) for t in entry.top_logprobs)
        first = entry.top_logprobs[0]
        assert (first.token, first.logprob, first.bytes) == (
            entry.token,
            entry.logprob,
            entry.bytes,
        )
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)


def test_chat_top_logprobs_zero(url: str) -> None:
    answer = chats(url, chat_body(temperature=0, logprobs=True, top_logprobs=0))
    entries = answer["choices"][0]["logprobs"]["content"]
    assert entries and all(entry["top_logprobs"] == [] for entry in entries)
    without = chats(url, chat_body(temperature=0, top_logprobs=0))
    assert without["choices"][0]["logprobs"] is None
    off = chats(url, chat_body(temperature=0, logprobs=False, top_logprobs=0))
    assert off["choices"][0]["logprobs"] is None


def test_chat_streams_add_up_to_the_unary_answer(url: str) -> None:
    greedy = chat_body(temperature=0, logprobs=True, top_logprobs=4)
    unary = chats(url, greedy)["choices"][0]["logprobs"]["content"]
    assert unary and all(len(e["top_logprobs"]) == 4 for e in unary)
    assert stream_chat(url, greedy) == {0: unary}
    sampled = chat_body(n=2, seed=3, max_tokens=6, logprobs=True, top_logprobs=2)
    choices = chats(url, sampled)["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    streamed = stream_chat(url, sampled)
    for choice in choices:
        content = choice["logprobs"]["content"]
        assert content and all(len(e["top_logprobs"]) == 2 for e in content)
        assert streamed[choice["index"]] == content


def test_chat_sample_is_the_native_stream(
    url: str, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    """A seeded chat sample lists what TranslateStream with that seed lists."""
    options = {"temperature": 0.9, "seed": 8, "max_new_tokens": 7, "no_repeat_ngram_size": 1}
    want = native_stream(native, PROMPTS[2], scored(**options, top_log_probs=3))
    assert_native_tops(want, 3, greedy=False)
    answer = chats(
        url,
        chat_body(PROMPTS[2], temperature=0.9, seed=8, max_tokens=7, logprobs=True, top_logprobs=3),
    )
    choice = answer["choices"][0]
    assert choice["message"]["content"] == want.text
    content = choice["logprobs"]["content"]
    expected = expected_tops(tokenizers["translator"], want)
    assert len(content) == len(expected) > 0
    for entry, pairs in zip(content, expected, strict=True):
        assert_pairs(chat_pairs([entry])[0], pairs)


def test_chat_caption_top_logprobs(
    client: openai.OpenAI, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    options = {"temperature": 0.0, "no_repeat_ngram_size": 1, "max_new_tokens": 8}
    want = native.Caption(
        pb.CaptionRequest(
            image=IMAGE, options=pb.DecodingOptions(**scored(**options, top_log_probs=3))
        ),
        timeout=TIMEOUT,
    )
    assert want.text
    assert_native_tops(want, 3, greedy=True)
    answer = client.chat.completions.create(
        model="captioner",
        messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}
        ],
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
        extra_body={"no_repeat_ngram_size": 1},
    )
    (choice,) = answer.choices
    assert choice.message.content == want.text
    assert choice.logprobs is not None and choice.logprobs.content is not None
    expected = expected_tops(tokenizers["captioner"], want)
    assert len(choice.logprobs.content) == len(expected)
    for entry, pairs in zip(choice.logprobs.content, expected, strict=True):
        assert_pairs(((t.token, t.logprob) for t in entry.top_logprobs), pairs)


# --- refusals ----------------------------------------------------------------------------------
REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    ("chat without logprobs", "chat/completions", chat_body(top_logprobs=2), '"top_logprobs"'),
    (
        "chat logprobs false",
        "chat/completions",
        chat_body(logprobs=False, top_logprobs=2),
        '"top_logprobs"',
    ),
    (
        "chat stream without logprobs",
        "chat/completions",
        chat_body(top_logprobs=2, stream=True),
        '"top_logprobs"',
    ),
    ("chat 21", "chat/completions", chat_body(logprobs=True, top_logprobs=21), '"top_logprobs"'),
    ("chat -1", "chat/completions", chat_body(logprobs=True, top_logprobs=-1), '"top_logprobs"'),
    ("completions 21", "completions", completion_body(logprobs=21), '"logprobs"'),
    ("completions -1", "completions", completion_body(logprobs=-1), '"logprobs"'),
    ("completions string", "completions", completion_body(logprobs="3"), '"logprobs"'),
    ("completions bool", "completions", completion_body(logprobs=True), '"logprobs"'),
    ("completions float", "completions", completion_body(logprobs=2.5), '"logprobs"'),
    (
        "chat string",
        "chat/completions",
        chat_body(logprobs=True, top_logprobs="2"),
        '"top_logprobs"',
    ),
    (
        "chat bool",
        "chat/completions",
        chat_body(logprobs=True, top_logprobs=True),
        '"top_logprobs"',
    ),
    (
        "chat float",
        "chat/completions",
        chat_body(logprobs=True, top_logprobs=1.5),
        '"top_logprobs"',
    ),
    (
        "chat logprobs string",
        "chat/completions",
        chat_body(logprobs="true", top_logprobs=2),
        '"logprobs"',
    ),
    (
        "chat logprobs number",
        "chat/completions",
        chat_body(logprobs=1, top_logprobs=2),
        '"logprobs"',
    ),
]


@pytest.mark.parametrize(
    ("route", "body", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refusals(route: str, body: dict[str, Any], words: str, url: str) -> None:
    answer = request(f"{url}/v1/{route}", body)
    assert_openai_error(answer, 400, "INVALID_ARGUMENT", words)


def test_beams_carry_their_top_logprobs(
    url: str, native: pb_grpc.AttnServeStub, tokenizers: dict[str, Any]
) -> None:
    """n = 2 of 2 beams: each choice's top log-probabilities are its hypothesis's (the gRPC
    answer's best output and its runner-up)."""
    body = completion_body(temperature=0, logprobs=3, beam_size=2, n=2)
    answer = completions(url, body)
    grpc_answer = translate(
        native,
        [PROMPTS[0]],
        {
            **GREEDY,
            "beam_size": 2,
            "num_alternatives": 1,
            "return_log_probs": True,
            "top_log_probs": 3,
        },
    )
    tokenizer = tokenizers["translator"]
    for choice, output in zip(answer["choices"], outputs(grpc_answer), strict=True):
        expected = [dict(by_text(pairs)) for pairs in expected_tops(tokenizer, output)]
        served = choice["logprobs"]["top_logprobs"]
        assert [list(top) for top in served] == [list(top) for top in expected]
        for top, want in zip(served, expected, strict=True):
            assert top == pytest.approx(want, abs=TOLERANCE)
    chat = chats(url, chat_body(temperature=0, logprobs=True, top_logprobs=3, beam_size=2))
    content = chat["choices"][0]["logprobs"]["content"]
    assert [len(e["top_logprobs"]) for e in content] == [3] * len(content)


def test_refusals_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="translator",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            top_logprobs=3,
            extra_body=EXTRA,
        )
    assert refused.value.status_code == 400 and refused.value.code == "INVALID_ARGUMENT"
    assert "top_logprobs" in refused.value.message
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(
            model="translator", prompt=PROMPTS[0], logprobs=21, extra_body=EXTRA
        )
    assert "logprobs" in too_many.value.message


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"top_log_probs": 2}, "return_log_probs"),
        ({"return_log_probs": True, "top_log_probs": 21}, "0..20"),
        ({"return_log_probs": True, "top_log_probs": -1}, "0..20"),
    ],
    ids=["without log probs", "21", "negative"],
)
def test_native_refusals(
    options: dict[str, Any], words: str, native: pb_grpc.AttnServeStub
) -> None:
    """The gRPC API's INVALID_ARGUMENT for the same four cases, unary and streamed."""
    with pytest.raises(grpc.RpcError) as refused:
        translate(native, [PROMPTS[0]], options)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_log_probs" in refused.value.details() and words in refused.value.details()
    with pytest.raises(grpc.RpcError) as streamed:
        native_stream(native, PROMPTS[0], options)
    assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_log_probs" in streamed.value.details()


def test_answer_is_json_with_the_dicts_in_order(url: str) -> None:
    """The completions' ``top_logprobs`` dicts keep the most likely first in the JSON text."""
    answer: Answer = request(f"{url}/v1/completions", completion_body(temperature=0, logprobs=5))
    document = json.loads(answer.body, object_pairs_hook=list)
    choices = dict(document)["choices"]
    logprobs = dict(dict(choices[0])["logprobs"])
    for pairs in logprobs["top_logprobs"]:
        values = [value for _, value in pairs]
        assert values == sorted(values, reverse=True)
        assert len({text for text, _ in pairs}) == len(pairs)
