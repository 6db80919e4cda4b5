"""Cancelled and expired requests leave the decode loop, waiting or running, although the loop
looks at its requests only after a cancel or once the earliest deadline it knows of has passed.

The engine runs no thread here: the test drives its iterations and its clock, so which step sees
a deadline pass is exact."""

# ruff: noqa: F811 (the fixtures imported from test_engine are parameters here)
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serving.engine.requests import ErrorEvent, Event, FinishEvent, GenerationRequest
from serving.errors import Cancelled, DeadlineExceeded
from serving.generation.options import DecodingOptions
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)

LONG = DecodingOptions(max_new_tokens=20, min_new_tokens=20)  # runs 20 steps, no early EOS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def drive(engine: Any, steps: int) -> None:
    """Run ``steps`` iterations of the engine's decode loop here, each followed by the
    delivery of its events to their listeners on this loop."""
    for _ in range(steps):
        engine._iterate()
        engine._outbox.flush()
        await asyncio.sleep(0)  # the events reach their listeners
    await asyncio.sleep(0)


def _outcome(events: list[Event]) -> type | str | None:
    if not events:
        return None
    last = events[-1]
    if isinstance(last, ErrorEvent):
        return type(last.error)
    return last.reason if isinstance(last, FinishEvent) else None


def _engine_with(runner_and_config, names: list[str], deadlines: dict[str, float]) -> Any:
    """An engine of six rows on a test clock, ``names`` submitted in order (the first six run,
    the rest wait); their requests and event lists."""
    clock = Clock()
    engine = make_engine(runner_and_config, max_active_sequences=6, max_batch_size=6)
    engine.clock = engine.queue.clock = clock
    events: dict[str, list[Event]] = {}
    requests: dict[str, GenerationRequest] = {}
    for key, name in enumerate(names):
        request = GenerationRequest(
            options=LONG, source_ids=source(key), deadline=deadlines.get(name), arrival=0.0
        )
        events[name] = []
        engine.submit(request, events[name].extend)
        requests[name] = request
    return engine, clock, requests, events


def test_deadlines_reach_running_and_waiting_requests(runner_and_config) -> None:
    async def go() -> dict[str, Any]:
        names = ["early", "late", "a", "b", "c", "d", "waiting"]
        deadlines = {"early": 5.0, "late": 10.0, "waiting": 3.0}
        engine, clock, _, events = _engine_with(runner_and_config, names, deadlines)
        await drive(engine, 2)
        assert len(engine.sequences) == 6 and len(engine.queue) == 1
        seen: dict[str, Any] = {}
        for now in (2.9, 3.0, 4.9, 5.0, 9.9, 10.0):
            clock.now = now
            await drive(engine, 1)
            seen[f"at {now}"] = [_outcome(events[n]) for n in ("waiting", "early", "late")]
        await drive(engine, 30)
        seen["rest"] = {n: _outcome(events[n]) for n in ("a", "b", "c", "d")}
        seen["tokens"] = {n: len(events[n][-1].tokens) for n in ("a", "b", "c", "d")}
        seen["active_rows"] = engine.active_rows
        return seen

    seen = asyncio.run(go())
    late = DeadlineExceeded
    assert seen.pop("at 2.9") == [None, None, None]
    assert seen.pop("at 3.0") == [late, None, None]  # while it waited
    assert seen.pop("at 4.9") == [late, None, None]
    assert seen.pop("at 5.0") == [late, late, None]  # while it ran
    assert seen.pop("at 9.9") == [late, late, None]
    assert seen.pop("at 10.0") == [late, late, late]
    assert seen == {
        "rest": dict.fromkeys("abcd", "length"),
        "tokens": dict.fromkeys("abcd", 20),
        "active_rows": 0,
    }


def test_cancels_reach_running_and_waiting_requests(runner_and_config) -> None:
    async def go() -> dict[str, Any]:
        names = ["cancelled", "a", "b", "c", "d", "e", "spare", "cancelled_waiting"]
        engine, _, requests, events = _engine_with(runner_and_config, names, {})
        await drive(engine, 2)
        assert len(engine.sequences) == 6 and len(engine.queue) == 2
        requests["cancelled"].cancel()  # as the caller's loop does: no wake-up of the loop
        requests["cancelled_waiting"].cancel()
        await drive(engine, 1)
        seen: dict[str, Any] = {
            "cancelled": [_outcome(events[n]) for n in ("cancelled", "cancelled_waiting")],
            # the cancelled row went at once, and the waiting request took it
            "joined": (engine.active_rows, len(engine.queue), engine.sequences[-1].request),
        }
        await drive(engine, 30)
        seen["rest"] = {n: _outcome(events[n]) for n in ("a", "b", "c", "d", "e", "spare")}
        seen["active_rows"] = engine.active_rows
        assert seen.pop("joined") == (6, 0, requests["spare"])
        return seen

    assert asyncio.run(go()) == {
        "cancelled": [Cancelled, Cancelled],
        "rest": dict.fromkeys(["a", "b", "c", "d", "e", "spare"], "length"),
        "active_rows": 0,
    }


def test_a_request_cancelled_before_it_is_submitted_never_runs(runner_and_config) -> None:
    async def go() -> list[Event]:
        engine = make_engine(runner_and_config)
        request = GenerationRequest(options=LONG, source_ids=source(1))
        request.cancel()
        events: list[Event] = []
        engine.submit(request, events.extend)
        await drive(engine, 2)
        assert engine.active_rows == 0 and engine.steps == 0
        return events

    events = asyncio.run(go())
    assert len(events) == 1 and _outcome(events) is Cancelled


@pytest.mark.parametrize("cancel_first", [True, False])
def test_a_cancel_between_two_steps_is_never_missed(runner_and_config, cancel_first) -> None:
    """Two cancels on either side of the loop's look: each is seen by the next iteration."""

    async def go() -> list[Any]:
        engine = make_engine(runner_and_config, max_active_sequences=4, max_batch_size=4)
        requests, events = [], []
        for key in range(4):
            request = GenerationRequest(options=LONG, source_ids=source(key))
            events.append([])
            engine.submit(request, events[-1].extend)
            requests.append(request)
        await drive(engine, 1)
        requests[0].cancel()
        if cancel_first:
            requests[1].cancel()
        await drive(engine, 1)
        if not cancel_first:
            requests[1].cancel()
            await drive(engine, 1)
        return [_outcome(e) for e in events] + [engine.active_rows]

    assert asyncio.run(go()) == [Cancelled, Cancelled, None, None, 2]
