"""The OpenAI-compatible routes' pure parts, property-tested, and a short fuzz of the live port.

- ``serving.openai.requests``: valid bodies become a ``Plan`` whose fields and decoding options
  carry exactly what was sent (null = left out); every wrong type, range, unknown key and
  unserved feature is an ``InvalidArgument`` that names the field, and no body raises anything
  else; chat message contents and image data URLs.
- ``serving.openai.responses``: ``TokenTexts`` against the tiny models' real tokenizer, the
  response bodies, stream chunks, log-probabilities and error documents.
- ``serving.openai.routes._merged``: several streams merged, failures and early closes.
- The live HTTP port: random and half-valid bodies never get a 500, a hang or a non-OpenAI
  error body, and the server keeps answering.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import io
import itertools
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from contract.text import TextTokenizer
from serving.errors import InvalidArgument
from serving.openai.requests import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    MAX_INT32,
    MAX_N,
    Plan,
    chat_plan,
    completion_plan,
    image_bytes,
    message_content,
)
from serving.openai.responses import ERROR_TYPES, Choice, Response, TokenTexts, error_document
from serving.openai.routes import _merged
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.rest.routes import HTTP_STATUS
from serving.served import ServedGenerator
from tests.serving.rest.conftest import request
from tests.serving.server_thread import ServerThread

FAST = settings(max_examples=60, deadline=None)
PlanOf = Callable[[Any], Plan]


def f32(value: float) -> float:
    """``value`` as the proto's float fields hold it."""
    return ctypes.c_float(value).value


def _given(body: dict[str, Any], key: str, default: Any = None) -> Any:
    """A body's value of ``key``, null read as left out."""
    value = body.get(key)
    return default if value is None else value


# --- valid bodies -------------------------------------------------------------------------------
TEXT = st.text(max_size=12)
STRINGS = TEXT | st.lists(TEXT, max_size=3)


def _field(draw: st.DrawFn, body: dict[str, Any], key: str, values: st.SearchStrategy) -> None:
    """Set ``body[key]`` to a drawn value, to null, or leave it out."""
    how = draw(st.sampled_from(("value", "value", "null", "absent")))
    if how == "null":
        body[key] = None
    elif how == "value":
        body[key] = draw(values)


