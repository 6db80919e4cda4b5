"""The fixed-capacity KV cache written in place, behind the ``DecodeCache`` interface.

Every row of the cache belongs to at most one sequence (a beam request holds one row per beam).
A joining request takes the lowest free rows and its encoder output is written into them once; a
step runs the leading rows up to the highest one in use (idle rows among them cost compute but
no copies); a finished request's rows are free the moment it ends.

Both caches are bound only as wide as their longest row needs, in powers of two (attention
kernels read every bound position, whatever ``lengths`` say): the self-attention cache widens
when a row is about to outgrow it, the cross-attention cache when a longer source joins, and
both narrow when the rows that needed the width leave. The device side (buffers, bound runs,
re-layouts) is ``serving.backends.onnxruntime_io.InPlaceDecoder``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor

import numpy as np

from serving.backends.onnxruntime_io import InPlaceDecoder, on_host
from serving.engine.decode_cache import GreedyStep
from serving.engine.slots import RowSlots, per_request, rows_to_compute, width_bucket
from serving.seq2seq import Encoded

# A greedy step picks its tokens on the device when its logits hold at least this many values
# (3 MB of floats: 98 rows of an 8,000-token vocabulary). Below, copying the logits and numpy's
# argmax cost less than the extra graph run. Measured with `python -m
# benchmarks.greedy_pick_probe` (Marian-base fp32), ms per step host argmax / device pick: on an
# H100 (2026-11-26 15:00 UTC) batches 1-32 0.72-0.95 (the pick's run costs 0.1-0.5 ms), batch 64
# 0.90-1.00, batch 256 1.30-1.36; on an H200 (21:30 UTC) batch 64 0.82-0.96, batch 128 1.13-1.17,
# batch 256 1.33-1.34: the break-even lies between 64 and 128 rows.
PICK_MIN_LOGITS = 3 << 18


class InPlaceKVCache:
    """``DecodeCache`` over an ``InPlaceDecoder``.

    Args:
        decoder: the device buffers and graphs (its ``rows`` and ``capacity`` bound the cache).
        pad_id: the token idle rows are fed.
        buckets: the batch sizes a step may run (ascending; empty: exactly the rows needed).
    """

    def __init__(self, decoder: InPlaceDecoder, pad_id: int, buckets: tuple[int, ...] = ()) -> None:
        self.decoder = decoder
        self.pad_id = pad_id
        self.buckets = buckets
        self.slots = RowSlots(decoder.rows)
        self.lengths = np.zeros(decoder.rows, dtype=np.int64)  # tokens cached per row
        self.cross_lengths = np.ones(decoder.rows, dtype=np.int64)  # 1 for idle rows
        self.relayouts = 0  # cache re-layouts so far (tests and benchmarks read it)
        self.vocab_size = decoder.logits.shape[-1]
        self.pick_min_logits = PICK_MIN_LOGITS
        self._rows_seen: tuple[np.ndarray | None, bool] = (None, False)  # rows, leading_rows
        self.busy = False  # a step started by start_greedy runs on another thread
        self._refit_due = False  # rows were released meanwhile: re-fit the widths after it
        self._fit("past", 1)  # start narrow: nothing is cached yet
        self._fit("cross", 1)
        self.relayouts = 0

    @property
    def rows(self) -> int:
        return self.slots.used

    @property
    def encoder_device(self) -> tuple[str, int] | None:
        """Where the encoder should leave joiners' cross keys / values for ``admit`` (the
        cache's device; None: on the host)."""
        return self.decoder.encoder_device

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def capacity_tokens(self) -> int:
        return self.decoder.rows * self.decoder.capacity

    def admit(self, encoded: Encoded, rows_per_request: Sequence[int]) -> list[np.ndarray]:
        if self.busy:
            raise RuntimeError("a decoder step is still running on this cache")
        source = encoded.mask.shape[1]
        if source > self.decoder.source_capacity:
            raise ValueError(
                f"an encoder output of {source} positions does not fit the cache's "
                f"{self.decoder.source_capacity} (limits.max_source_length)"
            )
        requests, total = len(rows_per_request), sum(rows_per_request)
        one_each = total == requests  # no beams: the rows as encoded
        repeat = slice(None) if one_each else np.repeat(np.arange(requests), rows_per_request)
        in_use = self.cross_lengths[: self.slots.highest_used() + 1]
        self._fit("cross", max(source, int(in_use.max(initial=1))))
        rows = np.asarray(self.slots.take(total), dtype=np.int64)
        try:
            self.decoder.write_cross(
                rows, encoded.cross if one_each else [on_host(c)[repeat] for c in encoded.cross]
            )
        except BaseException:
            self.slots.give_back(rows)
            raise
        self.lengths[rows] = 0
        self.cross_lengths[rows] = np.maximum(encoded.mask.sum(axis=1)[repeat], 1)
        return per_request(rows, rows_per_request)

    def step(self, rows: np.ndarray, input_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        logits = self.decoder.step(*self._step_inputs(rows, input_ids, positions))
        self.lengths[rows] = positions + 1
        return self._of_rows(logits, rows)

    def step_greedy(
        self,
        rows: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        no_eos: np.ndarray | None = None,
    ) -> GreedyStep:
        """Through the decoder's ``greedy_pick`` graph where it picks on the device and the step's
        logits are at least ``pick_min_logits`` values (they then stay on the device unless
        asked for), else numpy's argmax over the step's whole batch on the host; either way the
        rows' picks are gathered, not their logits."""
        return self.start_greedy(rows, input_ids, positions, no_eos)()

    def start_greedy(
        self,
        rows: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        no_eos: np.ndarray | None = None,
        executor: Executor | None = None,
    ) -> Callable[[], GreedyStep]:
        """``step_greedy``, its device work run by ``executor`` (a thread of its own): returns at
        once, the returned function waits for the step. The cache is ``busy`` until then: rows
        may be released meanwhile (their re-layout waits for the step), not admitted. Without
        ``executor`` the step runs now."""
        if self.busy:
            raise RuntimeError("a decoder step is still running on this cache")
        batch = rows_to_compute(self.slots.highest_used(), self.decoder.rows, self.buckets)
        decoder = self.decoder
        banned_eos = np.zeros(batch, dtype=bool)
        if no_eos is not None:
            banned_eos[rows] = no_eos
        inputs = self._step_inputs(rows, input_ids, positions)
        if executor is not None:  # the caller's arrays and the cache's may change meanwhile
            inputs = (inputs[0].copy(), inputs[1].copy(), inputs[2].copy())
        self.lengths[rows] = positions + 1
        on_host = not decoder.greedy or batch * self.vocab_size < self.pick_min_logits

        def device() -> tuple[np.ndarray, ...]:
            """The device's part: the step, and the pick where the device picks."""
            if on_host:
                return (decoder.step(*inputs),)
            return decoder.step_greedy(*inputs, no_eos=banned_eos)

        def pick(outputs: tuple[np.ndarray, ...]) -> GreedyStep:
            logits: np.ndarray | None = None  # the step's, on the host; None: on the device
            if on_host:
                # numpy's argmax over the step's batch, then the rows' picks (gathering the rows'
                # logits first copied rows x vocab floats whenever they were not the leading rows)
                (logits,) = outputs
                step = GreedyStep.of_logits(logits, decoder.suppressed, decoder.eos_id, banned_eos)
                tokens, best = step.tokens, step.best
            else:
                tokens, best = outputs

            def fetch() -> np.ndarray:
                return self._of_rows(decoder.last_logits() if logits is None else logits, rows)

            return GreedyStep(self._of_rows(tokens, rows), self._of_rows(best, rows), fetch)

        if executor is None:
            done = pick(device())
            return lambda: done
        # only the device's part on the step thread (it holds the GIL least); the pick (on this
        # thread, as everything else of the cache's) after
        future = executor.submit(device)
        self.busy = True

        def result() -> GreedyStep:
            try:
                outputs = future.result()
            finally:
                self.busy = False
                if self._refit_due:
                    self._refit_due = False
                    self._refit()
            return pick(outputs)

        return result

    @property
    def block_steps(self) -> int:
        """Greedy steps one ``step_block`` runs (0: the decoder has no block graph)."""
        block = self.decoder.block
        return 0 if block is None else block.steps

    def block_fits(self, positions: np.ndarray) -> bool:
        """Rows at ``positions`` have room for a block's positions in the cache."""
        return int(positions.max(initial=0)) + self.block_steps <= self.decoder.capacity

    def step_block(
        self,
        rows: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        eos_after: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``block_steps`` greedy steps of ``rows`` in one run (``DecodeBlock``): each row's
        picks and their logits, (rows, steps) each; a row may choose EOS from its step
        ``eos_after`` on. Its keys and values are cached for every step: a row that ends
        earlier leaves them behind its length, where the steps after overwrite them."""
        block = self.decoder.block
        if block is None:
            raise RuntimeError("this decoder has no decode block graph (export --decode-block)")
        if self.busy:
            raise RuntimeError("a decoder step is still running on this cache")
        if not self.block_fits(positions):
            raise ValueError(f"a block from position {positions.max()} runs past the cache")
        self._fit("past", int(positions.max(initial=0)) + block.steps, grow_only=True)
        ids, lengths, cross = self._step_inputs(rows, input_ids, positions)
        after = eos_after
        if len(ids) != len(rows) or not self._leading(rows):
            after = np.zeros(len(ids), dtype=np.int64)
            after[rows] = eos_after
        tokens, best = block.run(ids, lengths, cross, after)
        self.lengths[rows] = positions + block.steps
        return self._of_rows(tokens, rows), self._of_rows(best, rows)

    def _step_inputs(
        self, rows: np.ndarray, input_ids: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The decoder's inputs for a step of ``rows``: every row up to the step's bucket (idle
        ones fed padding at length 0), after widening the cache if a row is about to outgrow it."""
        last = int(positions.max(initial=0))
        if last >= self.decoder.capacity:
            raise ValueError(f"position {last} is past the cache's {self.decoder.capacity}")
        self._fit("past", last + 1, grow_only=True)
        batch = rows_to_compute(self.slots.highest_used(), self.decoder.rows, self.buckets)
        if batch == len(rows) and self._leading(rows):  # every row of the step, in order
            return input_ids, positions, self.cross_lengths[:batch]
        ids = np.full(batch, self.pad_id, dtype=np.int64)
        ids[rows] = input_ids
        lengths = np.zeros(batch, dtype=np.int64)
        lengths[rows] = positions
        return ids, lengths, self.cross_lengths[:batch]

    def reorder(self, rows: np.ndarray, sources: np.ndarray) -> None:
        """Copies only the rows that continue another row (a beam that keeps its own row stays
        put); the copy graph reads every source before it writes."""
        moved = rows != sources
        if not moved.any():
            return
        if not moved.all():
            rows, sources = rows[moved], sources[moved]
        self.decoder.copy_rows(rows, sources)
        self.lengths[rows] = self.lengths[sources]

    def release(self, rows: np.ndarray) -> None:
        self.slots.give_back(rows)
        self.lengths[rows] = 0
        self.cross_lengths[rows] = 1
        if self.busy:  # a step runs on the buffers: their re-layout waits for it
            self._refit_due = True
        else:
            self._refit()

    def _refit(self) -> None:
        """The caches' widths to what the rows in use need."""
        # Free rows hold length 0 and cross length 1: the leading rows up to the highest one in
        # use give the widths the rows in use need.
        end = self.slots.highest_used() + 1
        self._fit("past", int(self.lengths[:end].max(initial=0)) + 1)
        self._fit("cross", int(self.cross_lengths[:end].max(initial=1)))

    def _of_rows(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``values[rows]``; when the rows are 0..n-1 in order, the first n as they are (no
        copy)."""
        return values[: len(rows)] if self._leading(rows) else values[rows]

    def _leading(self, rows: np.ndarray) -> bool:
        """``leading_rows(rows)``, remembered for the last array asked about (the engine passes
        the same rows array each step until a sequence joins or leaves)."""
        seen, leading = self._rows_seen
        if rows is not seen:
            leading = leading_rows(rows)
            self._rows_seen = (rows, leading)
        return leading

    def _fit(self, which: str, needed: int, grow_only: bool = False) -> None:
        """Re-lay out the ``past`` or ``cross`` cache at the width ``needed`` positions take."""
        decoder = self.decoder
        current = decoder.past_width if which == "past" else decoder.source_width
        maximum = decoder.capacity if which == "past" else decoder.source_capacity
        width = width_bucket(needed, maximum)
        if width == current or (grow_only and width < current):
            return
        decoder.resize(which, width, self.slots.highest_used() + 1)
        self.relayouts += 1


def leading_rows(rows: np.ndarray) -> bool:
    """``rows`` is 0, 1, ..., len(rows) - 1."""
    count = len(rows)
    return (
        bool(count)
        and int(rows[0]) == 0
        and int(rows[-1]) == count - 1
        and (count < 3 or bool((np.diff(rows) == 1).all()))
    )
