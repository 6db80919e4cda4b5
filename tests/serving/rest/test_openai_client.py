"""The OpenAI-compatible routes (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``)
through the official ``openai`` client and plain HTTP, on this package's real server.

The tiny models have random weights, so every answer is checked against the attnserve gRPC API's
answer for the same input on the same server (greedy on both sides, or the same seed): texts,
token log-probabilities, finish reasons, choice indices and token counts; streams against the
unary answer and the native streams. Greedy requests use ``no_repeat_ngram_size`` 1, which makes
the tiny translator write varied tokens and end with EOS (plain greedy repeats one empty token).
Also: every refusal is a 400 in OpenAI's error shape naming the field, routes and methods that
do not exist, concurrent calls from ``AsyncOpenAI``, a client hanging up mid-stream (its engine
rows are freed and the streams counted CANCELLED), bearer tokens, and the metrics' counts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import grpc
import numpy as np
import openai
import pytest
from PIL import Image

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.serving.rest.conftest import TOKEN, Answer, request, requests_total
from tests.serving.server_thread import ServerThread

TIMEOUT = 30
LANGUAGE = "fr"
PROMPTS = ["three hundred and twelve", "doce", "a small red circle"]
# greedy decoding that writes varied tokens and ends with EOS on the tiny translator
GREEDY: dict[str, Any] = {"temperature": 0.0, "no_repeat_ngram_size": 1}
EXTRA: dict[str, Any] = {"target_language": LANGUAGE, "no_repeat_ngram_size": 1}
FINISH: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop",
    pb.FINISH_REASON_LENGTH: "length",
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
}


def png(seed: int = 1) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


IMAGE = png()
DATA_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
IMAGE_PART = {"type": "image_url", "image_url": {"url": DATA_URL}}


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT
    ) as made:
        yield made


@pytest.fixture(scope="module")
def native(server: ServerThread) -> Iterator[pb_grpc.AttnServeStub]:
    """The attnserve gRPC API of the same server (the reference answers)."""
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


# --- reference answers -------------------------------------------------------------------------
def translate(
    native: pb_grpc.AttnServeStub,
    texts: Iterable[str],
    options: dict[str, Any],
    language: str = LANGUAGE,
    prefixes: Iterable[str] = (),
) -> pb.TranslateResponse:
    call = pb.TranslateRequest(
        texts=list(texts),
        target_language=language,
        options=pb.DecodingOptions(**options),
        target_prefixes=list(prefixes),
    )
    return native.Translate(call, timeout=TIMEOUT)


@dataclass
class Streamed:
    """A native stream's messages put together."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: int = 0
    input_tokens: int = 0


def collect(messages: Iterable[Any]) -> Streamed:
    streamed = Streamed()
    for message in messages:
        streamed.text += message.delta
        streamed.token_ids += message.token_ids
        if message.finish_reason:
            streamed.finish_reason = message.finish_reason
            streamed.input_tokens = message.usage.input_tokens
    return streamed


def translate_stream(native: pb_grpc.AttnServeStub, text: str, options: dict[str, Any]) -> Streamed:
    call = pb.TranslateStreamRequest(
        text=text, target_language=LANGUAGE, options=pb.DecodingOptions(**options)
    )
    return collect(native.TranslateStream(call, timeout=TIMEOUT))


def outputs(answer: pb.TranslateResponse) -> list[Any]:
    """Every output of a Translate answer, in OpenAI's choice order (each text's best output,
    then its alternatives)."""
    return [o for t in answer.translations for o in (t, *t.alternatives)]


# --- HTTP helpers ------------------------------------------------------------------------------
def sse(answer: Answer) -> list[dict[str, Any]]:
    """The chunks of a server-sent events answer, which must end with ``data: [DONE]``."""
    assert answer.status == 200, answer.body
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = answer.body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    assert all(event.startswith("data: ") for event in events[:-2])
    return [json.loads(event.removeprefix("data: ")) for event in events[:-2]]


