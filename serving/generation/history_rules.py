"""Rules over one sequence's history: ``repetition_penalty``, ``no_repeat_ngram_size`` and bad
words.

The semantics are Hugging Face ``generate``'s (``RepetitionPenaltyLogitsProcessor``,
``NoRepeatNGramLogitsProcessor`` and ``NoBadWordsLogitsProcessor``), which CTranslate2's options
of the same names (and its ``suppress_sequences``) follow:

- the history is the decoder's input so far: the decoder start token, then every generated token;
- ``repetition_penalty`` p: every token id in the history (once, however often it occurs) has its
  score s replaced by ``s * p`` where s < 0 and ``s / p`` otherwise (p > 1 discourages repeats,
  p < 1 encourages them, 1 is off);
- ``no_repeat_ngram_size`` n: a token that would complete an n-gram the history already holds
  gets -inf (n = 1: every token of the history; fewer than n - 1 tokens: nothing is banned);
- bad words (token sequences, ``bad_words``): a one-token word's token always gets -inf; a longer
  word's last token gets -inf where the history ends with the word's other tokens.

Greedy decoding and sampling apply them to the raw logits, before the model's token rules
(suppressed ids, ``min_new_tokens``, the forced EOS) and before temperature, top-k and top-p;
beam search applies them to the log-softmax of the logits and normalises again, as ``generate``
does (``serving.generation.beam``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from serving.generation.options import DecodingOptions


@dataclass(frozen=True)
class HistoryRules:
    """A sequence's repetition controls and bad words (see the module docstring).

    Attributes:
        penalty: ``repetition_penalty``, above 0; 1 = off.
        ngram: ``no_repeat_ngram_size``, 0 = off.
        start_id: the decoder start token, the history's first token.
        bad_words: token sequences never generated (each non-empty).
    """

    penalty: float
    ngram: int
    start_id: int
    bad_words: tuple[tuple[int, ...], ...] = ()
    _always: np.ndarray = field(init=False, repr=False, compare=False)
    _longer: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # one-token words: banned at every step, in one assignment
        singles = sorted({word[0] for word in self.bad_words if len(word) == 1})
        object.__setattr__(self, "_always", np.asarray(singles, dtype=np.int64))
        longer = tuple(word for word in self.bad_words if len(word) > 1)
        object.__setattr__(self, "_longer", longer)

    @classmethod
    def of(
        cls, options: DecodingOptions, start_id: int, bad_words: tuple[tuple[int, ...], ...] = ()
    ) -> HistoryRules | None:
        """The rules a request asks for (``bad_words``: its bad words' token sequences); None
        where it asks for none (the fast paths)."""
        if options.repetition_penalty == 1 and options.no_repeat_ngram_size == 0 and not bad_words:
            return None
        penalty, ngram = float(options.repetition_penalty), int(options.no_repeat_ngram_size)
        return cls(penalty, ngram, start_id, bad_words)

    def history(self, generated: np.ndarray) -> np.ndarray:
        """The decoder's input so far: the start token, then the ``generated`` tokens."""
        out = np.empty(len(generated) + 1, dtype=np.int64)
        out[0] = self.start_id
        out[1:] = generated
        return out

    def apply(self, scores: np.ndarray, generated: np.ndarray) -> None:
        """Apply the rules in place to one row of scores (V,) float, given the tokens the
        sequence generated so far (without the start token)."""
        history = self.history(generated)
        history = history[history < scores.size]
        if self.penalty != 1:
            penalise(scores, history, self.penalty)
        if self.ngram > 0:
            scores[banned_tokens(history, self.ngram)] = -np.inf
        if self.bad_words:
            scores[self._always[self._always < scores.size]] = -np.inf
            for token in completing_tokens(history, self._longer):
                if token < scores.size:
                    scores[token] = -np.inf


def penalise(scores: np.ndarray, history: np.ndarray, penalty: float) -> None:
    """``repetition_penalty``: the score s of each token of ``history`` becomes ``s * penalty``
    where s < 0, ``s / penalty`` otherwise (-inf stays -inf); in place."""
    seen = np.unique(history)
    values = scores[seen]
    scores[seen] = np.where(values < 0, values * penalty, values / penalty)


def banned_tokens(history: np.ndarray, size: int) -> np.ndarray:
    """The tokens that would complete an n-gram (n = ``size``) already in ``history``: the last
    token of every n-gram whose first n - 1 tokens equal the history's last n - 1."""
    length = len(history)
    if size < 1 or length < size:  # no n-gram in the history yet
        return np.zeros(0, dtype=np.int64)
    if size == 1:
        return np.unique(history)
    windows = sliding_window_view(history, size)
    tail = history[length - size + 1 :]
    return windows[(windows[:, :-1] == tail).all(axis=1), -1]


def completing_tokens(history: np.ndarray, words: tuple[tuple[int, ...], ...]) -> list[int]:
    """The last token of every word (of two tokens or more) whose other tokens end ``history``
    (``NoBadWordsLogitsProcessor``'s banned tokens)."""
    banned = []
    length = len(history)
    for word in words:
        head = len(word) - 1
        if head <= length and all(int(history[length - head + i]) == word[i] for i in range(head)):
            banned.append(word[-1])
    return banned
