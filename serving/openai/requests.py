"""OpenAI request bodies (``/v1/completions``, ``/v1/chat/completions``) as a ``Plan``.

Strict, as OpenAI's own API is: a field the routes do not know, a value of the wrong type, or a
feature they do not serve (a non-zero presence penalty, tools, image URLs to fetch) is an
``InvalidArgument`` that names the field and says what to send instead. ``null`` is the same as
leaving a field out. Fields beyond OpenAI's (vLLM's names where vLLM has them):
``top_k``, ``min_tokens``, ``repetition_penalty``, ``length_penalty``,
``no_repeat_ngram_size``, ``beam_size``, ``bad_words``, ``target_language``, ``prefix`` (the
text an output starts with) and ``priority``.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from typing import Any

from serving.errors import InvalidArgument
from serving.generation.options import MAX_TOP_LOG_PROBS
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb

COMMON = (
    "model",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "temperature",
    "top_p",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
)
EXTENSIONS = (
    "top_k",
    "min_tokens",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "beam_size",
    "bad_words",
    "target_language",
    "prefix",
    "priority",
)
COMPLETION_FIELDS = (*COMMON, "prompt", "echo", "logprobs", "suffix", "best_of", *EXTENSIONS)
CHAT_FIELDS = (
    *COMMON,
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    *EXTENSIONS,
)
DEFAULT_TEMPERATURE = 1.0  # OpenAI's: without "temperature" the output is sampled
MAX_N = 16  # choices per prompt
MAX_PROMPTS = 1024  # the Translate call's own limit (max_texts_per_request) is usually lower
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class Plan:
    """What one OpenAI request asks for, in the attnserve API's terms.

    Attributes:
        chat: a chat completion (else a text completion).
        model: the model's name.
        texts: the texts to translate (one per prompt; the chat message's text).
        images: the images to caption (a chat message's ``image_url`` parts, decoded).
        n: choices per prompt.
        stream: answer with server-sent events.
        include_usage: a stream's last chunk carries the token counts.
        logprobs: report the chosen tokens' log-probabilities (and with ``options.top_log_probs``
            each position's most likely tokens).
        echo: a completion's text starts with its prompt.
        target_language: the translator's target language ("" when not given).
        prefix: the text every output starts with ("" for none).
        priority: the request's priority level (0: the model's default).
        options: the decoding options of one choice.
    """

    chat: bool
    model: str
    texts: tuple[str, ...] = ()
    images: tuple[bytes, ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    echo: bool = False
    target_language: str = ""
    prefix: str = ""
    priority: int = 0
    options: pb.DecodingOptions = field(default_factory=pb.DecodingOptions)

    @property
    def sampled(self) -> bool:
        return self.options.temperature > 0

    def unary_options(self) -> pb.DecodingOptions:
        """The options of one unary call answering all ``n`` choices of a prompt: the further
        choices are its alternatives (further samples, or the runner-up beams)."""
        options = pb.DecodingOptions()
        options.CopyFrom(self.options)
        options.num_alternatives = self.n - 1
        return options

    def stream_options(self, choice: int) -> pb.DecodingOptions:
        """The options of the stream of choice ``choice`` of a prompt (choice i > 0 of a seeded
        request draws with ``seed + i``, as a unary call's alternatives do)."""
        options = pb.DecodingOptions()
        options.CopyFrom(self.options)
        if choice and options.HasField("seed"):
            options.seed = (options.seed + choice) % 2**64
        return options


def _present(body: dict[str, Any], key: str) -> bool:
    return body.get(key) is not None


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(f'"{key}" must be true or false, got {_show(value)}')
    return value


def _int(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidArgument(
            f'"{key}" must be an integer from {low} to {high}, got {_show(value)}'
        )
    return value


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1e308:
        value = float("inf") if value > 0 else float("-inf")  # past a float: out of range
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidArgument(
            f'"{key}" must be a number from {low:g} to {high:g}, got {_show(value)}'
        )
    return float(value)


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f'"{key}" must be a string, got {_show(value)}')
    return value


def _strings(body: dict[str, Any], key: str) -> tuple[str, ...]:
    """A string or an array of strings."""
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidArgument(f'"{key}" must be a string or an array of strings, got {_show(value)}')


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(body: Any, allowed: tuple[str, ...], route: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidArgument(f"the {route} request body must be a JSON object")
    unknown = sorted(key for key in body if key not in allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown field {unknown[0][:60]!r} in a {route} request; the fields served are: "
            f"{', '.join(sorted(allowed))}"
        )
    return body


def _refuse_unserved(body: dict[str, Any]) -> None:
    """Fields OpenAI has that these models do not serve, unless they ask for nothing."""
    for key in ("presence_penalty", "frequency_penalty"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or value not in (0, 0.0)):
            raise InvalidArgument(
                f'"{key}" is not served; leave it at 0 and use "repetition_penalty" (above 1 '
                'penalises repeated tokens) or "no_repeat_ngram_size"'
            )
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, dict) or bias):
        raise InvalidArgument('"logit_bias" is not served; leave it out (or use "bad_words")')
    if body.get("suffix") not in (None, ""):
        raise InvalidArgument('"suffix" is not served: these models write after the prompt only')
    for key, neutral in (("tools", []), ("tool_choice", "none")):
        if body.get(key) not in (None, neutral):
            raise InvalidArgument(f'"{key}" is not served: these models call no functions')
    _bool(body, "parallel_tool_calls")  # meaningless without tools, but a boolean
    form = body.get("response_format")
    if form is not None and form != {"type": "text"}:
        raise InvalidArgument('"response_format" other than {"type": "text"} is not served')
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidArgument('"user" must be a string')


def _options(body: dict[str, Any], max_tokens: int | None) -> pb.DecodingOptions:
    """The decoding options (their ranges against the model are checked where they run)."""
    options = pb.DecodingOptions(max_new_tokens=max_tokens or 0)
    temperature = _number(body, "temperature", 0.0, 2.0)
    options.temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if (top_p := _number(body, "top_p", 0.0, 1.0)) is not None:
        if top_p == 0:
            raise InvalidArgument('"top_p" must be above 0 (1 keeps every token)')
        options.top_p = top_p
    if (seed := _int(body, "seed", -(2**63), 2**64 - 1)) is not None:
        options.seed = seed % 2**64
    options.stop.extend(_strings(body, "stop"))
    options.bad_words.extend(_strings(body, "bad_words"))
    options.top_k = _int(body, "top_k", 0, MAX_INT32) or 0
    options.min_new_tokens = _int(body, "min_tokens", 0, MAX_INT32) or 0
    options.no_repeat_ngram_size = _int(body, "no_repeat_ngram_size", 0, MAX_INT32) or 0
    options.beam_size = _int(body, "beam_size", 1, MAX_INT32) or 1
    if (penalty := _number(body, "repetition_penalty", 0.0, float("inf"))) is not None:
        options.repetition_penalty = penalty
    if (length := _number(body, "length_penalty", -1e9, 1e9)) is not None:
        options.length_penalty = length
    return options


def _plan(
    body: dict[str, Any],
    chat: bool,
    max_tokens: int | None,
    logprobs: bool,
    top: int,
    **fields: Any,
) -> Plan:
    _refuse_unserved(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidArgument('"model" is required: the name of a served model (GET /v1/models)')
    stream = _bool(body, "stream")
    usage = body.get("stream_options")
    if usage is not None:
        if not stream:
            raise InvalidArgument('"stream_options" is for streams only: set "stream": true')
        if not isinstance(usage, dict) or set(usage) - {"include_usage"}:
            raise InvalidArgument('"stream_options" is {"include_usage": true | false}')
    options = _options(body, max_tokens)
    options.return_log_probs = logprobs
    options.top_log_probs = top
    n = _int(body, "n", 1, MAX_N) or 1
    plan = Plan(
        chat=chat,
        model=model,
        n=n,
        stream=stream,
        include_usage=_bool(usage or {}, "include_usage"),
        logprobs=logprobs,
        target_language=_string(body, "target_language"),
        prefix=_string(body, "prefix"),
        priority=_int(body, "priority", 0, 2**32 - 1) or 0,
        options=options,
        **fields,
    )
    if n > 1 and not plan.sampled and options.beam_size < n:
        raise InvalidArgument(
            f'"n" = {n} choices need sampling ("temperature" above 0) or beam search '
            f'("beam_size" of at least {n}): greedy decoding has one answer'
        )
    if stream and options.beam_size > 1:
        raise InvalidArgument('a stream decodes greedily or by sampling: leave "beam_size" at 1')
    return plan


def completion_plan(body: Any) -> Plan:
    """A ``/v1/completions`` body's plan: one text to translate per prompt."""
    body = _check_fields(body, COMPLETION_FIELDS, "completions")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        texts: tuple[str, ...] = (prompt,)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts = tuple(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int | list) for p in prompt):
        raise InvalidArgument('"prompt" as token ids is not served: send the text')
    else:
        raise InvalidArgument('"prompt" is required: a string, or a non-empty array of strings')
    if len(texts) > MAX_PROMPTS:
        raise InvalidArgument(f"{len(texts)} prompts; send at most {MAX_PROMPTS} per request")
    logprobs = _int(body, "logprobs", 0, MAX_TOP_LOG_PROBS)
    echo = _bool(body, "echo")
    if echo and logprobs is not None:
        raise InvalidArgument(
            '"echo" with "logprobs" needs the prompt\'s log-probabilities, which are not served'
        )
    best_of = _int(body, "best_of", 1, MAX_N)
    n = _int(body, "n", 1, MAX_N) or 1
    if best_of is not None and best_of != n:
        raise InvalidArgument('"best_of" is not served apart from "n": leave it out')
    return _plan(
        body,
        chat=False,
        max_tokens=_int(body, "max_tokens", 1, MAX_INT32),
        logprobs=logprobs is not None,
        top=logprobs or 0,
        texts=texts,
        echo=echo,
    )


def chat_plan(body: Any) -> Plan:
    """A ``/v1/chat/completions`` body's plan: its one user message's text or image."""
    body = _check_fields(body, CHAT_FIELDS, "chat completions")
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOG_PROBS) or 0
    if top and not logprobs:
        raise InvalidArgument('"top_logprobs" needs "logprobs": true')
    legacy = _int(body, "max_tokens", 1, MAX_INT32)  # OpenAI's older name: the newer wins
    max_tokens = _int(body, "max_completion_tokens", 1, MAX_INT32)
    max_tokens = legacy if max_tokens is None else max_tokens
    texts, images = message_content(body.get("messages"))
    return _plan(
        body,
        chat=True,
        max_tokens=max_tokens,
        logprobs=logprobs,
        top=top,
        texts=(texts,) if texts else (),
        images=images,
    )


