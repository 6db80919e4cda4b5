"""Rows of a fixed-capacity KV cache: which are free, which to hand out, how many to compute.

No model and no device here: plain integers, so the policies are unit-tested directly.

- A joining request takes the lowest free rows, so active rows stay packed near row 0 and a
  decoder step computes as few idle rows as possible (``rows_to_compute``).
- A finished or cancelled request gives its rows back at once; nothing is copied.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np


class SlotsExhausted(RuntimeError):
    """More rows were asked for than are free (the admission policy should prevent it)."""


class RowSlots:
    """The free / used rows of a cache with ``capacity`` rows.

    Args:
        capacity: rows in the cache (``batching.max_active_sequences``).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a cache needs at least one row, got {capacity}")
        self.capacity = capacity
        self._free = list(range(capacity))  # a heap: the lowest free row comes out first
        self._used: set[int] = set()
        self._highest: int | None = -1  # the highest row in use; None: to be found again

    @property
    def used(self) -> int:
        return len(self._used)

    @property
    def free(self) -> int:
        return self.capacity - len(self._used)

    def take(self, count: int) -> list[int]:
        """The ``count`` lowest free rows, now in use.

        Raises:
            SlotsExhausted: fewer than ``count`` rows are free.
        """
        if count > self.free:
            raise SlotsExhausted(f"{count} rows asked for, {self.free} free of {self.capacity}")
        rows = [heapq.heappop(self._free) for _ in range(count)]
        self._used.update(rows)
        if rows and self._highest is not None:
            self._highest = max(self._highest, max(rows))
        return rows

    def give_back(self, rows: Iterable[int]) -> None:
        """Free ``rows``.

        Raises:
            ValueError: a row that is not in use (freed twice, or never taken).
        """
        for row in rows:
            row = int(row)
            if row not in self._used:
                raise ValueError(f"row {row} is not in use")
            self._used.remove(row)
            heapq.heappush(self._free, row)
            if row == self._highest:
                self._highest = None

    def highest_used(self) -> int:
        """The highest row in use, -1 when none."""
        if self._highest is None:
            self._highest = max(self._used, default=-1)
        return self._highest


def per_request(rows: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """``rows`` taken for requests of ``counts[i]`` rows each, split into each request's rows
    (views; a row each without ``np.split``'s cost)."""
    if len(rows) == len(counts):
        return [rows[index : index + 1] for index in range(len(rows))]
    return np.split(rows, np.cumsum(counts)[:-1])


def rows_to_compute(highest_row: int, capacity: int, buckets: tuple[int, ...] = ()) -> int:
    """How many leading rows a decoder step runs: up to the highest active row.

    Args:
        highest_row: the highest row in use (>= 0).
        capacity: rows in the cache.
        buckets: allowed batch sizes, ascending (CUDA graphs capture one graph per size); empty
            means any size.

    Returns:
        The smallest allowed size covering ``highest_row``, at most ``capacity``.
    """
    needed = highest_row + 1
    for size in buckets:
        if size >= needed:
            return min(size, capacity)
    return needed if not buckets else capacity


def power_of_two_buckets(capacity: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``capacity`` (included even when it is not a power of two)."""
    sizes = []
    size = 1
    while size < capacity:
        sizes.append(size)
        size *= 2
    sizes.append(capacity)
    return tuple(sizes)


MIN_WIDTH = 8  # the narrowest cache width (positions) worth re-laying out for


def width_bucket(needed: int, maximum: int, minimum: int = MIN_WIDTH) -> int:
    """The cache width for rows that need ``needed`` positions: the smallest power of two that
    holds them (at least ``minimum``), at most ``maximum``.

    Widths change by doubling or halving, so a cache is re-laid out O(log capacity) times as its
    longest row grows, and attention never reads more than twice the positions in use.
    """
    width = minimum
    while width < needed:
        width *= 2
    return max(1, min(width, maximum))