@st.composite
def common_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The fields both routes take, valid, each present, null or absent."""
    body: dict[str, Any] = {"model": draw(st.text(min_size=1, max_size=10))}
    _field(draw, body, "n", st.integers(1, MAX_N) | st.integers(1, MAX_N).map(float))
    _field(draw, body, "stream", st.booleans())
    _field(draw, body, "stop", STRINGS)
    _field(draw, body, "seed", st.integers(-(2**63), 2**64 - 1))
    _field(draw, body, "temperature", st.floats(0, 2) | st.integers(0, 2))
    _field(draw, body, "top_p", st.floats(0, 1, exclude_min=True) | st.just(1))
    _field(draw, body, "presence_penalty", st.sampled_from([0, 0.0]))
    _field(draw, body, "frequency_penalty", st.sampled_from([0, 0.0]))
    _field(draw, body, "logit_bias", st.just({}))
    _field(draw, body, "user", TEXT)
    _field(draw, body, "top_k", st.integers(0, MAX_INT32))
    _field(draw, body, "min_tokens", st.integers(0, MAX_INT32))
    _field(draw, body, "repetition_penalty", st.floats(0, 1e6) | st.integers(0, 100))
    _field(draw, body, "length_penalty", st.floats(-1e9, 1e9))
    _field(draw, body, "no_repeat_ngram_size", st.integers(0, MAX_INT32))
    _field(draw, body, "beam_size", st.integers(1, MAX_INT32))
    _field(draw, body, "bad_words", STRINGS)
    _field(draw, body, "target_language", TEXT)
    _field(draw, body, "prefix", TEXT)
    _field(draw, body, "priority", st.integers(0, 2**32 - 1))
    if _given(body, "stream"):
        usage = st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | st.none()})
        _field(draw, body, "stream_options", usage)
        if _given(body, "beam_size", 1) > 1:  # a stream does not beam-search
            body["beam_size"] = draw(st.sampled_from([1, None]))
    n = int(_given(body, "n", 1))
    greedy = f32(_given(body, "temperature", 1.0)) == 0
    if n > 1 and greedy and (_given(body, "stream") or _given(body, "beam_size", 1) < n):
        body["temperature"] = draw(st.floats(0.01, 2))  # n choices need sampling
    return body


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(common_fields())
    body["prompt"] = draw(TEXT | st.lists(TEXT, min_size=1, max_size=4))
    _field(draw, body, "max_tokens", st.integers(1, MAX_INT32))
    _field(draw, body, "echo", st.booleans())
    if not _given(body, "echo"):
        _field(draw, body, "logprobs", st.just(0))
    _field(draw, body, "suffix", st.just(""))
    if draw(st.booleans()):
        body["best_of"] = int(_given(body, "n", 1))
    return draw(st.permutations(list(body.items())).map(dict))


@st.composite
def message_parts(draw: st.DrawFn) -> list[dict[str, Any]]:
    text = st.builds(lambda t: {"type": "text", "text": t}, TEXT)
    image = st.builds(
        lambda data: {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()},
        },
        st.binary(min_size=1, max_size=24),
    )
    return draw(st.lists(text | image, min_size=1, max_size=4))


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(common_fields())
    message: dict[str, Any] = {"role": "user", "content": draw(TEXT | message_parts())}
    if draw(st.booleans()):
        message["name"] = draw(TEXT)
    body["messages"] = [message]
    _field(draw, body, "max_tokens", st.integers(1, MAX_INT32))
    _field(draw, body, "max_completion_tokens", st.integers(1, MAX_INT32))
    _field(draw, body, "logprobs", st.booleans())
    _field(draw, body, "top_logprobs", st.just(0))
    _field(draw, body, "response_format", st.just({"type": "text"}))
    _field(draw, body, "tools", st.just([]))
    _field(draw, body, "tool_choice", st.just("none"))
    _field(draw, body, "parallel_tool_calls", st.booleans())
    return draw(st.permutations(list(body.items())).map(dict))


def _strings(value: Any) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def expected_options(body: dict[str, Any], max_tokens: int | None, logprobs: bool) -> Any:
    """The decoding options a valid body asks for (null read as left out)."""
    options = pb.DecodingOptions(
        max_new_tokens=max_tokens or 0,
        temperature=_given(body, "temperature", 1.0),
        top_k=_given(body, "top_k", 0),
        min_new_tokens=_given(body, "min_tokens", 0),
        no_repeat_ngram_size=_given(body, "no_repeat_ngram_size", 0),
        beam_size=_given(body, "beam_size", 1),
        return_log_probs=logprobs,
        stop=_strings(body.get("stop")),
        bad_words=_strings(body.get("bad_words")),
    )
    for key in ("top_p", "repetition_penalty", "length_penalty"):
        if _given(body, key) is not None:
            setattr(options, key, body[key])
    if _given(body, "seed") is not None:
        options.seed = body["seed"] % 2**64
    return options


def check_plan(plan: Plan, body: dict[str, Any], chat: bool, max_tokens: int | None) -> None:
    """``plan`` carries exactly what the valid ``body`` sent."""
    n = int(_given(body, "n", 1))
    usage = _given(body, "stream_options", {})
    assert plan.chat is chat
    assert plan.model == body["model"]
    assert plan.n == n
    assert plan.stream is bool(_given(body, "stream", False))
    assert plan.include_usage is bool(_given(usage, "include_usage", False))
    assert plan.target_language == _given(body, "target_language", "")
    assert plan.prefix == _given(body, "prefix", "")
    assert plan.priority == _given(body, "priority", 0)
    logprobs = _given(body, "logprobs") is not None and body["logprobs"] is not False
    assert plan.logprobs is logprobs
    expected = expected_options(body, max_tokens, logprobs)
    assert plan.options == expected, (plan.options, expected)
    # the values themselves, spelled out (float fields hold float32)
    assert plan.options.temperature == f32(_given(body, "temperature", 1.0))
    assert plan.options.HasField("temperature")
    assert plan.options.max_new_tokens == (max_tokens or 0)
    assert list(plan.options.stop) == _strings(body.get("stop"))
    assert plan.options.HasField("seed") is (_given(body, "seed") is not None)
    if plan.options.HasField("seed"):
        assert plan.options.seed == body["seed"] % 2**64
    assert plan.options.HasField("top_p") is (_given(body, "top_p") is not None)
    if plan.options.HasField("top_p"):
        assert plan.options.top_p == f32(body["top_p"])
    assert plan.options.num_alternatives == 0
    # one unary call answers all n choices; n streams, choice i seeded seed + i
    unary = plan.unary_options()
    assert unary.num_alternatives == n - 1
    unary.num_alternatives = 0
    assert unary == plan.options
    for i in range(n):
        one = plan.stream_options(i)
        assert one.num_alternatives == 0
        assert one.HasField("seed") is plan.options.HasField("seed")
        same = pb.DecodingOptions()
        same.CopyFrom(plan.options)
        if plan.options.HasField("seed"):
            assert one.seed == (body["seed"] + i) % 2**64
            same.seed = one.seed
        assert one == same  # the rest as the plan's
    assert plan.options.num_alternatives == 0  # the plan's own options are left as they were


@settings(max_examples=200, deadline=None)
@given(body=completion_bodies())
def test_a_valid_completion_body_is_planned_as_sent(body: dict[str, Any]) -> None:
    plan = completion_plan(body)
    prompt = body["prompt"]
    assert plan.texts == ((prompt,) if isinstance(prompt, str) else tuple(prompt))
    assert plan.images == ()
    assert plan.echo is bool(_given(body, "echo", False))
    check_plan(plan, body, chat=False, max_tokens=_given(body, "max_tokens"))


@settings(max_examples=200, deadline=None)
@given(body=chat_bodies())
def test_a_valid_chat_body_is_planned_as_sent(body: dict[str, Any]) -> None:
    plan = chat_plan(body)
    text, images = message_content(body["messages"])
    assert plan.texts == ((text,) if text else ())
    assert plan.images == images
    assert plan.echo is False
    max_tokens = _given(body, "max_completion_tokens", _given(body, "max_tokens"))
    check_plan(plan, body, chat=True, max_tokens=max_tokens)


def test_defaults_of_a_minimal_body() -> None:
    plan = completion_plan({"model": "translator", "prompt": "doce"})
    assert plan == Plan(chat=False, model="translator", texts=("doce",), options=plan.options)
    assert plan.options == pb.DecodingOptions(temperature=1.0, beam_size=1)
    assert plan.sampled
    nulls = {key: None for key in COMPLETION_FIELDS if key not in ("model", "prompt")}
    assert completion_plan({"model": "translator", "prompt": "doce", **nulls}) == plan


def test_seeds_wrap_to_uint64() -> None:
    body = {"model": "m", "prompt": "p", "n": 3}
    assert completion_plan({**body, "seed": -1}).options.seed == 2**64 - 1
    assert completion_plan({**body, "seed": -(2**63)}).options.seed == 2**63
    top = completion_plan({**body, "seed": 2**64 - 1})
    assert [top.stream_options(i).seed for i in range(3)] == [2**64 - 1, 0, 1]
    assert completion_plan({**body, "seed": 7.0}).options.seed == 7


# --- invalid bodies -----------------------------------------------------------------------------
COMPLETION = {"model": "translator", "prompt": "doce"}
CHAT = {"model": "translator", "messages": [{"role": "user", "content": "doce"}]}

# field: (lowest, highest) of the integer fields, and of the number fields
INTEGERS = {
    "n": (1, MAX_N),
    "seed": (-(2**63), 2**64 - 1),
    "max_tokens": (1, MAX_INT32),
    "top_k": (0, MAX_INT32),
    "min_tokens": (0, MAX_INT32),
    "no_repeat_ngram_size": (0, MAX_INT32),
    "beam_size": (1, MAX_INT32),
    "priority": (0, 2**32 - 1),
}
COMPLETION_INTEGERS = {**INTEGERS, "best_of": (1, MAX_N), "logprobs": (0, 20)}
CHAT_INTEGERS = {**INTEGERS, "max_completion_tokens": (1, MAX_INT32), "top_logprobs": (0, 20)}
NUMBERS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "repetition_penalty": (0.0, math.inf),
    "length_penalty": (-1e9, 1e9),
}
BOOLEANS = {"completions": ("stream", "echo"), "chat": ("stream", "logprobs")}
STRING_FIELDS = ("target_language", "prefix", "user")
STRINGS_FIELDS = ("stop", "bad_words")
NOT_NUMBERS = (
    st.booleans()
    | TEXT
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(TEXT, st.integers(), max_size=2)
)
NOT_STRINGS = st.booleans() | st.integers() | st.floats() | st.lists(st.integers(), max_size=2)


def _route(chat: bool) -> tuple[dict[str, Any], PlanOf]:
    return (CHAT, chat_plan) if chat else (COMPLETION, completion_plan)


def refused(plan_of: PlanOf, body: Any, *names: str) -> str:
    """The message of the InvalidArgument ``body`` raises; it names each of ``names``."""
    with pytest.raises(InvalidArgument) as raised:
        plan_of(body)
    message = str(raised.value)
    for name in names:
        assert name in message, (name, message)
    return message


@st.composite
def wrong_integers(draw: st.DrawFn, chat: bool) -> tuple[str, Any]:
    """An integer field and a value it refuses: another type, a fraction, or out of range."""
    fields = CHAT_INTEGERS if chat else COMPLETION_INTEGERS
    key = draw(st.sampled_from(sorted(fields)))
    low, high = fields[key]
    fraction = st.floats().filter(lambda v: not v.is_integer())  # NaN and infinities too
    outside = st.integers(low - 2**70, low - 1) | st.integers(high + 1, high + 2**70)
    as_float = outside.map(float).filter(lambda v: not low <= v <= high)  # (rounding)
    return key, draw(NOT_NUMBERS | fraction | outside | as_float)


@st.composite
def wrong_numbers(draw: st.DrawFn) -> tuple[str, Any]:
    key = draw(st.sampled_from(sorted(NUMBERS)))
    low, high = NUMBERS[key]
    outside = st.floats(max_value=low, exclude_max=True)
    if high < math.inf:
        outside |= st.floats(min_value=high, exclude_min=True)
    return key, draw(NOT_NUMBERS | outside | st.just(math.nan))


@FAST
@given(chat=st.booleans(), data=st.data())
def test_a_wrong_integer_is_refused_by_name(chat: bool, data: st.DataObject) -> None:
    base, plan_of = _route(chat)
    key, value = data.draw(wrong_integers(chat))
    refused(plan_of, {**base, key: value}, f'"{key}"')


@FAST
@given(chat=st.booleans(), field=wrong_numbers())
def test_a_wrong_number_is_refused_by_name(chat: bool, field: tuple[str, Any]) -> None:
    base, plan_of = _route(chat)
    key, value = field
    refused(plan_of, {**base, key: value}, f'"{key}"')


@FAST
@given(chat=st.booleans(), data=st.data())
def test_a_wrong_flag_or_string_is_refused_by_name(chat: bool, data: st.DataObject) -> None:
    base, plan_of = _route(chat)
    flags = BOOLEANS["chat" if chat else "completions"]
    key = data.draw(st.sampled_from((*flags, *STRING_FIELDS, *STRINGS_FIELDS)))
    value: Any
    if key in flags:
        value = data.draw(NOT_NUMBERS.filter(lambda v: not isinstance(v, bool)) | st.floats())
    elif key in STRING_FIELDS:
        value = data.draw(NOT_STRINGS | st.dictionaries(TEXT, TEXT, max_size=1))
    else:  # a string or an array of strings
        value = data.draw(
            NOT_STRINGS.filter(lambda v: v != []) | st.lists(NOT_STRINGS, min_size=1, max_size=2)
        )
    refused(plan_of, {**base, key: value}, f'"{key}"')


@FAST
@given(chat=st.booleans(), key=st.text(min_size=1, max_size=20), value=st.none() | st.integers())
def test_an_unknown_field_is_refused_by_name(chat: bool, key: str, value: Any) -> None:
    base, plan_of = _route(chat)
    assume(key not in (CHAT_FIELDS if chat else COMPLETION_FIELDS))
    refused(plan_of, {**base, key: value}, repr(key[:60]))


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("body", [[], "doce", 3, None, ["model"], True, 1.5])
def test_a_body_that_is_no_object_is_refused(chat: bool, body: Any) -> None:
    refused(_route(chat)[1], body, "JSON object")


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"prompt": [1, 2, 3]}, '"prompt"'),
        ({"prompt": [[1, 2], [3]]}, '"prompt"'),
        ({"prompt": []}, '"prompt"'),
        ({"prompt": None}, '"prompt"'),
        ({"prompt": ["a", 1]}, '"prompt"'),
        ({"prompt": {"text": "a"}}, '"prompt"'),
        ({"prompt": ["a"] * 1025}, "1025 prompts"),
        ({"logprobs": 21}, '"logprobs"'),
        ({"logprobs": -1}, '"logprobs"'),
        ({"echo": True, "logprobs": 0}, '"echo"'),
        ({"best_of": 2}, '"best_of"'),
        ({"best_of": 1, "n": 2}, '"best_of"'),
        ({"suffix": "and so on"}, '"suffix"'),
        ({"presence_penalty": 0.5}, '"presence_penalty"'),
        ({"frequency_penalty": -1}, '"frequency_penalty"'),
        ({"presence_penalty": "0"}, '"presence_penalty"'),
        ({"logit_bias": {"5": 100}}, '"logit_bias"'),
        ({"logit_bias": []}, '"logit_bias"'),
        ({"stream_options": {"include_usage": True}}, '"stream_options"'),
        ({"stream": False, "stream_options": {}}, '"stream_options"'),
        ({"stream": True, "stream_options": {"usage": True}}, '"stream_options"'),
        ({"stream": True, "stream_options": [True]}, '"stream_options"'),
        ({"stream": True, "stream_options": {"include_usage": 1}}, '"include_usage"'),
        ({"n": 2, "temperature": 0}, '"n"'),
        ({"n": 3, "temperature": 0, "beam_size": 2}, '"n"'),
        ({"stream": True, "temperature": 0, "beam_size": 2}, '"beam_size"'),
        ({"stream": True, "beam_size": 4, "n": 2}, '"beam_size"'),
        ({"top_p": 0}, '"top_p"'),
        ({"model": ""}, '"model"'),
        ({"model": None}, '"model"'),
        ({"model": 5}, '"model"'),
        ({"seed": 2**64}, '"seed"'),
        ({"seed": -(2**63) - 1}, '"seed"'),
        ({"seed": 1.5}, '"seed"'),
        ({"n": 17}, '"n"'),
        ({"n": True}, '"n"'),
        ({"max_tokens": 0}, '"max_tokens"'),
        ({"max_tokens": 2**31}, '"max_tokens"'),
        ({"temperature": 2.5}, '"temperature"'),
        ({"temperature": "0.7"}, '"temperature"'),
        ({"user": 3}, '"user"'),
        ({"tools": []}, "'tools'"),  # a chat field only
    ],
)
def test_completion_refusals_name_the_field(fields: dict[str, Any], name: str) -> None:
    body = {**COMPLETION, **fields}
    if fields.get("model", "") is None:
        del body["model"]
    refused(completion_plan, body, name)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"top_logprobs": 1}, '"top_logprobs"'),
        ({"top_logprobs": 1.5}, '"top_logprobs"'),
        ({"logprobs": 0}, '"logprobs"'),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, '"tools"'),
        ({"tool_choice": "auto"}, '"tool_choice"'),
        ({"response_format": {"type": "json_object"}}, '"response_format"'),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, '"response_format"'),
        ({"max_completion_tokens": 0}, '"max_completion_tokens"'),
        ({"max_completion_tokens": "5"}, '"max_completion_tokens"'),
        ({"max_tokens": -1}, '"max_tokens"'),
        ({"messages": None}, '"messages"'),
        ({"messages": []}, '"messages"'),
        ({"messages": "doce"}, '"messages"'),
        ({"stream": "true"}, '"stream"'),
        ({"logit_bias": {"5": 1}}, '"logit_bias"'),
        ({"echo": True}, "'echo'"),  # a completion field only
        ({"prompt": "doce"}, "'prompt'"),
        ({"suffix": ""}, "'suffix'"),
        ({"best_of": 1}, "'best_of'"),
    ],
)
def test_chat_refusals_name_the_field(fields: dict[str, Any], name: str) -> None:
    body = {**CHAT, **fields}
    if "messages" in fields and fields["messages"] is None:
        del body["messages"]
    refused(chat_plan, body, name)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_huge_repetition_penalty_is_refused(chat: bool) -> None:
    base, plan_of = _route(chat)
    refused(plan_of, {**base, "repetition_penalty": 10**400}, '"repetition_penalty"')


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
def test_a_boolean_penalty_is_refused(key: str) -> None:
    refused(completion_plan, {**COMPLETION, key: False}, f'"{key}"')


def test_a_wrong_max_tokens_beside_max_completion_tokens_is_refused() -> None:
    body = {**CHAT, "max_completion_tokens": 5, "max_tokens": "many"}
    refused(chat_plan, body, '"max_tokens"')


def test_a_wrong_parallel_tool_calls_is_refused() -> None:
    refused(chat_plan, {**CHAT, "parallel_tool_calls": "sometimes"}, '"parallel_tool_calls"')


# JSON values, NaN and the infinities included (Python's json reads NaN / Infinity)
ODD = st.sampled_from(
    [
        *(0, 1, -1, 2, 16, 17, 2**31, 2**32, 2**64, -(2**63) - 1, 0.5, -0.0, 1e308),
        *(math.nan, math.inf, -math.inf, True, False, None, "", "x", [], {}, [1], ["a"]),
        {"type": "text"},
    ]
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**100), 2**100)
    | st.floats()
    | st.text(max_size=8)
    | ODD,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)


@st.composite
def mutated(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    """A valid body with one field set to a random JSON value, removed, or added unknown."""
    body = dict(draw(chat_bodies() if chat else completion_bodies()))
    original = body.get("messages", [{}])[0]
    fields = CHAT_FIELDS if chat else COMPLETION_FIELDS
    key = draw(st.sampled_from(sorted({*fields, *body})) | st.text(max_size=8))
    if key in body and draw(st.integers(0, 4)) == 0:
        del body[key]
    else:
        body[key] = draw(JSON_VALUES)
    if chat and draw(st.booleans()):  # or a mutated message
        message = dict(original)
        message[draw(st.sampled_from(["role", "content", "name", "x"]))] = draw(JSON_VALUES)
        body["messages"] = draw(st.sampled_from([[message], [message, message], message]))
    return body


@settings(max_examples=300, deadline=None)
@given(chat=st.booleans(), data=st.data())
def test_a_mutated_body_is_a_plan_or_invalid_argument(chat: bool, data: st.DataObject) -> None:
    body = data.draw(mutated(chat))
    plan_of = chat_plan if chat else completion_plan
    try:
        plan = plan_of(body)
    except InvalidArgument as err:
        assert str(err)
        unknown = sorted(set(body) - set(CHAT_FIELDS if chat else COMPLETION_FIELDS))
        if unknown:  # the first unknown field is what it names
            assert repr(unknown[0][:60]) in str(err)
    else:
        assert isinstance(plan, Plan) and plan.chat is chat
        assert 1 <= plan.n <= MAX_N


# --- message contents ---------------------------------------------------------------------------
def _data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


@FAST
@given(text=st.text())
def test_a_string_content_is_the_text(text: str) -> None:
    assert message_content([{"role": "user", "content": text}]) == (text, ())
    assert message_content([{"role": "user", "content": text, "name": "ann"}]) == (text, ())


@FAST
@given(parts=st.lists(st.text() | st.binary(min_size=1, max_size=64), min_size=1, max_size=5))
def test_parts_are_texts_joined_and_images_decoded(parts: list[str | bytes]) -> None:
    content: list[dict[str, Any]] = [
        {"type": "text", "text": p}
        if isinstance(p, str)
        else {"type": "image_url", "image_url": {"url": _data_url(p), "detail": "auto"}}
        for p in parts
    ]
    text, images = message_content([{"role": "user", "content": content}])
    assert text == "\n".join(p for p in parts if isinstance(p, str))
    assert images == tuple(p for p in parts if isinstance(p, bytes))


@FAST
@given(data=st.binary(min_size=1, max_size=256), kind=st.sampled_from(["image/png", "x", ""]))
def test_an_image_data_url_decodes_exactly(data: bytes, kind: str) -> None:
    assert image_bytes({"url": _data_url(data, kind)}) == data
    assert image_bytes(_data_url(data, kind)) == data  # the bare URL string too


@pytest.mark.parametrize(
    "image_url",
    [
        {"url": "https://example.com/cat.png"},
        {"url": "http://example.com/cat.png"},
        "https://example.com/cat.png",
        {"url": "data:image/png,iVBORw0KGgo="},  # no ;base64
        {"url": "data:image/png;base64,"},  # no data
        {"url": "data:image/png;base64,not base64!"},
        {"url": "data:image/png;base64,QUJDRA"},  # no padding
        {"url": "data:image/png;base64,ÄÖÜ="},  # not ASCII
        {"url": 5},
        {"uri": "data:image/png;base64,QUJD"},
        None,
        ["data:image/png;base64,QUJD"],
    ],
)
def test_an_image_that_is_no_base64_data_url_is_refused(image_url: Any) -> None:
    with pytest.raises(InvalidArgument):
        image_bytes(image_url)
    part = {"type": "image_url", "image_url": image_url}
    with pytest.raises(InvalidArgument):
        message_content([{"role": "user", "content": [part]}])


USER = {"role": "user", "content": "doce"}


@pytest.mark.parametrize(
    ("messages", "names"),
    [
        (None, ['"messages"']),
        ([], ['"messages"']),
        ({"role": "user", "content": "doce"}, ['"messages"']),
        ([USER, USER], ["2 messages"]),
        ([{"role": "system", "content": "be brief"}, USER], ["2 messages"]),
        ([{"role": "system", "content": "doce"}], ['"role": "user"']),
        ([{"role": "assistant", "content": "doce"}], ['"role": "user"']),
        ([{"content": "doce"}], ['"role": "user"']),
        (["doce"], ['"role": "user"']),
        ([{**USER, "tool_calls": []}], ["'tool_calls'"]),
        ([{**USER, "x": 1}], ["'x'"]),
        ([{"role": "user"}], ["content"]),
        ([{"role": "user", "content": None}], ["content"]),
        ([{"role": "user", "content": []}], ["content"]),
        ([{"role": "user", "content": 5}], ["content"]),
        ([{"role": "user", "content": ["doce"]}], ["content part"]),
        ([{"role": "user", "content": [{"type": "text"}]}], ["content part"]),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], ["content part"]),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], ["content part"]),
        ([{"role": "user", "content": [{"text": "doce"}]}], ["content part"]),
    ],
)
def test_a_message_other_than_one_user_message_is_refused(messages: Any, names: list[str]) -> None:
    with pytest.raises(InvalidArgument) as raised:
        message_content(messages)
    for name in names:
        assert name in str(raised.value)


# --- the live server and its tokenizer ----------------------------------------------------------
@pytest.fixture(scope="module")
def translator(server: ServerThread) -> ServedGenerator:
    """The tiny translator as the server loaded it."""
    assert server.running is not None
    model = server.running.repository.get("translator")
    assert isinstance(model, ServedGenerator)
    return model


@pytest.fixture(scope="module")
def tokenizer(translator: ServedGenerator) -> TextTokenizer:
    return translator.tokenizer


@pytest.fixture(scope="module")
def languages(translator: ServedGenerator) -> tuple[str, ...]:
    return tuple(translator.config.languages)


def _ordinary(tokenizer: TextTokenizer) -> st.SearchStrategy[int]:
    return st.sampled_from(
        [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids]
    )


# --- TokenTexts ---------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_token_texts_add_up_to_the_decoded_text(
    tokenizer: TextTokenizer, data: st.DataObject
) -> None:
    ids = data.draw(st.lists(_ordinary(tokenizer), max_size=16))
    prefixes = [tokenizer.decode(ids[:k]) for k in range(len(ids) + 1)]
    assume(all(b.startswith(a) for a, b in itertools.pairwise(prefixes)))
    one_by_one = TokenTexts(tokenizer)
    pieces = [piece for token in ids for piece in one_by_one.add([token])]
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids) == one_by_one.text
    assert pieces == [b[len(a) :] for a, b in itertools.pairwise(prefixes)]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=4)))
    chunked = TokenTexts(tokenizer)
    bounds = [0, *cuts, len(ids)]
    in_chunks = [p for a, b in itertools.pairwise(bounds) for p in chunked.add(ids[a:b])]
    assert in_chunks == pieces
    assert chunked.ids == ids


def test_token_texts_of_special_ids_are_empty(tokenizer: TextTokenizer) -> None:
    special = min(tokenizer.special_ids)
    ordinary = next(i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids)
    texts = TokenTexts(tokenizer)
    pieces = texts.add([special, ordinary, special])
    assert pieces == ["", tokenizer.decode([ordinary]), ""]
    assert texts.add([]) == []


class _Rewriting:
    """A tokenizer whose decode of a longer sequence rewrites what came before."""

    vocab_size = 3
    special_ids: frozenset[int] = frozenset()

    def decode(self, ids: list[int]) -> str:
        return {1: "a", 2: "ab", 3: "Xyz"}[len(ids)]


def test_token_texts_restart_where_the_text_was_rewritten() -> None:
    texts = TokenTexts(_Rewriting())  # type: ignore[arg-type]
    assert texts.add([0, 1, 2]) == ["a", "b", "Xyz"]
    assert texts.text == "Xyz"


# --- Response -----------------------------------------------------------------------------------
def _plan(chat: bool, **fields: Any) -> Plan:
    return Plan(chat=chat, model="translator", **fields)


@st.composite
def answers(draw: st.DrawFn, ids: st.SearchStrategy[int]) -> tuple[Plan, list[list[Choice]]]:
    chat = draw(st.booleans())
    n = draw(st.integers(1, 3))
    prompts = draw(st.lists(TEXT, min_size=1, max_size=1 if chat else 3))
    plan = _plan(
        chat,
        texts=tuple(prompts),
        n=n,
        echo=not chat and draw(st.booleans()),
        logprobs=draw(st.booleans()),
    )

    def choice() -> Choice:
        token_ids = draw(st.lists(ids, max_size=6))
        log_probs = draw(
            st.lists(st.floats(-30, 0), min_size=len(token_ids), max_size=len(token_ids))
        )
        finish = draw(st.sampled_from(["stop", "length", "abort", None]))
        return Choice(draw(TEXT), token_ids, log_probs, finish)

    return plan, [[choice() for _ in range(n)] for _ in prompts]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), prompt_tokens=st.integers(0, 10**6))
def test_a_body_holds_every_choice_in_order(
    tokenizer: TextTokenizer, data: st.DataObject, prompt_tokens: int
) -> None:
    plan, choices = data.draw(answers(_ordinary(tokenizer)))
    response = Response(plan, "translator", tokenizer)
    body = response.body(choices, prompt_tokens)
    assert body["object"] == ("chat.completion" if plan.chat else "text_completion")
    assert body["id"].startswith("chatcmpl-" if plan.chat else "cmpl-")
    assert body["id"] == response.id and body["model"] == "translator"
    assert isinstance(body["created"], int)
    items = body["choices"]
    assert [item["index"] for item in items] == list(range(len(plan.texts) * plan.n))
    flat = [(p, c) for p, prompt in enumerate(choices) for c in prompt]
    for item, (p, choice) in zip(items, flat, strict=True):
        assert item["finish_reason"] == choice.finish_reason
        echo = plan.texts[p] if plan.echo else ""
        if plan.chat:
            assert item["message"] == {"role": "assistant", "content": choice.text}
            assert "text" not in item
        else:
            assert item["text"] == echo + choice.text
        logprobs = item["logprobs"]
        if not plan.logprobs:
            assert logprobs is None
            continue
        if plan.chat:
            content = logprobs["content"]
            tokens = [entry["token"] for entry in content]
            assert [entry["logprob"] for entry in content] == list(choice.log_probs)
            assert all(entry["bytes"] == list(entry["token"].encode()) for entry in content)
            assert all(entry["top_logprobs"] == [] for entry in content)
        else:
            tokens = logprobs["tokens"]
            assert logprobs["token_logprobs"] == list(choice.log_probs)
            assert logprobs["top_logprobs"] is None
            offsets = [len(echo) + len("".join(tokens[:k])) for k in range(len(tokens))]
            assert logprobs["text_offset"] == offsets
        assert len(tokens) == len(choice.token_ids)
        assert "".join(tokens) == tokenizer.decode(choice.token_ids)
    completion = sum(len(c.token_ids) for prompt in choices for c in prompt)
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    json.dumps(body, allow_nan=False)  # plain JSON


def test_chat_chunks(tokenizer: TextTokenizer) -> None:
    response = Response(_plan(True, texts=("doce",), n=2), "translator", tokenizer)
    first = response.chunk(1, None)
    assert first["object"] == "chat.completion.chunk" and first["id"] == response.id
    assert first["choices"] == [
        {
            "index": 1,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert "usage" not in first
    assert response.chunk(0, "dre")["choices"][0]["delta"] == {"content": "dre"}
    assert response.chunk(0, "")["choices"][0]["delta"] == {"content": ""}
    last = response.chunk(0, "", "stop")["choices"][0]
    assert last == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    # a last delta with text keeps it
    assert response.chunk(0, "x", "length")["choices"][0]["delta"] == {"content": "x"}


def test_completion_chunks_and_usage(tokenizer: TextTokenizer) -> None:
    plan = _plan(False, texts=("doce",), stream=True, include_usage=True)
    response = Response(plan, "translator", tokenizer)
    chunk = response.chunk(0, "dre", None, {"tokens": ["dre"]})
    assert chunk["object"] == "text_completion" and chunk["id"].startswith("cmpl-")
    assert chunk["choices"] == [
        {"index": 0, "text": "dre", "logprobs": {"tokens": ["dre"]}, "finish_reason": None}
    ]
    assert "usage" in chunk and chunk["usage"] is None
    assert response.chunk(0, None)["choices"][0]["text"] == ""
    assert response.chunk(0, "", "length")["choices"][0]["finish_reason"] == "length"
    last = response.usage_chunk(3, 4)
    assert last["choices"] == [] and last["object"] == "text_completion"
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    chat = Response(_plan(True, stream=True, include_usage=True), "translator", tokenizer)
    assert chat.usage_chunk(1, 2)["object"] == "chat.completion.chunk"
    assert chat.chunk(0, None)["usage"] is None


@FAST
@given(
    tokens=st.lists(st.text(max_size=4), max_size=6),
    values=st.lists(st.floats(-50, 0), max_size=6),
    offset=st.integers(0, 100),
)
def test_logprobs_offsets_accumulate_from_the_echo(
    tokens: list[str], values: list[float], offset: int
) -> None:
    plain = Response(_plan(False, logprobs=True), "m", None)  # type: ignore[arg-type]
    document = plain.logprobs(tokens, values, offset)
    assert document["tokens"] == tokens and document["token_logprobs"] == values
    running = offset
    for token, at in zip(tokens, document["text_offset"], strict=True):
        assert at == running
        running += len(token)
    chat = Response(_plan(True, logprobs=True), "m", None)  # type: ignore[arg-type]
    content = chat.logprobs(tokens, values, offset)["content"]
    assert [(c["token"], c["logprob"]) for c in content] == list(zip(tokens, values, strict=False))
    off = Response(_plan(False), "m", None)  # type: ignore[arg-type]
    assert off.logprobs(tokens, values, offset) is None


@pytest.mark.parametrize("status", sorted({*ERROR_TYPES, *HTTP_STATUS.values(), 500, 502}))
def test_error_documents_are_typed_by_status(status: int) -> None:
    document = error_document(status, "it went wrong", "INVALID_ARGUMENT")
    assert document == {
        "error": {
            "message": "it went wrong",
            "type": ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": "INVALID_ARGUMENT",
        }
    }
    if status in HTTP_STATUS.values() or status in (405, 413):  # every status a route answers
        assert document["error"]["type"] != "server_error"
    if status == 400:
        assert document["error"]["type"] == "invalid_request_error"
    if status >= 500 and status not in ERROR_TYPES:
        assert document["error"]["type"] == "server_error"
    assert error_document(status, "m")["error"]["code"] is None


# --- _merged ------------------------------------------------------------------------------------
class Sources:
    """Async generators that record that they started and that their ``finally`` ran."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.closed: set[int] = set()

    async def messages(
        self, index: int, count: int, pauses: int = 0, then: str = "end"
    ) -> AsyncIterator[str]:
        """``count`` messages (``pauses`` yields to the loop before each), then end, raise
        (``then="raise"``) or wait forever (``then="wait"``)."""
        self.started.add(index)
        try:
            for k in range(count):
                for _ in range(pauses):
                    await asyncio.sleep(0)
                yield f"{index}.{k}"
            if then == "raise":
                raise ValueError(f"stream {index} failed")
            if then == "wait":
                await asyncio.Event().wait()
        finally:
            self.closed.add(index)


