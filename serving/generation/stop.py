"""Stop strings: the output ends where one of them first appears in its text.

The semantics follow the serving APIs people use (OpenAI's and vLLM's ``stop``): generation
ends with the token whose text completes a stop string, the output's ``token_ids`` end with
that token (as Hugging Face ``generate(stop_strings=...)``'s do), and its text ends just before
the stop string; a stream never sends text that could still turn out to be part of one. A stop
string must end after the target prefix's text (a prefix that contains one does not stop the
output at once). Matching runs on the frontend's decoded text, so tokens the engine chose past
the stop are dropped there and the engine finishes the request before its next step
(``GenerationRequest.finish_at``).
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.text import TextTokenizer
from serving.generation.detokenizer import IncrementalDetokenizer


class StopMatcher:
    """Watches an output's text for stop strings as its tokens arrive.

    Args:
        tokenizer: the model's tokenizer (the text is decoded as the final text is).
        stops: the stop strings (non-empty).
        prefix_tokens: the target prefix's tokens, the output's first: a stop string must end
            after their text.
    """

    def __init__(self, tokenizer: TextTokenizer, stops: Sequence[str], prefix_tokens: int = 0):
        if not stops or not all(stops):
            raise ValueError(f"stop strings must be non-empty, got {stops!r}")
        self.stops = tuple(stops)
        self.prefix_tokens = prefix_tokens
        self._text = IncrementalDetokenizer(tokenizer)
        self._guard = 0  # characters of the prefix's text: a match must end after them
        self.tokens = 0  # tokens seen
        self.kept: int | None = None  # tokens the output keeps, once a stop string appeared
        self.cut: int | None = None  # where the output's text ends (the stop string's start)
        self.released = 0  # characters of text ``release`` has handed out

    @property
    def stopped(self) -> bool:
        return self.kept is not None

    def add(self, token_ids: Sequence[int]) -> int:
        """Feed the next tokens; how many of them the output keeps (all, or those up to the one
        completing a stop string; none once stopped)."""
        taken = 0
        for token in token_ids:
            if self.kept is not None:
                break
            taken += 1
            self.tokens += 1
            before = len(self._text.text)
            self._text.add([int(token)])
            if self.tokens <= self.prefix_tokens:
                self._guard = len(self._text.text)
                continue
            self._search(before)
        return taken

    def _search(self, before: int) -> None:
        """Look for a stop string ending in the text past ``before`` (and past the prefix)."""
        text = self._text.text
        if len(text) == before:
            return
        best: int | None = None
        for stop in self.stops:
            start = max(0, before - len(stop) + 1, self._guard - len(stop) + 1)
            found = text.find(stop, start)
            if found >= 0 and (best is None or found < best):
                best = found
        if best is not None:
            self.kept, self.cut = self.tokens, best

    def release(self) -> str:
        """Text that is now certain to be output (not part of a stop string that may still
        complete); each character once."""
        text = self._text.text
        end = self.cut if self.cut is not None else len(text) - self._held(text)
        end = max(end, self.released)
        piece = text[self.released : end]
        self.released = end
        return piece

    def _held(self, text: str) -> int:
        """Characters at the end of ``text`` that begin some stop string (kept back)."""
        held = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:size]):
                    held = size
                    break
        return held

    def rest(self, final_text: str) -> str:
        """What the released text lacks of the output's ``final_text`` (``final_text``'s
        result; "" where the two differ)."""
        released = self._text.text[: self.released]
        return final_text[len(released) :] if final_text.startswith(released) else ""

    def final_text(self, text: str) -> str:
        """The output's text ``text`` (decoded from the kept tokens), ended before the stop
        string where one appeared."""
        if self.cut is None:
            return text
        if text.startswith(self._text.text[: self.cut]):
            return text[: self.cut]
        return text  # a decoding that differs from the streamed one: left whole
