"""The load `attnserve bench serve` puts on one server setup, through ``benchmarks.loadgen``.

Per setup: minimal requests at concurrency 1 (the per-request overhead figure; ``batching`` and
``two_frontends`` only), closed-loop points at each concurrency (``closed_plan``: translator
streaming, unary too under those two, ViT classify), then open-loop points with Poisson arrivals at
set rates or at fractions of the setup's closed-loop peak (``open_plan``). A point during which
other processes used more than ``max_foreign_share`` of the CPU is discarded (recorded) and measured
again. The clients run in ``client_processes`` processes (``loadgen_processes``; one below 8 CPUs).
Each point also records the server's own figures per request (``server_side``, from KServe
``ModelStatistics`` before and after it: ``benchmarks.server_statistics``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.loadgen import Client, Workload, measure
from benchmarks.loadgen_processes import ClientProcesses
from benchmarks.machine import wait_for_quiet
from benchmarks.output import log
from benchmarks.serve_settings import FULL_SETUPS, MINIMAL_SETUPS, ServeSettings
from benchmarks.serve_setups import BATCHING_EDITS
from benchmarks.server_process import ServeProcess
from benchmarks.server_statistics import model_statistics, server_side


def sample_image(size: int = 32, seed: int = 0) -> bytes:
    """A deterministic random RGB PNG (the classifier's answer does not matter here)."""
    from contract.images import encode_png

    rng = np.random.default_rng(seed)
    return encode_png(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8))