async def _collect(merged: AsyncIterator[tuple[int, Any]]) -> list[tuple[int, Any]]:
    return [item async for item in merged]


@settings(max_examples=40, deadline=None)
@given(
    streams=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=5),
    base=st.integers(0, 100),
)
def test_merged_streams_deliver_everything_in_order(
    streams: list[tuple[int, int]], base: int
) -> None:
    sources = Sources()
    indexed = [
        (base + i, sources.messages(i, count, pauses)) for i, (count, pauses) in enumerate(streams)
    ]
    got = asyncio.run(asyncio.wait_for(_collect(_merged(indexed)), 5))
    for i, (count, _) in enumerate(streams):
        assert [m for index, m in got if index == base + i] == [f"{i}.{k}" for k in range(count)]
    assert len(got) == sum(count for count, _ in streams)
    assert sources.closed == set(range(len(streams)))


@settings(max_examples=30, deadline=None)
@given(
    streams=st.lists(st.integers(0, 3), min_size=2, max_size=4),
    data=st.data(),
)
def test_a_failing_stream_ends_the_merge_and_closes_the_others(
    streams: list[int], data: st.DataObject
) -> None:
    failing = data.draw(st.integers(0, len(streams) - 1))
    sources = Sources()
    indexed = [
        (i, sources.messages(i, count, 1, "raise" if i == failing else "wait"))
        for i, count in enumerate(streams)
    ]
    with pytest.raises(ValueError, match=f"stream {failing} failed"):
        asyncio.run(asyncio.wait_for(_collect(_merged(indexed)), 5))
    assert sources.closed == sources.started == set(range(len(streams)))


