"""The most likely tokens of one decode step and their log-probabilities (``top_log_probs``).

OpenAI's ``top_logprobs``, vLLM's ``logprobs=k``: at each output position, the ``k`` tokens of
highest log-probability in the distribution the chosen token's log-probability comes from,
most likely first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from serving.generation.ranking import top_indices


class TopTokens(NamedTuple):
    """One position's most likely tokens, most likely first (ties: lowest id first)."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]

    @classmethod
    def forced(cls, token: int) -> TopTokens:
        """A token the step did not choose (a target prefix's, a forced EOS): the only
        possible one, log-probability 0."""
        return cls((int(token),), (0.0,))

    @classmethod
    def of(cls, value: Any) -> TopTokens:
        """Back from its wire form (``[[ids], [log-probs]]``, as msgpack writes a tuple)."""
        ids: Sequence[Any]
        values: Sequence[Any]
        ids, values = value
        if len(ids) != len(values):
            raise ValueError(f"top tokens: {len(ids)} ids for {len(values)} log-probabilities")
        return cls(tuple(int(i) for i in ids), tuple(float(p) for p in values))


NONE = TopTokens((), ())


def top_tokens(log_probs: np.ndarray, count: int) -> TopTokens:
    """The ``count`` most likely tokens of one row of log-probabilities (fewer where fewer are
    possible: -inf and NaN entries are never listed), most likely first, ties by lowest id
    (``ranking.top_indices``: only the values near the top are sorted)."""
    if count < 1:
        return NONE
    finite = np.isfinite(log_probs)
    possible = int(np.count_nonzero(finite))
    if possible == 0:
        return NONE
    values = log_probs if possible == log_probs.size else np.where(finite, log_probs, -np.inf)
    chosen = top_indices(values, min(count, possible))
    return TopTokens(
        tuple(int(i) for i in chosen.tolist()), tuple(float(v) for v in values[chosen].tolist())
    )
