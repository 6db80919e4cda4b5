"""The growing KV cache of the ``decoder.onnx`` graph behind the ``DecodeCache`` interface.

Storage is ``BatchKVCache`` (padded numpy arrays, fed whole to every step). Rows get stable names
here; releases and beam reorders only record the new arrangement, which is applied as ONE copy
(``BatchKVCache.keep_rows``) before the next step or admission, as the decode loop always did.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from serving.engine.cache import BatchKVCache
from serving.engine.decode_cache import GreedyStep
from serving.seq2seq import Encoded, Seq2SeqRunner


class PaddedKVCache:
    """``DecodeCache`` over ``BatchKVCache`` and the runner's numpy decoder step.

    Args:
        runner: runs the ``decoder`` graph.
        capacity_tokens: what the usage gauge divides by (rows x position table).
    """

    def __init__(self, runner: Seq2SeqRunner, capacity_tokens: int) -> None:
        spec = runner.spec
        self.runner = runner
        self.capacity_tokens = capacity_tokens
        self.cache = BatchKVCache(spec.num_layers, spec.num_heads, spec.head_dim, runner.kv_dtype)
        self._names: list[int] = []  # the row name of every dense row, pending arrangement
        self._order = np.zeros(0, dtype=np.int64)  # dense rows of the pending arrangement
        self._counter = itertools.count()
        self._suppressed = np.asarray(spec.suppress_ids, dtype=np.int64)  # step_greedy's mask

    @property
    def rows(self) -> int:
        return len(self._names)

    @property
    def tokens(self) -> int:
        self._apply()
        return self.cache.tokens

    def admit(self, encoded: Encoded, rows_per_request: Sequence[int]) -> list[np.ndarray]:
        self._apply()
        repeat = np.repeat(np.arange(len(rows_per_request)), rows_per_request)
        self.cache.add_rows([c[repeat] for c in encoded.cross], encoded.mask[repeat])
        names = [next(self._counter) for _ in repeat]
        self._names += names
        self._order = np.arange(len(self._names), dtype=np.int64)
        split = np.cumsum(rows_per_request)[:-1]
        return np.split(np.asarray(names, dtype=np.int64), split)

    def step(self, rows: np.ndarray, input_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        self._arrange(rows)
        step_mask = self.cache.step_mask()
        encoded = Encoded(self.cache.cross, self.cache.cross_mask)
        logits, presents = self.runner.step(
            input_ids[:, None], positions[:, None], step_mask, self.cache.past, encoded
        )
        self.cache.append(presents, step_mask)
        return logits[:, -1]

    def step_greedy(
        self,
        rows: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        no_eos: np.ndarray | None = None,
    ) -> GreedyStep:
        logits = self.step(rows, input_ids, positions)
        return GreedyStep.of_logits(logits, self._suppressed, self.runner.spec.eos_id, no_eos)

    def reorder(self, rows: np.ndarray, sources: np.ndarray) -> None:
        where = {name: i for i, name in enumerate(self._names)}
        order = self._order.copy()
        for row, source in zip(rows, sources, strict=True):
            order[where[int(row)]] = self._order[where[int(source)]]
        self._order = order

    def release(self, rows: np.ndarray) -> None:
        gone = {int(row) for row in rows}
        keep = [i for i, name in enumerate(self._names) if name not in gone]
        self._names = [self._names[i] for i in keep]
        self._order = self._order[keep]

    def _arrange(self, rows: np.ndarray) -> None:
        """Make the dense rows follow ``rows`` (the decode loop's order), in one copy."""
        if [int(r) for r in rows] != self._names:
            where = {name: i for i, name in enumerate(self._names)}
            self._order = self._order[[where[int(r)] for r in rows]]
            self._names = [int(r) for r in rows]
        self._apply()

    def _apply(self) -> None:
        if len(self._order) != self.cache.rows or not np.array_equal(
            self._order, np.arange(self.cache.rows)
        ):
            self.cache.keep_rows(self._order)
            self._order = np.arange(len(self._names), dtype=np.int64)
