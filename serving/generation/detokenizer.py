"""Streaming detokenisation: text deltas of a sequence that grows one token at a time."""

from __future__ import annotations

from contract.text import TextTokenizer


class IncrementalDetokenizer:
    """Text deltas of a growing token sequence, decoding only a short window each time.

    A token may end inside a character or word piece; its text is held back until a later token
    settles it (the prefix/read offsets of text-generation-inference's streaming decoder).
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = 0  # tokens before this are already in the emitted text
        self.text = ""  # everything emitted

    def add(self, ids: list[int]) -> str:
        """Append ``ids``; the newly settled text."""
        self.tokens.extend(ids)
        prefix = self.tokenizer.decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.tokens[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd") or not full.startswith(prefix):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.tokens)
        delta = full[len(prefix) :]
        self.text += delta
        return delta

    def rest(self, final_text: str) -> str:
        """What the deltas so far lack of ``final_text`` (text held back at the end)."""
        return final_text[len(self.text) :] if final_text.startswith(self.text) else ""
