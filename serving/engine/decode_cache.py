"""What the decode loop needs from a KV cache, whatever its layout.

Two implementations:

- ``InPlaceKVCache`` (``engine/inplace_cache.py``): a fixed-capacity cache on the execution
  provider's device, rows written in place by the in-place decoder graph; joining and leaving
  copy nothing;
- ``PaddedKVCache`` (``engine/padded_cache.py``): the growing cache of the ``decoder.onnx``
  graph, padded numpy arrays fed every step (backends without IO binding, older exports).

Rows are named by stable integers the cache hands out on ``admit``; a step names the rows it
runs, in any order, and gets their logits in that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from serving.seq2seq import Encoded


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

    def reorder(self, rows: np.ndarray, sources: np.ndarray) -> None:
        """Row ``rows[j]`` continues from row ``sources[j]`` (beam search)."""
        ...

    def release(self, rows: np.ndarray) -> None:
        """Rows of finished or cancelled requests: free them now."""
        ...