def closed_plan(setup: str, models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(model, method) pairs measured in closed loop for a setup."""
    plan = []
    if "translator" in models and "translator" in BATCHING_EDITS[setup]:
        plan.append(("translator", "translate_stream"))
        if setup in FULL_SETUPS:
            plan.append(("translator", "translate"))
    if "vit" in models and "vit" in BATCHING_EDITS[setup]:
        plan.append(("vit", "classify"))
    return plan


def open_plan(setup: str, models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(model, method) pairs measured in open loop for a setup."""
    plan = []
    if "translator" in models and setup in (*FULL_SETUPS, "no_inflight"):
        plan.append(("translator", "translate_stream"))
    if "vit" in models and "vit" in BATCHING_EDITS[setup]:
        plan.append(("vit", "classify"))
    return plan


async def drive_setup(
    server: ServeProcess, setup: str, settings: ServeSettings, language: str, image: bytes
) -> list[dict[str, Any]]:
    """Every load point of ``setup`` against its running ``server``; one record per point. With
    ``settings.client_processes`` > 1 the clients of each point run in that many processes."""
    count = settings.client_processes
    processes = ClientProcesses(count) if count > 1 else None
    try:
        return await SetupDriver(server, setup, settings, language, image, processes).run()
    finally:
        if processes is not None:
            processes.close()


@dataclass
class SetupDriver:
    """Measures the load points of one setup and collects their records."""

    server: ServeProcess
    setup: str
    settings: ServeSettings
    language: str
    image: bytes
    processes: ClientProcesses | None = None  # where the clients run (None: this process)
    points: list[dict[str, Any]] = field(default_factory=list)

    async def run(self) -> list[dict[str, Any]]:
        if self.setup in MINIMAL_SETUPS and "translator" in self.settings.models:
            await self.overhead_point()
        peaks = await self.closed_loop()
        await self.open_loop(peaks)
        return self.points

    async def overhead_point(self) -> None:
        """Minimal requests at concurrency 1: the per-request overhead figure."""
        await self.point(
            "translator",
            "translate",
            "minimal",
            new_tokens=1,
            concurrency=1,
            duration=self.settings.overhead_s,
            warmup=self.settings.warmup_s,
        )

    async def closed_loop(self) -> dict[tuple[str, str], float]:
        """Each closed-loop pair at each concurrency; the peak requests/s per pair."""
        peaks: dict[tuple[str, str], float] = {}
        for model, method in closed_plan(self.setup, self.settings.models):
            for concurrency in self.settings.concurrency:
                record = await self.point(
                    model,
                    method,
                    concurrency=concurrency,
                    duration=self.settings.duration_s,
                    warmup=self.settings.warmup_s,
                )
                peak = max(peaks.get((model, method), 0.0), record["throughput_rps"])
                peaks[(model, method)] = peak
        return peaks

    async def open_loop(self, peaks: dict[tuple[str, str], float]) -> None:
        """Each open-loop pair at the set rates, else at fractions of its closed-loop peak."""
        for model, method in open_plan(self.setup, self.settings.models):
            if self.settings.rates is not None:
                rates = list(self.settings.rates)
            else:
                peak = peaks.get((model, method), 0.0)
                fractions = self.settings.rate_fractions
                rates = [round(peak * f, 2) for f in fractions if peak * f > 0]
            for i, rate in enumerate(rates):
                duration = self.settings.duration_s
                await self.point(model, method, rate=rate, duration=duration, seed=i)

    def workload(self, model: str, method: str, new_tokens: int | None = None) -> Workload:
        """What each request of a point sends (default: ``settings.new_tokens`` tokens)."""
        if method == "classify":
            return Workload(method, model, image=self.image)
        return Workload(
            method,
            model,
            text=self.settings.text,
            language=self.language,
            new_tokens=self.settings.new_tokens if new_tokens is None else new_tokens,
        )

    async def point(
        self,
        model: str,
        method: str,
        name: str = "fixed",
        new_tokens: int | None = None,
        **load: Any,
    ) -> dict[str, Any]:
        """Measure one load point (``load``: loadgen.measure's arguments); its record."""
        workload = self.workload(model, method, new_tokens)
        client = Client(self.server.address, workload, self.settings.connections)
        try:
            await client.wait_ready()
            before = await model_statistics(self.server.address, model)
            result, discarded = await self._measure_quietly(client, f"{model} {method}", load)
            after = await model_statistics(self.server.address, model)
        finally:
            await client.close()
        result["discarded"] = discarded
        result["server_side"] = server_side(before, after)
        record = {
            "model": model,
            "variant": self.setup,
            "method": method,
            "workload": name,
            "loop": "closed" if load.get("concurrency") else "open",
            "concurrency": load.get("concurrency"),
            "rate": load.get("rate"),
            **result,
        }
        _log_point(f"{self.setup} {model} {method} {name}", record)
        self.points.append(record)
        return record

    async def _measure_quietly(
        self, client: Client, what: str, load: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """loadgen.measure, repeated while other processes were busy (the result is marked
        ``noisy`` when the retries ran out); the result and the discarded measurements."""
        limit = self.settings.max_foreign_share
        retries = self.settings.noise_retries
        discarded: list[dict[str, Any]] = []
        for attempt in range(retries + 1):
            result = await measure(
                client, server_cpu=self.server.cpu_seconds, processes=self.processes, **load
            )
            share = result.get("foreign_cpu_share")
            if limit is None or share is None or share <= limit:
                break
            if attempt == retries:
                result["noisy"] = True
                break
            discarded.append(
                {"throughput_rps": result["throughput_rps"], "foreign_cpu_share": share}
            )
            log(f"{self.setup} {what}: other processes used {share:.0%}; repeating")
            await asyncio.to_thread(wait_for_quiet, limit, self.server.processes())
        return result, discarded


def _log_point(what: str, record: dict[str, Any]) -> None:
    tokens = f", {record['tokens_per_s']:.0f} tok/s" if record.get("tokens_per_s") else ""
    where = (
        f"c={record['concurrency']}" if record["concurrency"] else f"rate={record['rate']:.1f}/s"
    )
    log(
        f"{what} {where}: "
        f"{record['throughput_rps']:.1f} req/s{tokens}, "
        f"p50 {record['latency_ms']['p50']} ms, p99 {record['latency_ms']['p99']} ms, "
        f"errors {record['errors']}"
    )
