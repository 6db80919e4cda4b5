"""Timing the engines on one batch: warm-ups, then interleaved rounds with a noise check.

Per batch size every live runner gets ``warmup`` untimed runs, then ``repetitions`` rounds in
which every runner runs once (the starting runner rotating), so machine noise hits all engines
alike. A timed run during which other processes used more than ``max_foreign_share`` of the CPU
is discarded (recorded) and repeated, at most ``noise_retries`` times. One failing engine is
recorded in ``failed`` and skipped from then on; the others go on.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.engine_settings import EngineSettings
from benchmarks.machine import cpu_snapshot, foreign_cpu_share, wait_for_quiet
from benchmarks.output import log
from benchmarks.peers import Runner

REFERENCE_ENGINE = "hf-generate-kv"  # the outputs every engine's agreement is measured against


@dataclass
class Samples:
    """One runner's timed runs at one batch size."""

    times: list[float] = field(default_factory=list)
    shares: list[float | None] = field(default_factory=list)  # foreign CPU share per kept run
    discarded: list[dict[str, float | None]] = field(default_factory=list)


@dataclass
class BatchTiming:
    """Times runners on one batch of source ids; keeps each runner's last output."""

    settings: EngineSettings
    ids: np.ndarray
    failed: dict[str, str]  # engine name -> why it failed (shared across batches)
    pids: list[int]  # worker processes whose CPU time counts as the benchmark's own
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return len(self.ids)

    def timed(self, runner: Runner) -> tuple[float, float | None] | None:
        """(seconds, share of the CPU other processes used meanwhile), None on failure."""
        if runner.name in self.failed:
            return None
        if self.settings.pause_s:
            time.sleep(self.settings.pause_s)
        snapshot = cpu_snapshot(self.pids)
        try:
            elapsed, out = runner.timed_run(self.ids)
        except Exception as err:  # one engine's failure is recorded, the others go on
            self.failed[runner.name] = f"{type(err).__name__}: {err}"
            log(f"{runner.name} failed at batch {self.batch}: {self.failed[runner.name]}")
            return None
        expected = (self.batch, self.settings.new_tokens)
        if out.shape != expected:
            self.failed[runner.name] = f"produced shape {tuple(out.shape)}, expected {expected}"
            log(f"{runner.name}: {self.failed[runner.name]}")
            return None
        self.outputs[runner.name] = out
        return elapsed, foreign_cpu_share(snapshot, self.pids)

    def warm_up(self, runner: Runner) -> None:
        for _ in range(self.settings.warmup):
            self.timed(runner)

    def measure(self, runner: Runner, rep: int, samples: Samples) -> None:
        """Round ``rep``'s run of ``runner``: a noisy run is discarded and repeated."""
        limit = self.settings.max_foreign_share
        retries = self.settings.noise_retries
        for attempt in range(retries + 1):
            measured = self.timed(runner)
            if measured is None:
                return
            elapsed, share = measured
            noisy = limit is not None and share is not None and share > limit
            if noisy and attempt < retries:
                samples.discarded.append({"seconds": round(elapsed, 6), "share": share})
                log(
                    f"batch {self.batch} round {rep + 1}: {runner.name} {elapsed:.3f} s "
                    f"discarded: other processes used {share:.0%} of the CPU; repeating"
                )
                wait_for_quiet(limit or 0.0, self.pids)
                continue
            samples.times.append(elapsed)
            samples.shares.append(share)
            tokens_s = self.batch * self.settings.new_tokens / elapsed
            log(
                f"batch {self.batch} round {rep + 1}: {runner.name} {elapsed:.3f} s "
                f"({tokens_s:.0f} tok/s, foreign CPU "
                f"{'n/a' if share is None else f'{share:.0%}'})"
            )
            return

    def row(self, runner: Runner, samples: Samples) -> dict[str, Any]:
        """The result row of ``runner`` at this batch size (derived figures come later)."""
        runs = samples.times
        row: dict[str, Any] = {
            "engine": runner.name,
            "family": runner.family,
            "precision": runner.precision,
            "batch": self.batch,
            "runs_s": [round(t, 6) for t in runs],
            "median_s": round(statistics.median(runs), 6) if runs else None,
            "error": self.failed.get(runner.name),
            "foreign_cpu_share_runs": samples.shares,
            "discarded_runs": samples.discarded,
        }
        reference = self.outputs.get(REFERENCE_ENGINE)
        if reference is not None and runner.name in self.outputs:
            agreement = float((self.outputs[runner.name] == reference).mean())
            row["agreement_with_hf"] = round(agreement, 4)
        return row


def bench_batch(
    settings: EngineSettings, runners: list[Runner], ids: np.ndarray, failed: dict[str, str]
) -> list[dict[str, Any]]:
    """Warm up and time every runner not yet failed on ``ids``; one result row per runner."""
    pids = [pid for r in runners if (pid := getattr(r, "pid", None))]
    timing = BatchTiming(settings, ids, failed, pids)
    live = [r for r in runners if r.name not in failed]
    for runner in live:
        timing.warm_up(runner)
    samples = {r.name: Samples() for r in live}
    for rep in range(settings.repetitions):
        if settings.max_foreign_share is not None:  # start every round on a quiet machine
            wait_for_quiet(settings.max_foreign_share, pids)
        order = live[rep % len(live) :] + live[: rep % len(live)]
        for runner in order:
            timing.measure(runner, rep, samples[runner.name])
    return [timing.row(runner, samples[runner.name]) for runner in live]