def assert_openai_error(answer: Answer, status: int, code: str | None, *words: str) -> str:
    """``answer`` is OpenAI's error object with this status, gRPC code name and words."""
    assert answer.status == status, answer.body
    assert answer.headers["content-type"].startswith("application/json")
    document = answer.json()
    assert list(document) == ["error"], document
    error = document["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == ERROR_TYPES[status]
    assert error["code"] == code
    assert isinstance(error["message"], str)
    for word in words:
        assert word in error["message"], error["message"]
    return error["message"]


def slow_steps(monkeypatch: pytest.MonkeyPatch, cache: Any, seconds: float) -> None:
    """Each decoder step takes ``seconds`` more: a stream gets a message per token, and the tiny
    translator's 32 tokens take longer than a test needs to hang up."""
    for name in ("step", "step_greedy", "step_block"):
        original = getattr(cache, name, None)
        if original is None:
            continue

        def slowed(*args: Any, original: Any = original, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return original(*args, **kwargs)

        monkeypatch.setattr(cache, name, slowed)


# --- /v1/models --------------------------------------------------------------------------------
def test_models_lists_the_generators(client: openai.OpenAI, server: ServerThread, url: str) -> None:
    assert server.running is not None
    assert "vit" in server.running.repository.names()  # served, but not a generator
    listed = client.models.list()
    assert sorted(model.id for model in listed.data) == ["captioner", "translator"]
    raw = request(f"{url}/v1/models")
    assert raw.status == 200
    document = raw.json()
    assert document["object"] == "list"
    cards = {card["id"]: card for card in document["data"]}
    for name, card in cards.items():
        assert card["object"] == "model"
        assert card["owned_by"] == "attnserve"
        assert isinstance(card["created"], int) and card["created"] > 0
        assert request(f"{url}/v1/models/{name}").json() == card
    one = client.models.retrieve("translator")
    card = cards["translator"]
    assert (one.id, one.object, one.created, one.owned_by) == (
        card["id"],
        card["object"],
        card["created"],
        card["owned_by"],
    )


def test_unknown_model_and_classifier(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("nope")
    assert missing.value.status_code == 404
    assert isinstance(missing.value.body, dict) and missing.value.body["code"] == "NOT_FOUND"
    assert_openai_error(request(f"{url}/v1/models/nope"), 404, "NOT_FOUND", "'nope'")
    assert_openai_error(
        request(f"{url}/v1/models/vit"), 400, "INVALID_ARGUMENT", "'vit'", "translator"
    )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="three", extra_body=EXTRA)


# --- completions -------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS], ids=["one", "three"])
def test_completions_are_translate(
    prompt: str | list[str], client: openai.OpenAI, native: pb_grpc.AttnServeStub
) -> None:
    texts = [prompt] if isinstance(prompt, str) else prompt
    want = translate(native, texts, {**GREEDY, "return_log_probs": True})
    assert any(t.text for t in want.translations), "a vacuous comparison"
    answer = client.completions.create(
        model="translator", prompt=prompt, temperature=0, logprobs=0, extra_body=EXTRA
    )
    assert answer.object == "text_completion" and answer.model == "translator"
    assert answer.id.startswith("cmpl-")
    assert [choice.index for choice in answer.choices] == list(range(len(texts)))
    for choice, translation in zip(answer.choices, want.translations, strict=True):
        assert choice.text == translation.text
        assert choice.finish_reason == FINISH[translation.finish_reason]
        logprobs = choice.logprobs
        assert logprobs is not None and logprobs.tokens is not None
        assert logprobs.token_logprobs == list(translation.token_log_probs)
        assert len(logprobs.tokens) == len(translation.token_ids)
        assert "".join(logprobs.tokens) == choice.text
        lengths = [len(token) for token in logprobs.tokens]
        assert logprobs.text_offset == [0, *accumulate(lengths)][:-1]
        assert logprobs.top_logprobs is None
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == want.usage.input_tokens
    completion = sum(len(t.token_ids) for t in want.translations)
    assert answer.usage.completion_tokens == completion
    assert answer.usage.total_tokens == want.usage.input_tokens + completion
    plain = client.completions.create(
        model="translator", prompt=prompt, temperature=0, extra_body=EXTRA
    )
    assert [c.text for c in plain.choices] == [t.text for t in want.translations]
    assert all(c.logprobs is None for c in plain.choices)


def test_eos_stop_and_length(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    full = translate(native, [PROMPTS[0]], GREEDY).translations[0]
    assert full.finish_reason == pb.FINISH_REASON_STOP  # EOS
    answer = client.completions.create(
        model="translator", prompt=PROMPTS[0], temperature=0, extra_body=EXTRA
    )
    assert answer.choices[0].finish_reason == "stop"
    one = client.completions.create(
        model="translator", prompt=PROMPTS[0], temperature=0, max_tokens=1, extra_body=EXTRA
    )
    assert one.choices[0].finish_reason == "length"
    assert one.usage is not None and one.usage.completion_tokens == 1
    short = translate(native, [PROMPTS[0]], {**GREEDY, "max_new_tokens": 1}).translations[0]
    assert one.choices[0].text == short.text


def test_stop_strings(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    full = translate(native, ["hello world"], GREEDY).translations[0].text
    middle = len(full) // 2
    stop = full[middle : middle + 2]
    assert len(stop) == 2 and full.index(stop) > 0, full
    answer = client.completions.create(
        model="translator",
        prompt="hello world",
        temperature=0,
        stop=["zzz", stop],
        extra_body=EXTRA,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == full[: full.index(stop)]
    want = translate(native, ["hello world"], {**GREEDY, "stop": ["zzz", stop]}).translations[0]
    assert want.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert choice.text == want.text
    assert answer.usage is not None and answer.usage.completion_tokens == len(want.token_ids)


def test_echo(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    want = translate(native, PROMPTS[:2], GREEDY)
    answer = client.completions.create(
        model="translator", prompt=PROMPTS[:2], temperature=0, echo=True, extra_body=EXTRA
    )
    assert [c.text for c in answer.choices] == [
        prompt + t.text for prompt, t in zip(PROMPTS[:2], want.translations, strict=True)
    ]
    assert answer.usage is not None
    assert answer.usage.completion_tokens == sum(len(t.token_ids) for t in want.translations)


def test_n_sampled_choices_are_alternatives(
    client: openai.OpenAI, native: pb_grpc.AttnServeStub
) -> None:
    """No temperature: OpenAI's default 1.0, sampling; n = 3 with a seed are the native call's
    output and two alternatives (seeds s, s + 1, s + 2)."""
    prompts = PROMPTS[:2]
    answer = client.completions.create(
        model="translator",
        prompt=prompts,
        n=3,
        seed=11,
        max_tokens=6,
        extra_body={"target_language": LANGUAGE},
    )
    want = translate(
        native,
        prompts,
        {"temperature": 1.0, "seed": 11, "num_alternatives": 2, "max_new_tokens": 6},
    )
    expected = outputs(want)
    assert [c.index for c in answer.choices] == list(range(6))  # prompt * n + j
    assert [c.text for c in answer.choices] == [o.text for o in expected]
    assert [c.finish_reason for c in answer.choices] == [FINISH[o.finish_reason] for o in expected]
    assert len({c.text for c in answer.choices}) > 1, "sampled choices should differ"
    greedy = translate(native, prompts, {"temperature": 0.0, "max_new_tokens": 6})
    assert [c.text for c in answer.choices[::3]] != [t.text for t in greedy.translations]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == want.usage.input_tokens
    # every choice's tokens, not only the best outputs' (the native usage.output_tokens)
    assert answer.usage.completion_tokens == sum(len(o.token_ids) for o in expected)
    assert answer.usage.completion_tokens > want.usage.output_tokens


def test_n_beams(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    answer = client.completions.create(
        model="translator",
        prompt=PROMPTS[0],
        n=2,
        temperature=0,
        max_tokens=6,
        extra_body={"target_language": LANGUAGE, "beam_size": 3, "length_penalty": 0.5},
    )
    want = translate(
        native,
        [PROMPTS[0]],
        {
            "beam_size": 3,
            "num_alternatives": 1,
            "length_penalty": 0.5,
            "temperature": 0.0,
            "max_new_tokens": 6,
        },
    )
    assert [(c.index, c.text) for c in answer.choices] == list(
        enumerate(o.text for o in outputs(want))
    )


def test_extensions_reach_the_model(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    """top_p, top_k, min_tokens, repetition_penalty, bad_words, prefix and priority are the
    native options of the same name (a seeded sample on both sides)."""
    plain = translate(native, [PROMPTS[1]], {"temperature": 1.0, "seed": 3, "max_new_tokens": 8})
    word = plain.translations[0].text.split()[0]
    extensions = {
        "top_k": 20,
        "min_tokens": 8,
        "repetition_penalty": 1.3,
        "bad_words": [word],
        "priority": 1,
        "prefix": "trois",
    }
    answer = client.completions.create(
        model="translator",
        prompt=PROMPTS[1],
        seed=3,
        top_p=0.95,
        max_tokens=10,
        extra_body={"target_language": LANGUAGE, **extensions},
    )
    options = {
        "temperature": 1.0,
        "seed": 3,
        "top_p": 0.95,
        "top_k": 20,
        "min_new_tokens": 8,
        "max_new_tokens": 10,
        "repetition_penalty": 1.3,
        "bad_words": [word],
    }
    want = translate(native, [PROMPTS[1]], options, prefixes=["trois"]).translations[0]
    text = answer.choices[0].text
    assert text == want.text and text.startswith("trois")
    assert answer.choices[0].text != plain.translations[0].text


# --- streams -----------------------------------------------------------------------------------
def test_completion_stream_adds_up_to_the_unary_answer(url: str) -> None:
    body = {
        "model": "translator",
        "prompt": PROMPTS[:2],
        "temperature": 0,
        "logprobs": 0,
        **EXTRA,
    }
    unary = request(f"{url}/v1/completions", body).json()
    chunks = sse(
        request(
            f"{url}/v1/completions",
            {**body, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    *chunks, last = chunks
    assert last["choices"] == [] and last["usage"] == unary["usage"]
    assert {chunk["id"] for chunk in [*chunks, last]} == {chunks[0]["id"]}
    assert chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
    for index, want in enumerate(unary["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == want["text"]
        finishes = [c["finish_reason"] for c in mine]
        assert finishes == [None] * (len(mine) - 1) + [want["finish_reason"]]
        logprobs = [c["logprobs"] for c in mine if c["logprobs"] is not None]
        for key in ("tokens", "token_logprobs", "text_offset"):
            assert [v for lp in logprobs for v in lp[key]] == want["logprobs"][key], key


def test_stream_text_offsets_while_text_is_held_back(
    url: str, server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop string that starts like the output but never completes: the stream holds its
    possible start back (empty text chunks), and its tokens' text_offset must still be where
    they are in the text, as the unary answer says."""
    body = {"model": "translator", "prompt": "hello world", "temperature": 0, "logprobs": 0}
    body |= EXTRA
    full = request(f"{url}/v1/completions", body).json()["choices"][0]
    tokens = full["logprobs"]["tokens"]
    assert len(tokens) >= 4 and tokens[1] and tokens[2], tokens
    stop = tokens[1] + tokens[2] + "\u2603"  # begins at a token, never completes
    unary = request(f"{url}/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
    assert unary["text"] == full["text"] and unary["logprobs"] == full["logprobs"]
    assert server.running is not None
    model: Any = server.running.repository.get("translator")
    slow_steps(monkeypatch, model.engine.cache, 0.05)  # a chunk per token
    chunks = sse(request(f"{url}/v1/completions", {**body, "stop": [stop], "stream": True}))
    choices = [chunk["choices"][0] for chunk in chunks]
    assert "".join(choice["text"] for choice in choices) == unary["text"]
    if not any(c["text"] == "" and c["logprobs"] for c in choices):
        pytest.skip("the stream's messages came several tokens at once: nothing was held back")
    logprobs = [choice["logprobs"] for choice in choices if choice["logprobs"]]
    assert [t for lp in logprobs for t in lp["tokens"]] == unary["logprobs"]["tokens"]
    offsets = [offset for lp in logprobs for offset in lp["text_offset"]]
    assert offsets == unary["logprobs"]["text_offset"]


def test_completion_stream_echo(client: openai.OpenAI) -> None:
    unary = client.completions.create(
        model="translator", prompt=PROMPTS[2], temperature=0, echo=True, extra_body=EXTRA
    )
    stream = client.completions.create(
        model="translator",
        prompt=PROMPTS[2],
        temperature=0,
        echo=True,
        stream=True,
        extra_body=EXTRA,
    )
    texts = [chunk.choices[0].text for chunk in stream]
    assert texts[0].startswith(PROMPTS[2])
    assert "".join(texts) == unary.choices[0].text


def test_stream_choices_are_seeded_streams(
    client: openai.OpenAI, native: pb_grpc.AttnServeStub
) -> None:
    """Two prompts, n = 2, seed s: choice p * 2 + j is prompt p's native stream with seed s + j
    (and the unary answer's choice of that index)."""
    extra = {"target_language": LANGUAGE}
    stream = client.completions.create(
        model="translator",
        prompt=PROMPTS[:2],
        n=2,
        seed=21,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    *chunks, last = list(stream)
    texts: dict[int, str] = {}
    finishes: dict[int, list[str | None]] = {}
    for chunk in chunks:
        (choice,) = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(texts) == [0, 1, 2, 3]
    prompt_tokens = completion_tokens = 0
    for p, prompt in enumerate(PROMPTS[:2]):
        for j in range(2):
            options = {"temperature": 1.0, "seed": 21 + j, "max_new_tokens": 6}
            want = translate_stream(native, prompt, options)
            assert texts[p * 2 + j] == want.text, (p, j)
            assert finishes[p * 2 + j][-1] == FINISH[want.finish_reason]
            assert finishes[p * 2 + j][:-1] == [None] * (len(finishes[p * 2 + j]) - 1)
            prompt_tokens += want.input_tokens if j == 0 else 0
            completion_tokens += len(want.token_ids)
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        prompt_tokens,
        completion_tokens,
    )
    unary = client.completions.create(
        model="translator", prompt=PROMPTS[:2], n=2, seed=21, max_tokens=6, extra_body=extra
    )
    assert [c.text for c in unary.choices] == [texts[i] for i in range(4)]
    assert last.usage == unary.usage


def test_chat_stream_starts_with_the_role(url: str) -> None:
    body = {
        "model": "translator",
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "temperature": 0,
        **EXTRA,
    }
    unary = request(f"{url}/v1/chat/completions", body).json()
    events = sse(
        request(
            f"{url}/v1/chat/completions",
            {**body, "stream": True, "stream_options": {"include_usage": True}},
        )
    )
    *chunks, last = events
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in events)
    assert chunks[0]["id"].startswith("chatcmpl-")
    choices = [chunk["choices"][0] for chunk in chunks]
    assert all(choice["index"] == 0 for choice in choices)
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in choice["delta"] for choice in choices[1:])
    content = "".join(choice["delta"].get("content", "") for choice in choices)
    assert content == unary["choices"][0]["message"]["content"] != ""
    finish = unary["choices"][0]["finish_reason"]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + [finish]
    assert last["choices"] == [] and last["usage"] == unary["usage"]


# --- chat --------------------------------------------------------------------------------------
def test_chat_translates_the_user_message(
    client: openai.OpenAI, native: pb_grpc.AttnServeStub
) -> None:
    want = translate(native, [PROMPTS[0]], {**GREEDY, "return_log_probs": True})
    (translation,) = want.translations
    answer = client.chat.completions.create(
        model="translator",
        messages=[{"role": "user", "content": PROMPTS[0]}],
        temperature=0,
        logprobs=True,
        extra_body=EXTRA,
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    (choice,) = answer.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == translation.text != ""
    assert choice.finish_reason == FINISH[translation.finish_reason]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert [e.logprob for e in entries] == list(translation.token_log_probs)
    assert "".join(e.token for e in entries) == translation.text
    assert all(e.bytes == list(e.token.encode()) and e.top_logprobs == [] for e in entries)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == want.usage.input_tokens
    assert answer.usage.completion_tokens == len(translation.token_ids)
    parts = client.chat.completions.create(
        model="translator",
        messages=[{"role": "user", "content": [{"type": "text", "text": PROMPTS[0]}]}],
        temperature=0,
        extra_body=EXTRA,
    )
    assert parts.choices[0].message.content == translation.text
    assert parts.choices[0].logprobs is None
    two = client.chat.completions.create(
        model="translator",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "three"}, {"type": "text", "text": "doce"}],
            }
        ],
        temperature=0,
        extra_body=EXTRA,
    )
    joined = translate(native, ["three\ndoce"], GREEDY).translations[0].text
    assert two.choices[0].message.content == joined


def test_chat_max_completion_tokens(client: openai.OpenAI) -> None:
    def completion_tokens(**limits: int) -> tuple[int, str]:
        answer = client.chat.completions.create(
            model="translator",
            messages=[{"role": "user", "content": PROMPTS[1]}],
            temperature=0,
            extra_body={**EXTRA, **limits},
        )
        assert answer.usage is not None
        return answer.usage.completion_tokens, answer.choices[0].finish_reason

    assert completion_tokens(max_completion_tokens=2) == (2, "length")
    assert completion_tokens(max_tokens=3) == (3, "length")
    assert completion_tokens(max_completion_tokens=1, max_tokens=3) == (1, "length")


def test_chat_captions_an_image(client: openai.OpenAI, native: pb_grpc.AttnServeStub) -> None:
    greedy: dict[str, Any] = {"temperature": 0.0, "no_repeat_ngram_size": 1, "max_new_tokens": 8}
    want = native.Caption(
        pb.CaptionRequest(image=IMAGE, options=pb.DecodingOptions(**greedy)), timeout=TIMEOUT
    )
    assert want.text
    messages: Any = [{"role": "user", "content": [IMAGE_PART]}]
    extra = {"no_repeat_ngram_size": 1}
    answer = client.chat.completions.create(
        model="captioner", messages=messages, temperature=0, max_tokens=8, extra_body=extra
    )
    (choice,) = answer.choices
    assert choice.message.content == want.text
    assert choice.finish_reason == FINISH[want.finish_reason]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == want.usage.input_tokens
    assert answer.usage.completion_tokens == len(want.token_ids)
    prefixed = native.Caption(
        pb.CaptionRequest(image=IMAGE, options=pb.DecodingOptions(**greedy), prefix="a small"),
        timeout=TIMEOUT,
    )
    with_prefix = client.chat.completions.create(
        model="captioner",
        messages=messages,
        temperature=0,
        max_tokens=8,
        extra_body={**extra, "prefix": "a small"},
    )
    content = with_prefix.choices[0].message.content
    assert content == prefixed.text and content is not None and content.startswith("a small")
    stream = client.chat.completions.create(
        model="captioner",
        messages=messages,
        temperature=0,
        max_tokens=8,
        stream=True,
        extra_body=extra,
    )
    deltas = [chunk.choices[0].delta for chunk in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == want.text


# --- refusals ----------------------------------------------------------------------------------
def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "translator", "prompt": "three", "target_language": LANGUAGE, **fields}


def chat(content: Any = "three", model: str = "translator", **fields: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **fields}
    if model == "translator":
        body.setdefault("target_language", LANGUAGE)
    return body


REFUSED: list[tuple[str, str, Any, str]] = [
    ("unknown field", "completions", completion(foo=1), "'foo'"),
    ("presence penalty", "completions", completion(presence_penalty=0.5), '"presence_penalty"'),
    ("frequency penalty", "completions", completion(frequency_penalty=1), '"frequency_penalty"'),
    ("logit bias", "completions", completion(logit_bias={"5": 10}), '"logit_bias"'),
    ("suffix", "completions", completion(suffix="!"), '"suffix"'),
    ("too many top logprobs", "completions", completion(logprobs=21), '"logprobs"'),
    ("echo with logprobs", "completions", completion(echo=True, logprobs=0), '"echo"'),
    ("greedy n", "completions", completion(n=2, temperature=0), '"n"'),
    ("best_of", "completions", completion(n=1, best_of=2), '"best_of"'),
    ("token ids", "completions", completion(prompt=[[1, 2]]), '"prompt"'),
    ("no prompt", "completions", completion(prompt=None), '"prompt"'),
    ("empty prompts", "completions", completion(prompt=[]), '"prompt"'),
    ("stream options", "completions", completion(stream_options={}), '"stream_options"'),
    ("temperature", "completions", completion(temperature=3), '"temperature"'),
    ("top_p 0", "completions", completion(top_p=0), '"top_p"'),
    ("n 0", "completions", completion(n=0), '"n"'),
    ("stream beams", "completions", completion(stream=True, beam_size=2), '"beam_size"'),
    ("captioner", "completions", completion(model="captioner"), "image_url"),
    ("classifier", "completions", completion(model="vit"), "'vit'"),
    ("no language", "completions", completion(target_language=None), '"target_language"'),
    ("bad language", "completions", completion(target_language="xx"), "xx"),
    ("no model", "completions", completion(model=None), '"model"'),
    ("chat unknown field", "chat/completions", chat(echo=True), "'echo'"),
    ("tools", "chat/completions", chat(tools=[{"type": "function"}]), '"tools"'),
    ("top_logprobs alone", "chat/completions", chat(top_logprobs=2), '"top_logprobs"'),
    ("json format", "chat/completions", chat(response_format={"type": "json_object"}), "format"),
    ("no messages", "chat/completions", chat() | {"messages": []}, '"messages"'),
    (
        "two messages",
        "chat/completions",
        chat() | {"messages": [{"role": "user", "content": "a"}] * 2},
        "one user message",
    ),
    (
        "system role",
        "chat/completions",
        chat() | {"messages": [{"role": "system", "content": "a"}]},
        '"role": "user"',
    ),
    ("empty parts", "chat/completions", chat(content=[]), "content"),
    ("part kind", "chat/completions", chat(content=[{"type": "audio"}]), "content part"),
    (
        "http image",
        "chat/completions",
        chat([{"type": "image_url", "image_url": {"url": "http://x/a.png"}}], "captioner"),
        "fetches no image URLs",
    ),
    (
        "bad base64",
        "chat/completions",
        chat(
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "captioner"
        ),
        "base64",
    ),
    (
        "captioner with text",
        "chat/completions",
        chat([IMAGE_PART, {"type": "text", "text": "what"}], "captioner"),
        '"image_url"',
    ),
    ("captioner without image", "chat/completions", chat("three", "captioner"), '"image_url"'),
    ("translator with image", "chat/completions", chat([IMAGE_PART]), "without images"),
    ("chat no language", "chat/completions", chat(target_language=None), '"target_language"'),
    (
        "not an image",
        "chat/completions",
        chat(
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "captioner"
        ),
        "image",
    ),
]


@pytest.mark.parametrize(
    ("route", "body", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refusals(route: str, body: dict[str, Any], words: str, url: str) -> None:
    body = {key: value for key, value in body.items() if value is not None}
    answer = request(f"{url}/v1/{route}", body)
    assert_openai_error(answer, 400, "INVALID_ARGUMENT", words)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("completions", completion(prompt="three hundred " * 40)),
        ("completions", completion(prompt=["three"] * 33)),
        ("completions", completion(prompt="three hundred " * 40, stream=True)),
        ("chat/completions", chat("three hundred " * 40)),
    ],
    ids=["long prompt", "too many prompts", "long prompt stream", "long message"],
)
def test_requests_past_the_model_limits_are_bad_requests(
    route: str, body: dict[str, Any], url: str
) -> None:
    """A size limit is the gRPC API's RESOURCE_EXHAUSTED, but 400 here, not 429 (which OpenAI's
    clients retry, and the same request fails again)."""
    answer = request(f"{url}/v1/{route}", body)
    assert_openai_error(answer, 400, "RESOURCE_EXHAUSTED", "32")


def test_the_client_does_not_retry_a_size_limit(url: str, server: ServerThread) -> None:
    before = requests_total(server, "translator", "Translate", "RESOURCE_EXHAUSTED")
    with (
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT) as retrying,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        retrying.completions.create(model="translator", prompt=["three"] * 33, extra_body=EXTRA)
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert requests_total(server, "translator", "Translate", "RESOURCE_EXHAUSTED") == before + 1


def test_refusals_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model="translator", prompt="three", presence_penalty=0.5, extra_body=EXTRA
        )
    assert refused.value.status_code == 400
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.type == "invalid_request_error"
    assert "presence_penalty" in refused.value.message
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="translator",
            messages=[{"role": "user", "content": "three"}],
            extra_body={**EXTRA, "colour": "red"},
        )
    assert "'colour'" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as streamed:
        stream = client.completions.create(
            model="translator",
            prompt="three",
            stream=True,
            extra_body={"target_language": "xx"},
        )
        list(stream)
    assert streamed.value.status_code == 400 and "xx" in streamed.value.message


def test_bodies_routes_and_methods(url: str) -> None:
    for route in ("completions", "chat/completions"):
        assert_openai_error(request(f"{url}/v1/{route}", b""), 400, "INVALID_ARGUMENT", "empty")
        assert_openai_error(
            request(f"{url}/v1/{route}", b"{not json"), 400, "INVALID_ARGUMENT", "JSON"
        )
        assert_openai_error(
            request(f"{url}/v1/{route}", ["three"]), 400, "INVALID_ARGUMENT", "JSON object"
        )
        unknown = completion(model="nope") if route == "completions" else chat(model="nope")
        assert_openai_error(
            request(f"{url}/v1/{route}", unknown),
            404,
            "NOT_FOUND",
            "'nope'",
        )
        wrong = request(f"{url}/v1/{route}")  # GET
        assert_openai_error(wrong, 405, None, "GET", "POST")
        assert wrong.headers["allow"] == "POST"
    posted = request(f"{url}/v1/models", {})
    assert_openai_error(posted, 405, None, "POST")
    assert "GET" in posted.headers["allow"]
    for path in ("/v1/nothing", "/v1/embeddings", "/v1/models/translator/extra"):
        assert_openai_error(request(f"{url}{path}", {}), 404, None, "no route", "/v1/models")
    triton = request(f"{url}/v2/nothing")  # the KServe routes keep Triton's error shape
    assert triton.status == 404 and isinstance(triton.json()["error"], str)


# --- concurrency, hanging up -------------------------------------------------------------------
def test_async_client_concurrency(url: str, native: pb_grpc.AttnServeStub) -> None:
    cases = [(prompt, language) for prompt in PROMPTS for language in ("de", "fr", "es")][:8]

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT
        ) as client:

            async def one(i: int, prompt: str, language: str) -> str:
                extra = {"target_language": language, "no_repeat_ngram_size": 1}
                if i % 2:
                    messages: Any = [{"role": "user", "content": prompt}]
                    answer = await client.chat.completions.create(
                        model="translator", messages=messages, temperature=0, extra_body=extra
                    )
                    return answer.choices[0].message.content or ""
                done = await client.completions.create(
                    model="translator", prompt=prompt, temperature=0, extra_body=extra
                )
                return done.choices[0].text

            return await asyncio.gather(*(one(i, *case) for i, case in enumerate(cases)))

    got = asyncio.run(main())
    want = [translate(native, [p], GREEDY, language).translations[0].text for p, language in cases]
    assert got == want
    assert len(set(want)) > 1


@pytest.mark.parametrize(
    ("route", "fields", "streams"),
    [
        ("completions", {"prompt": "three"}, 1),
        ("chat/completions", {"messages": [{"role": "user", "content": "three"}], "n": 2}, 2),
        ("completions", {"prompt": ["three", "doce"], "n": 2}, 4),
    ],
    ids=["one", "chat-n2", "two-prompts-n2"],
)
def test_hanging_up_mid_stream_frees_the_rows(
    route: str,
    fields: dict[str, Any],
    streams: int,
    url: str,
    server: ServerThread,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert server.running is not None
    model: Any = server.running.repository.get("translator")
    limit = model.config.limits.max_new_tokens
    slow_steps(monkeypatch, model.engine.cache, 0.05)  # 32 steps: 1.6 s
    cancelled = requests_total(server, "translator", "TranslateStream", "CANCELLED")
    body = json.dumps(
        {
            "model": "translator",
            "target_language": LANGUAGE,
            "seed": 1,
            "min_tokens": limit,
            "max_tokens": limit,
            "stream": True,
            **fields,
        }
    ).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(
            f"POST /v1/{route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 2:
            more = sock.recv(4096)
            assert more, received
            received += more
        assert received.startswith(b"HTTP/1.1 200")
        assert b"[DONE]" not in received
        assert model.engine.active_rows > 0
    deadline = time.monotonic() + 1.0  # well before the streams would have ended
    while model.engine.active_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.engine.active_rows == 0
    deadline = time.monotonic() + 2.0
    counted = 0.0
    while time.monotonic() < deadline:
        counted = requests_total(server, "translator", "TranslateStream", "CANCELLED")
        if counted >= cancelled + streams:
            break
        time.sleep(0.02)
    assert counted == cancelled + streams


# --- metrics -----------------------------------------------------------------------------------
def test_calls_are_counted_as_the_native_methods(
    client: openai.OpenAI, server: ServerThread, url: str
) -> None:
    def counts() -> tuple[float, ...]:
        return (
            requests_total(server, "translator", "Translate", "OK"),
            requests_total(server, "translator", "Translate", "INVALID_ARGUMENT"),
            requests_total(server, "translator", "TranslateStream", "OK"),
            requests_total(server, "translator", "TranslateStream", "INVALID_ARGUMENT"),
            requests_total(server, "captioner", "Caption", "OK"),
            requests_total(server, "captioner", "Caption", "INVALID_ARGUMENT"),
        )

    before = counts()
    client.completions.create(model="translator", prompt=PROMPTS, max_tokens=2, extra_body=EXTRA)
    assert request(f"{url}/v1/completions", completion(presence_penalty=1)).status == 400
    assert request(f"{url}/v1/completions", completion(target_language="xx")).status == 400
    list(
        client.completions.create(
            model="translator", prompt=PROMPTS[:2], max_tokens=2, stream=True, extra_body=EXTRA
        )
    )
    assert request(f"{url}/v1/completions", completion(stream=True, suffix="!")).status == 400
    messages: Any = [{"role": "user", "content": [IMAGE_PART]}]
    client.chat.completions.create(model="captioner", messages=messages, max_tokens=2)
    assert request(f"{url}/v1/chat/completions", chat("three", "captioner")).status == 400
    after = counts()
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 2, 2, 1, 1, 1]


# --- bearer tokens -----------------------------------------------------------------------------
def test_bearer_tokens(tokened: str) -> None:
    def made(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{tokened}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)

    with made(TOKEN) as client:
        assert [m.id for m in client.models.list().data] == ["translator"]
        answer = client.completions.create(
            model="translator", prompt="three", max_tokens=2, temperature=0, extra_body=EXTRA
        )  # greedy: OpenAI's default temperature (1) may draw EOS first
        assert answer.usage is not None and answer.usage.completion_tokens == 2
    with made("wrong-" + TOKEN) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.completions.create(model="translator", prompt="three", extra_body=EXTRA)
        assert refused.value.status_code == 401
        assert refused.value.code == "UNAUTHENTICATED"
        assert TOKEN not in refused.value.message
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    bare = request(f"{tokened}/v1/models")
    assert_openai_error(bare, 401, "UNAUTHENTICATED")
    assert bare.headers["www-authenticate"] == "Bearer"