@pytest.mark.parametrize("count", [1, 3])
def test_closing_the_merge_early_closes_every_source(count: int) -> None:
    sources = Sources()

    async def first_then_close() -> tuple[int, Any]:
        merged: Any = _merged([(i, sources.messages(i, 2, 1, "wait")) for i in range(count)])
        item = await merged.__anext__()
        await merged.aclose()
        return item

    index, message = asyncio.run(asyncio.wait_for(first_then_close(), 5))
    assert message == f"{index}.0"
    assert sources.closed == sources.started == set(range(count))


def test_one_stream_keeps_its_index_and_its_failure() -> None:
    sources = Sources()
    got = asyncio.run(_collect(_merged([(7, sources.messages(0, 3))])))
    assert got == [(7, "0.0"), (7, "0.1"), (7, "0.2")] and sources.closed == {0}
    failing = Sources()
    with pytest.raises(ValueError, match="stream 0 failed"):
        asyncio.run(_collect(_merged([(0, failing.messages(0, 2, 0, "raise"))])))
    assert failing.closed == {0}


def test_no_streams_merge_to_nothing() -> None:
    assert asyncio.run(_collect(_merged([]))) == []


def test_a_source_raising_cancelled_error_ends_the_merge() -> None:
    sources = Sources()

    async def cancelled() -> AsyncIterator[str]:
        await asyncio.sleep(0)
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
        yield "never"

    async def run() -> bool:
        merged = _merged([(0, sources.messages(0, 2, 1, "wait")), (1, cancelled())])
        task = asyncio.ensure_future(_collect(merged))
        done, _ = await asyncio.wait([task], timeout=0.5)
        task.cancel()  # (a no-op where it ended)
        await asyncio.gather(task, return_exceptions=True)
        return bool(done)

    assert asyncio.run(run()), "the merge still waits for the cancelled source"
    assert sources.closed == {0}


