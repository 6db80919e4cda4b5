"""The attnserve API's answers as OpenAI response objects and stream chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract.text import TextTokenizer
from serving.openai.requests import Plan
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb

# OpenAI has "stop" for both an end-of-sequence token and a stop string; vLLM's "abort" for a
# request the server ended
FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "abort",
}
OWNER = "attnserve"


@dataclass(frozen=True)
class Choice:
    """One finished output: its text, tokens, their log-probabilities and why it ended."""

    text: str
    token_ids: Sequence[int]
    log_probs: Sequence[float]
    finish_reason: str | None
    tops: Sequence[Any] = ()  # ``TopLogProbs`` messages, one per token (``top_logprobs``)

    @classmethod
    def of(cls, output: Any) -> Choice:
        """A Translation, CaptionResponse or Hypothesis as a choice."""
        return cls(
            output.text,
            list(output.token_ids),
            list(output.token_log_probs),
            FINISH.get(output.finish_reason),
            list(output.top_log_probs),
        )


Tops = list[list[tuple[str, float]]]  # per token: its position's likeliest tokens' texts, values


class TokenTexts:
    """The text of each token of a growing output: what decoding it adds to the text so far
    (the pieces add up to the decoded text)."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, ids: Sequence[int]) -> list[str]:
        pieces = []
        for token in ids:
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids)
            pieces.append(self._piece(text))
            self.text = text
        return pieces

    def add_scored(self, ids: Sequence[int], tops: Sequence[Any]) -> tuple[list[str], Tops]:
        """``add``'s pieces, and for each token the texts its position's most likely tokens
        (its ``TopLogProbs``) would have added in its place, with their log-probabilities."""
        pieces: list[str] = []
        alternatives: Tops = []
        for index, token in enumerate(ids):
            top = tops[index] if index < len(tops) else None
            if top is not None:
                alternatives.append(
                    [
                        (self._piece(self.tokenizer.decode([*self.ids, t])), float(v))
                        for t, v in zip(top.token_ids, top.log_probs, strict=True)
                    ]
                )
            pieces += self.add((token,))
        return pieces, alternatives

    def _piece(self, text: str) -> str:
        """What ``text`` (a decoding of the tokens so far and one more) adds to the text so
        far (all of it where decoding changed what came before)."""
        return text[len(self.text) :] if text.startswith(self.text) else text


class Response:
    """One OpenAI request's answer: its id, creation time and model, and the objects it sends."""

    def __init__(self, plan: Plan, model: str, tokenizer: TextTokenizer) -> None:
        self.plan = plan
        self.chat = plan.chat
        self.id = ("chatcmpl-" if plan.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": f"{kind}.chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.model,
        }

    def logprobs(
        self,
        tokens: list[str],
        log_probs: Sequence[float],
        offset: int,
        tops: Sequence[Sequence[tuple[str, float]]] = (),
    ) -> Any:
        """The ``logprobs`` of tokens (their texts) starting at text offset ``offset``, with
        each token's most likely alternatives ``tops`` (empty without ``top_logprobs``)."""
        if not self.plan.logprobs:
            return None
        values = [float(v) for v in log_probs]
        if self.chat:
            content = [
                {
                    "token": t,
                    "logprob": v,
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {"token": a, "logprob": p, "bytes": list(a.encode())}
                        for a, p in (tops[i] if i < len(tops) else ())
                    ],
                }
                for i, (t, v) in enumerate(zip(tokens, values, strict=False))
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            # OpenAI's legacy shape: text -> log-probability (a text twice: the likelier value)
            "top_logprobs": (
                [_by_text(top) for top in tops] if self.plan.options.top_log_probs else None
            ),
            "text_offset": offsets,
        }

    def body(self, choices: list[list[Choice]], prompt_tokens: int) -> dict[str, Any]:
        """The whole answer: ``choices[p]`` are prompt p's ``n`` choices."""
        items = []
        for p, prompt_choices in enumerate(choices):
            for j, choice in enumerate(prompt_choices):
                echo = self.plan.texts[p] if self.plan.echo else ""
                tokens: list[str] = []
                tops: Tops = []
                if self.plan.logprobs:
                    texts = TokenTexts(self.tokenizer)
                    tokens, tops = texts.add_scored(choice.token_ids, choice.tops)
                item: dict[str, Any] = {"index": p * self.plan.n + j}
                if self.chat:
                    item["message"] = {"role": "assistant", "content": choice.text}
                else:
                    item["text"] = echo + choice.text
                item["logprobs"] = self.logprobs(tokens, choice.log_probs, len(echo), tops)
                item["finish_reason"] = choice.finish_reason
                items.append(item)
        completion = sum(len(c.token_ids) for prompt in choices for c in prompt)
        return {
            **self._head(chunk=False),
            "choices": items,
            "usage": usage(prompt_tokens, completion),
        }

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None = None,
        logprobs: Any = None,
    ) -> dict[str, Any]:
        """A stream chunk of choice ``index``: ``text`` (None: a chat's first chunk, the role)."""
        item: dict[str, Any] = {"index": index}
        if self.chat:
            if text is None:
                item["delta"] = {"role": "assistant", "content": ""}
            else:
                item["delta"] = {"content": text} if text or finish_reason is None else {}
        else:
            item["text"] = text or ""
        item["logprobs"] = logprobs
        item["finish_reason"] = finish_reason
        document = {**self._head(chunk=True), "choices": [item]}
        if self.plan.include_usage:
            document["usage"] = None
        return document

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """A stream's last chunk with ``stream_options.include_usage``: no choices, the counts."""
        return {
            **self._head(chunk=True),
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens),
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_card(name: str, created: int, task: str, version: str) -> dict[str, Any]:
    """A ``/v1/models`` entry (``task`` and ``version`` are attnserve's additions)."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        "task": task,
        "version": version,
    }


# OpenAI's error types by HTTP status (the openai client raises its matching exception)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def error_document(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}`` (``code``: the
    gRPC status name the attnserve API would answer)."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": code,
        }
    }


def _by_text(top: Sequence[tuple[str, float]]) -> dict[str, float]:
    """One position's alternatives as OpenAI's completions give them: text -> log-probability,
    most likely first (a text that two tokens write keeps the likelier value)."""
    by_text: dict[str, float] = {}
    for text, value in top:
        by_text.setdefault(text, value)
    return by_text
