"""One sampled token of a row: the token ``filter_logits`` and ``draw`` give, in fewer passes.

``sampling.filter_logits`` followed by ``sampling.draw`` is the reference: a float64 copy of the
row, temperature, top-k, top-p, then one uniform number against the cumulative weights in
vocabulary order. Over a large vocabulary (Marian's 58,101 tokens: 464 KB of float64 a row) that
reference makes a dozen full-length passes, each into a fresh array that the allocator maps and
faults in again: 0.4-0.9 ms a row on a Zen 4 core (2026-11-28, ``benchmarks.sampling_probe``).
Here:

- the row is copied once into a per-thread float64 buffer that lives as long as the thread, and
  shifted and scaled in place (the same two roundings as ``(x - max) / temperature``);
- after top-k only the kept tokens (the k largest and their ties, ascending ids) are carried on:
  their probabilities, the top-p ranking and the draw's cumulative weights are computed over them
  alone. A cumulative sum in vocabulary order adds only zeros between two kept tokens, and adding
  0.0 is exact, so every partial sum is the reference's. The one full-length sum left, top-p's
  normaliser (numpy's pairwise summation, whose grouping depends on the positions), runs over a
  per-thread zero buffer holding the kept values where the reference's array holds them;
- top-p ranks the best 256 tokens, then 2,048 and 16,384, before the whole row (the reference
  goes from 256 to the whole row).

Every value compared and every draw is the reference's: ``tests/serving/test_row_draw.py``
checks tokens and generator states against it on rows with ties, NaN, ±inf, float16 to float64.
"""

from __future__ import annotations

import threading

import numpy as np

from serving.generation.ranking import NUCLEUS_PREFIX, kth_largest


class _Buffers(threading.local):
    """Per-thread full-length buffers: the row in float64, a weight row and a zero row."""

    def __init__(self) -> None:
        self.size = 0
        self.row = self.weights = self.zeros = np.empty(0)

    def of(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if size != self.size:
            self.row, self.weights = np.empty(size), np.empty(size)
            self.zeros, self.size = np.zeros(size), size
        return self.row, self.weights, self.zeros


_BUFFERS = _Buffers()
PREFIX_GROWTH = 8  # top-p's ranking: the best 256 tokens, then 2,048, 16,384, then all of them


def clean_in_place(x: np.ndarray) -> np.ndarray:
    """Set NaN to -inf and +inf to the largest float in the float64 array ``x``; returns it."""
    if not np.isfinite(x).all():  # the usual case: one pass instead of nan_to_num's several
        np.nan_to_num(x, copy=False, nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)
    return x


def float_row(logits_row: np.ndarray) -> np.ndarray:
    """``clean_logits(logits_row)`` in this thread's row buffer (overwritten by the next call):
    float64, NaN set to -inf and +inf to the largest float."""
    x = _BUFFERS.of(logits_row.size)[0]
    np.copyto(x, logits_row)
    return clean_in_place(x)


def sample_float_row(
    x: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator
) -> int:
    """The token ``draw(filter_logits(x, ...), rng)`` gives, for a row from ``float_row`` that
    holds a finite value (``x`` is overwritten). Options must be valid, temperature above 0."""
    scale_row(x, temperature)
    return draw_possible(x, possible_tokens(x, top_k, top_p), rng)


def scale_row(x: np.ndarray, temperature: float) -> None:
    """``x = (x - x.max()) / temperature`` in place, value for value: the largest is then 0.0,
    and it stays possible after every filter."""
    with np.errstate(over="ignore"):
        np.subtract(x, x.max(), out=x)
        np.divide(x, temperature, out=x)


def possible_tokens(x: np.ndarray, top_k: int, top_p: float) -> np.ndarray | None:
    """The tokens of the scaled row ``x`` that ``filter_logits`` leaves finite, ascending; None
    where that is every finite one (no top-k and no top-p)."""
    ids: np.ndarray | None = None
    if 0 < top_k < x.size:
        kth = kth_largest(x, top_k)
        ids = np.flatnonzero(x >= kth) if kth != -np.inf else np.flatnonzero(x != -np.inf)
    return _nucleus(x, ids, top_p) if top_p < 1 else ids


def draw_possible(x: np.ndarray, ids: np.ndarray | None, rng: np.random.Generator) -> int:
    """``draw``'s token over the scaled row ``x`` restricted to ``ids`` (None: all of it)."""
    if ids is None:
        weights = np.exp(x, out=_BUFFERS.of(x.size)[1])  # exp(-inf) = 0: the reference's zeros
        cumulative = np.cumsum(weights, out=weights)
        token = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        if token >= x.size:  # rounding put the target on the total: the last possible token
            token = int(np.flatnonzero(np.exp(x))[-1])
        return token
    weights = np.exp(x[ids])
    cumulative = np.cumsum(weights)  # the reference's partial sums: only zeros in between
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    if index >= ids.size:
        index = int(np.flatnonzero(weights)[-1])
    return int(ids[index])


def masked_sum(values: np.ndarray, ids: np.ndarray, size: int) -> float:
    """The sum of a ``size`` row of zeros holding ``values`` at ``ids``, as numpy sums that
    row (pairwise, grouped by position), without making the row."""
    zeros = _BUFFERS.of(size)[2]
    zeros[ids] = values
    total = float(zeros.sum())
    zeros[ids] = 0.0
    return total


def _nucleus(x: np.ndarray, ids: np.ndarray | None, top_p: float) -> np.ndarray:
    """The tokens ``sampling._apply_top_p`` keeps (ascending ids), from the possible ``ids``.
    Where the best ``NUCLEUS_PREFIX`` tokens hold less than ``top_p``, the reference ranks the
    whole row; here the prefix grows ``PREFIX_GROWTH``-fold first (a nucleus of 1,462 of 58,101
    tokens: 2,048 sorted instead of all)."""
    if ids is None:
        probs = np.exp(x, out=_BUFFERS.of(x.size)[1])
        probs /= probs.sum()
        tokens = np.flatnonzero(probs > 0)
        values = probs[tokens]
    else:
        values = np.exp(x[ids])
        values /= masked_sum(values, ids, x.size)
        live = values > 0
        tokens, values = ids[live], values[live]
    prefix = NUCLEUS_PREFIX
    while tokens.size > prefix:  # the best ``prefix`` (and their ties) rank first in any case
        best = values >= kth_largest(values, prefix)
        order, before, mass = ranked(tokens[best], values[best])
        if mass >= top_p:  # every token ranked after them has at least that mass before it
            return np.sort(order[before < top_p])
        prefix *= PREFIX_GROWTH
    order, before, _ = ranked(tokens, values)
    return np.sort(order[before < top_p])


def ranked(tokens: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``tokens`` (ascending ids) ranked by their probabilities ``values`` (ties by id), the
    mass ranked before each, and the total."""
    rank = np.argsort(-values, kind="stable")
    ordered = values[rank]
    cumulative = np.cumsum(ordered)
    return tokens[rank], cumulative - ordered, float(cumulative[-1])