# --- the live port ------------------------------------------------------------------------------
ROUTES = ("/v1/completions", "/v1/chat/completions")
LIVE_FIELDS = sorted({*COMPLETION_FIELDS, *CHAT_FIELDS, "x"})
ALLOWED = {200, 400, 404, 413, 429}
LIVE_VALUES = (
    st.sampled_from(["translator", "captioner", "vit", "nope", "de", "fr", "xx"])
    | ODD
    | JSON_VALUES
)


# likely values of each field: a body with a few of them set decodes (or is refused late)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}),
    "stop": st.sampled_from(["e", ["a", "z"], ""]),
    "seed": st.integers(-2, 2**64 - 1),
    "temperature": st.sampled_from([0, 0.5, 1, 2]),
    "top_p": st.sampled_from([0.1, 0.9, 1]),
    "top_k": st.integers(0, 5),
    "min_tokens": st.integers(0, 3),
    "repetition_penalty": st.sampled_from([0.5, 1, 1.5, 100]),
    "length_penalty": st.sampled_from([0, 1, 2]),
    "no_repeat_ngram_size": st.integers(0, 2),
    "beam_size": st.integers(1, 3),
    "bad_words": st.sampled_from(["e", ["a", "b"]]),
    "prefix": st.sampled_from(["", "d", "drei"]),
    "priority": st.integers(0, 3),
    "echo": st.booleans(),
    "logprobs": st.sampled_from([0, True, False]),
    "best_of": st.integers(1, 2),
    "max_completion_tokens": st.integers(1, 3),
    "user": st.just("ann"),
}


