"""An in-flight engine's metrics: stage times and batch sizes, token counts and token times, and
the gauges (summed over a model's instances)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.engine.gauges import GaugeBoard
from serving.engine.row_state import RowState
from serving.engine.step_layout import ActiveSequence, StepLayout
from serving.metrics import ServingMetrics, observe_many

GENERATION = "generation"  # the request_compute stage of a generated request (admission to end)


class EngineMeters:
    """What one engine records for its model; every call does nothing without ``metrics``
    (tests), except the token bookkeeping the rows' times need.

    A step's tokens are counted as they are booked (``count_token`` / ``count_tokens``) and
    recorded once per step (``count_new_tokens``): one ``generated_tokens`` increment, and one
    ``time_per_output_token`` observation per group of rows whose last token came at the same
    time.

    Args:
        name: the model's name (the metrics' ``model`` label).
        metrics: where to record; None in tests.
        state: the engine's rows (their last token times).
        instance: the engine's index among the model's instances.
        gauge_board: where the instances' gauges are summed; None for one instance.
        version: the model's version (the ``version`` label; its ``model`` label: ``name``).
    """

    def __init__(
        self,
        name: str,
        metrics: ServingMetrics | None,
        state: RowState,
        instance: int = 0,
        gauge_board: GaugeBoard | None = None,
        version: str = "",
    ) -> None:
        self.name = name
        self.version = version
        self.metrics = metrics
        self.instance = instance
        self.gauge_board = gauge_board
        self._state = state
        self._children: dict[tuple[str, str | None], Any] = {}  # by (metric, stage)
        self._new_tokens = 0  # tokens counted this step (one generated_tokens.inc each)
        self._token_gaps: dict[float, int] = {}  # this step's rows by their last token time

    def observe(self, metric: str, value: float, stage: str | None = None) -> None:
        if self.metrics is not None:
            self.child(metric, stage).observe(value)

    def batched(self, stage: str, seconds: float, size: int) -> None:
        """One batched call of ``stage`` over ``size`` requests or sequences: its time and size."""
        if self.metrics is not None:
            self.child("compute_time", stage).observe(seconds)
            self.child("batch_size", stage).observe(size)

    def request_computed(self, seconds: float) -> None:
        """A request's generation ended ``seconds`` after its admission began (its encoder pass
        and every step it took part in): its compute, stage ``generation``."""
        if self.metrics is not None:
            self.child("request_compute", GENERATION).inc(seconds)

    def child(self, metric: str, stage: str | None = None) -> Any:
        """The metric's child for this model (and ``stage``), looked up once (``labels()`` costs
        more than the observation itself, and the decode loop observes per token; a key of
        keyword labels cost three times the observation)."""
        key = (metric, stage)
        child = self._children.get(key)
        if child is None:
            assert self.metrics is not None
            labels = {"model": self.name, "version": self.version}
            if stage is not None:
                labels["stage"] = stage
            child = getattr(self.metrics, metric).labels(**labels)
            self._children[key] = child
        return child

    def set(self, gauge: str, value: float) -> None:
        """Set the model's ``gauge`` from this instance's ``value``."""
        if self.metrics is None:
            return
        if self.gauge_board is not None:  # the model's value: all its instances together
            value = self.gauge_board.update(self.instance, gauge, value)
        self.child(gauge).set(value)

    def count_token(self, seq: ActiveSequence, now: float) -> None:
        """A token of ``seq`` at ``now``: its time to first token, or a gap to its last one."""
        last = float(self._state.last_time[seq.slot])
        if last != last:  # NaN: its first token
            self.observe("time_to_first_token", now - seq.request.arrival)
        else:  # observed in count_new_tokens: rows with the same last token time, at once
            self._token_gaps[last] = self._token_gaps.get(last, 0) + 1
        self._state.last_time[seq.slot] = now
        self._new_tokens += 1

    def count_tokens(
        self, layout: StepLayout, sequences: Sequence[ActiveSequence], now: float
    ) -> None:
        """``count_token`` for every sequence of a step of one row each (``layout`` of
        ``sequences``)."""
        times = self._state.last_time
        count = len(layout.slots)
        self._new_tokens += count
        gaps = self._token_gaps
        if self.metrics is not None and layout.stepped_at is not None:
            # the layout's last step gave its first ``fresh`` sequences a token: one gap for
            # all; those that joined since take their first
            if layout.fresh:
                gaps[layout.stepped_at] = gaps.get(layout.stepped_at, 0) + layout.fresh
            for index in range(layout.fresh, count):
                self.observe("time_to_first_token", now - sequences[index].request.arrival)
        elif self.metrics is not None:
            last = times[layout.slots]
            first = np.isnan(last)
            for index in np.flatnonzero(first).tolist():
                self.observe("time_to_first_token", now - sequences[index].request.arrival)
            if not first.any() and last[0] == last[-1] and (last == last[0]).all():
                gaps[float(last[0])] = gaps.get(float(last[0]), 0) + len(last)
            else:
                before, rows = np.unique(last[~first], return_counts=True)
                for time_, count_ in zip(before.tolist(), rows.tolist(), strict=True):
                    gaps[time_] = gaps.get(time_, 0) + count_
        times[layout.slots] = now
        layout.stepped_at, layout.fresh = now, count

    def count_new_tokens(self, now: float) -> None:
        """The step's token counts: generated tokens, and the time per output token of the rows
        that had one before (``now`` minus their last token time, one observation each)."""
        if self.metrics is not None:
            if self._new_tokens:
                self.child("generated_tokens").inc(self._new_tokens)
            if self._token_gaps:
                per_token = self.child("time_per_output_token")
                for last, rows in self._token_gaps.items():
                    observe_many(per_token, now - last, rows)
        self._new_tokens = 0
        self._token_gaps.clear()

    def drop_gaps(self) -> None:
        """Forget the token gaps counted so far (a step that failed part-way counted some of
        its rows)."""
        self._token_gaps.clear()
