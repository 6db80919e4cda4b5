"""The decode loop's gauges: set at once when a sequence joins or leaves, and between those at
most every ``GAUGE_INTERVAL_S`` (a scrape reads them seconds apart). The test drives the engine's
iterations and its clock."""

# ruff: noqa: F811 (the fixtures imported from test_engine are parameters here)
from __future__ import annotations

import asyncio

from serving.engine.inflight import GAUGE_INTERVAL_S
from serving.engine.requests import GenerationRequest
from serving.metrics import ServingMetrics
from tests.serving.test_dead_requests import LONG, Clock, drive
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)


def test_gauges_follow_joins_and_leaves_at_once_and_tokens_within_the_interval(
    runner_and_config,
) -> None:
    metrics = ServingMetrics()

    def gauges() -> tuple[float | None, ...]:
        def value(name: str) -> float | None:
            return metrics.registry.get_sample_value(
                f"attnserve_{name}", {"model": "translator", "version": ""}
            )

        return value("active_sequences"), value("kv_cache_tokens"), value("queue_depth")

    async def go() -> list[tuple[float | None, ...]]:
        clock = Clock()
        engine = make_engine(runner_and_config, max_active_sequences=3, max_batch_size=3)
        engine.clock = engine.queue.clock = clock
        engine.metrics = metrics
        requests = []
        for key in range(4):  # three run, one waits
            requests.append(GenerationRequest(options=LONG, source_ids=source(key)))
            engine.submit(requests[-1], lambda events: None)
        seen = []
        await drive(engine, 1)  # they join: set at once
        seen.append(gauges())
        await drive(engine, 2)  # tokens grow, nobody joins or leaves, the clock stands still
        seen.append(gauges())
        clock.now = GAUGE_INTERVAL_S
        await drive(engine, 1)
        seen.append(gauges())
        requests[0].cancel()  # it leaves; the waiting one joins
        await drive(engine, 1)
        seen.append(gauges())
        for request in requests[1:]:
            request.cancel()
        await drive(engine, 1)
        seen.append(gauges())
        return seen

    seen = asyncio.run(go())
    assert seen[0] == (3, 3, 1)  # a token each cached (the start token's step)
    assert seen[1] == seen[0]  # not set again within the interval
    assert seen[2] == (3, 12, 1)  # four steps of three rows
    assert seen[3] == (3, 5 + 5 + 1, 0)  # two rows at their fifth step, the joiner at its first
    assert seen[4] == (0, 0, 0)