@st.composite
def live_bodies(draw: st.DrawFn, languages: tuple[str, ...], image: str) -> tuple[str, bytes]:
    """A route and a body: a valid one with likely values set, one with a field changed to a
    random JSON value (or removed), random JSON or random bytes."""
    route = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["likely", "likely", "half", "half", "json", "bytes"]))
    if kind == "bytes":
        return route, draw(st.binary(max_size=64))
    if kind == "json":
        return route, json.dumps(draw(JSON_VALUES)).encode()
    body: dict[str, Any] = {"model": "translator", "max_tokens": draw(st.integers(1, 3))}
    if route == ROUTES[0]:
        body["prompt"] = draw(st.sampled_from(["doce", ["doce", "trois cent douze"]]))
    elif draw(st.booleans()):
        body["messages"] = [{"role": "user", "content": "doce"}]
    else:  # a caption
        part = {"type": "image_url", "image_url": {"url": image}}
        body.update(model="captioner", messages=[{"role": "user", "content": [part]}])
    if body["model"] == "translator":
        body["target_language"] = draw(st.sampled_from(languages))
    if draw(st.booleans()):
        body["stream"] = True
    if kind == "likely":
        for key in draw(st.lists(st.sampled_from(sorted(PLAUSIBLE)), max_size=3, unique=True)):
            body[key] = draw(PLAUSIBLE[key])
        return route, json.dumps(body).encode()
    key = draw(st.sampled_from(LIVE_FIELDS))
    if key in body and draw(st.booleans()):
        del body[key]
    else:
        body[key] = draw(LIVE_VALUES)
    return route, json.dumps(body).encode()  # NaN and Infinity as Python's json writes them


