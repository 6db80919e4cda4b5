"""The decode batch's KV cache: one padded array per layer, rows joining and leaving between steps.

Layout: every row's real entries are right-aligned, holes (zeros in ``self_mask``) on the left.
Each decoder step appends one column for every row (the graph returns past + new), so the cache
never needs per-row writes; rows that join start with an all-hole past; leading columns that are
holes in every row are trimmed away. Cross-attention keys/values are padded along the source
axis to the longest source in the batch, with ``cross_mask`` marking the real positions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class BatchKVCache:
    """Past self-attention K/V and cross K/V of the rows of the running decode batch."""

    def __init__(
        self, num_layers: int, num_heads: int, head_dim: int, dtype: npt.DTypeLike
    ) -> None:
        self.num_kv = 2 * num_layers  # key and value per layer
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = np.dtype(dtype)
        self.past: list[np.ndarray] = [self._empty(0, 0) for _ in range(self.num_kv)]
        self.self_mask = np.zeros((0, 0), dtype=np.int64)
        self.cross: list[np.ndarray] = [self._empty(0, 0) for _ in range(self.num_kv)]
        self.cross_mask = np.zeros((0, 0), dtype=np.int64)

    def _empty(self, rows: int, length: int) -> np.ndarray:
        return np.zeros((rows, self.num_heads, length, self.head_dim), dtype=self.dtype)

    @property
    def rows(self) -> int:
        return int(self.self_mask.shape[0])

    @property
    def length(self) -> int:
        """Columns of the past (longest row plus holes)."""
        return int(self.self_mask.shape[1])

    @property
    def tokens(self) -> int:
        """Real cached tokens over all rows (what the KV-cache gauge reports)."""
        return int(self.self_mask.sum())

    def add_rows(self, cross: list[np.ndarray], cross_mask: np.ndarray) -> range:
        """Append rows with an empty past and their cross K/V; returns their row indices.

        Args:
            cross: per-layer cross key/value arrays for the new rows, each (n, H, S_new, D).
            cross_mask: (n, S_new) source mask of the new rows.
        """
        count = int(cross_mask.shape[0])
        first = self.rows
        width = max(self.cross_mask.shape[1], cross_mask.shape[1])
        self.cross = [
            np.concatenate([_pad_axis(old, 2, width), _pad_axis(new.astype(self.dtype), 2, width)])
            for old, new in zip(self.cross, cross, strict=True)
        ]
        self.cross_mask = np.concatenate(
            [_pad_axis(self.cross_mask, 1, width), _pad_axis(cross_mask.astype(np.int64), 1, width)]
        )
        self.past = [np.concatenate([p, self._empty(count, self.length)]) for p in self.past]
        self.self_mask = np.concatenate(
            [self.self_mask, np.zeros((count, self.length), dtype=np.int64)]
        )
        return range(first, first + count)

    def keep_rows(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (in this order): leaving rows free their cache at once.

        Also serves beam search: repeating a parent row index copies its cache. Leading columns
        that only the leaving rows used are cut in the same copy.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            self._clear()
            return
        self_mask = self.self_mask[rows]
        used = np.flatnonzero(self_mask.any(axis=0))
        start = int(used[0]) if used.size else self_mask.shape[1]
        cross_mask = self.cross_mask[rows]
        used_src = np.flatnonzero(cross_mask.any(axis=0))
        width = int(used_src[-1]) + 1 if used_src.size else 0
        self.past = [p[rows, :, start:] for p in self.past]
        self.self_mask = self_mask[:, start:]
        self.cross = [c[rows, :, :width] for c in self.cross]
        self.cross_mask = cross_mask[:, :width]

    def step_mask(self) -> np.ndarray:
        """The self-attention mask for one new token per row: past mask plus a column of ones."""
        return np.concatenate([self.self_mask, np.ones((self.rows, 1), dtype=np.int64)], axis=1)

    def append(self, presents: list[np.ndarray], step_mask: np.ndarray) -> None:
        """Take the decoder's present K/V (past + the new token) as the new past."""
        self.past = presents
        self.self_mask = step_mask

    def _clear(self) -> None:
        self.past = [self._empty(0, 0) for _ in range(self.num_kv)]
        self.self_mask = np.zeros((0, 0), dtype=np.int64)
        self.cross = [self._empty(0, 0) for _ in range(self.num_kv)]
        self.cross_mask = np.zeros((0, 0), dtype=np.int64)


def _pad_axis(array: np.ndarray, axis: int, width: int) -> np.ndarray:
    """Zero-pad ``array`` at the end of ``axis`` up to ``width``."""
    missing = width - array.shape[axis]
    if missing <= 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[axis] = (0, missing)
    return np.pad(array, pad)