def message_content(messages: Any) -> tuple[str, tuple[bytes, ...]]:
    """The text and the images of a chat request's one user message.

    These models are not conversational: an answer depends on one message only, so a request
    with earlier turns (or a system prompt) is refused rather than answered as if they had been
    read.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument('"messages" is required: [{"role": "user", "content": ...}]')
    if len(messages) > 1:
        raise InvalidArgument(
            f'"messages" holds {len(messages)} messages; these models are not conversational '
            "and answer one user message: send only it (no system prompt, no earlier turns)"
        )
    (message,) = messages
    if not isinstance(message, dict) or message.get("role") != "user":
        raise InvalidArgument('the message must be {"role": "user", "content": ...}')
    unknown = sorted(set(message) - {"role", "content", "name"})
    if unknown:
        raise InvalidArgument(f"unknown field {unknown[0][:60]!r} in the message")
    _string(message, "name")  # the participant's name: a string, not otherwise used
    content = message.get("content")
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list) or not content:
        raise InvalidArgument("the message's content must be a string or an array of parts")
    texts: list[str] = []
    images: list[bytes] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            images.append(image_bytes(part.get("image_url")))
        else:
            raise InvalidArgument(
                'a content part is {"type": "text", "text": "..."} or {"type": "image_url", '
                f'"image_url": {{"url": "data:image/png;base64,..."}}}}; got {_show(part)}'
            )
    return "\n".join(texts), tuple(images)


def image_bytes(image_url: Any) -> bytes:
    """An ``image_url`` part's image: a base64 ``data:`` URL (the server fetches no URLs)."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str):
        raise InvalidArgument('"image_url" must be {"url": "data:image/png;base64,..."}')
    if not url.startswith("data:"):
        raise InvalidArgument(
            "the server fetches no image URLs: send the image inline, as "
            '"data:image/png;base64,..." (PNG or JPEG)'
        )
    header, _, data = url.partition(",")
    if not header.endswith(";base64") or not data:
        raise InvalidArgument('an image data URL is "data:image/png;base64,<the bytes in base64>"')
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidArgument(f"the image data URL is not valid base64 ({err})") from None