def _png(size: int = 48) -> str:
    """A data URL of a PNG the size of the tiny captioner's images."""
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 30)).save(buffer, format="PNG")
    return _data_url(buffer.getvalue())


IMAGE = _png()


def _check_error(document: Any) -> None:
    error = document["error"]
    assert isinstance(error, dict), document
    assert isinstance(error["message"], str) and error["message"], document
    assert isinstance(error["type"], str) and error["type"], document


def _events(body: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e.strip()]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_the_live_routes_answer_every_body(
    url: str, languages: tuple[str, ...], data: st.DataObject
) -> None:
    route, body = data.draw(live_bodies(languages, IMAGE))
    headers = {"Content-Type": "application/json"}
    answer = request(url + route, body, headers, timeout=30)
    assert answer.status in ALLOWED, (answer.status, body[:300], answer.body[:300])
    event(f"HTTP {answer.status}")
    if answer.status != 200:
        assert answer.headers["content-type"].startswith("application/json")
        _check_error(answer.json())
    elif answer.headers["content-type"].startswith("text/event-stream"):
        events = _events(answer.body)
        assert events[-1] == b"[DONE]", answer.body[-300:]
        for line in events[:-1]:
            document = json.loads(line)
            if "error" in document:
                _check_error(document)
            else:
                assert "choices" in document
    else:
        document = answer.json()
        assert document["choices"] and document["usage"]["total_tokens"] >= 0


def test_the_live_port_still_serves_after_the_fuzz(url: str, languages: tuple[str, ...]) -> None:
    models = request(f"{url}/v1/models", timeout=30)
    assert models.status == 200
    assert "translator" in {card["id"] for card in models.json()["data"]}
    body = {"model": "translator", "prompt": "doce", "max_tokens": 2}
    answer = request(f"{url}/v1/completions", {**body, "target_language": languages[0]})
    assert answer.status == 200 and isinstance(answer.json()["choices"][0]["text"], str)


@pytest.mark.parametrize("route", ROUTES)
def test_a_huge_number_on_the_live_port_is_a_400(
    url: str, languages: tuple[str, ...], route: str
) -> None:
    body: dict[str, Any] = {"model": "translator", "target_language": languages[0]}
    if route == ROUTES[0]:
        body["prompt"] = "doce"
    else:
        body["messages"] = [{"role": "user", "content": "doce"}]
    data = json.dumps({**body, "repetition_penalty": 0}).encode()
    data = data.replace(b'"repetition_penalty": 0', b'"repetition_penalty": 1' + b"0" * 400)
    answer = request(url + route, data, timeout=30)
    assert answer.status == 400, (answer.status, answer.body[:300])
    _check_error(answer.json())
