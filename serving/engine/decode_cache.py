"""What the decode loop needs from a KV cache, whatever its layout.

Two implementations:

- ``InPlaceKVCache`` (``engine/inplace_cache.py``): a fixed-capacity cache on the execution
  provider's device, rows written in place by the in-place decoder graph; joining and leaving
  copy nothing;
- ``PaddedKVCache`` (``engine/padded_cache.py``): the growing cache of the ``decoder.onnx``
  graph, padded numpy arrays fed every step (backends without IO binding, older exports).

Rows are named by stable integers the cache hands out on ``admit``; a step names the rows it
runs, in any order, and gets their logits in that order. A step in which every row decodes
greedily may ask for ``step_greedy`` instead: each row's argmax, chosen on the device by the
``greedy_pick`` graph where the cache can, with the logits fetched only if asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from serving.generation.sampling import is_in
from serving.seq2seq import Encoded


class GreedyStep:
    """What a greedy step returns, per row in the step's order.

    Attributes:
        tokens: (n,) int64 each row's argmax over the tokens it may choose (never a suppressed
            id, not EOS where the step said ``no_eos``), the lowest id on ties.
        best: (n,) float32 the logit of that token: -inf where no token is allowed, NaN where
            the row holds a NaN (its sampler then decides from ``logits()``).
    """

    def __init__(
        self, tokens: np.ndarray, best: np.ndarray, fetch: Callable[[], np.ndarray]
    ) -> None:
        self.tokens, self.best = tokens, best
        self._fetch: Callable[[], np.ndarray] | None = fetch
        self._logits: np.ndarray | None = None

    @classmethod
    def of_logits(
        cls,
        logits: np.ndarray,
        suppressed: np.ndarray,
        eos_id: int,
        no_eos: np.ndarray | None = None,
    ) -> GreedyStep:
        """The greedy step of logits (n, vocab) on the host: numpy's argmax, taken again without
        the tokens a row may not choose where one of them won (``suppressed`` ids; EOS for the
        rows of ``no_eos``)."""
        tokens = np.argmax(logits, axis=1)  # the first NaN, else the lowest id of the maximum
        best = logits[np.arange(len(tokens)), tokens]
        banned = is_in(tokens, suppressed) if suppressed.size else np.zeros(len(tokens), bool)
        if no_eos is not None:
            banned |= no_eos & (tokens == eos_id)
        banned &= ~np.isnan(best)  # NaN says enough: the sampler decides
        if banned.any():
            allowed = logits[banned]  # a copy
            allowed[:, suppressed] = -np.inf
            if no_eos is not None:
                allowed[no_eos[banned], eos_id] = -np.inf
            tokens[banned] = np.argmax(allowed, axis=1)
            best[banned] = allowed.max(axis=1)
        return cls(tokens, best, lambda: logits)

    def logits(self) -> np.ndarray:
        """The rows' logits (n, vocab), fetched from the device on the first call; valid until
        the cache's next step."""
        if self._logits is None:
            assert self._fetch is not None
            self._logits, self._fetch = self._fetch(), None
        return self._logits


class DecodeCache(Protocol):
    """Self- and cross-attention state of the rows of the running decode batch."""

    @property
    def rows(self) -> int:
        """Rows in use."""
        ...

    @property
    def tokens(self) -> int:
        """Real cached tokens over all rows (the KV-cache gauge)."""
        ...

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache can hold (the usage gauge's denominator)."""
        ...

    def admit(self, encoded: Encoded, rows_per_request: Sequence[int]) -> list[np.ndarray]:
        """Take rows for new requests, each request's encoder row repeated ``rows_per_request``
        times (beams); returns each request's row names."""
        ...

    def step(self, rows: np.ndarray, input_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One decoder step: token ``input_ids[j]`` at position ``positions[j]`` (tokens the row
        has fed before) for row ``rows[j]``; returns the logits (len(rows), vocab), valid until
        the next step (they may be a view of a buffer the next step overwrites)."""
        ...

    def step_greedy(
        self,
        rows: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        no_eos: np.ndarray | None = None,
    ) -> GreedyStep:
        """``step``, returning what greedy decoding needs: each row's argmax over the tokens it
        may choose (never the model's ``suppress_ids``; not EOS where ``no_eos[j]``) and its
        logit, with the logits only on request (on the device until then where they can be)."""
        ...

    def reorder(self, rows: np.ndarray, sources: np.ndarray) -> None:
        """Row ``rows[j]`` continues from row ``sources[j]`` (beam search)."""
        ...

    def release(self, rows: np.ndarray) -> None:
        """Rows of finished or cancelled requests: free them now."""
        ...
