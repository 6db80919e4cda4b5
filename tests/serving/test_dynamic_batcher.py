"""DynamicBatcher: real asyncio traffic against a fake ``run_batch`` (no model, short delays)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from contract.model_config import DynamicBatching
from serving.batching import DynamicBatcher
from serving.batching.dynamic import batch_is_full, deadline_for, delay_remaining, is_expired
from serving.errors import (
    DeadlineExceeded,
    Internal,
    ResourceExhausted,
    ServingError,
    Unavailable,
)
from serving.metrics import ServingMetrics

LONG_DELAY_US = 10_000_000  # 10 s: a batch only leaves because it is full, or on stop()


def make_settings(**overrides: Any) -> DynamicBatching:
    """Batching settings for tests: small batches, a short delay, a roomy queue."""
    values: dict[str, Any] = {
        "max_batch_size": 8,
        "max_queue_delay_us": 2_000,
        "max_queue_size": 64,
        "timeout_ms": 5_000,
    }
    values.update(overrides)
    return DynamicBatching(**values)


class FakeModel:
    """A ``run_batch`` that doubles each item, records batches and can fail or block on cue."""

    def __init__(
        self,
        *,
        fail_items: Sequence[int] = (),
        raise_if: Callable[[list[int]], bool] | None = None,
        block_first: bool = False,
    ) -> None:
        self.batches: list[list[int]] = []
        self.fail_items = set(fail_items)
        self.raise_if = raise_if
        self.started = threading.Event()  # set when the first batch begins
        self.release = threading.Event()  # the first batch waits for it when block_first
        if not block_first:
            self.release.set()

    def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        self.started.set()
        self.release.wait(timeout=5)
        if self.raise_if and self.raise_if(items):
            raise RuntimeError("boom")
        return [ValueError(f"bad item {x}") if x in self.fail_items else 2 * x for x in items]

    @property
    def seen(self) -> list[int]:
        return [x for batch in self.batches for x in batch]


async def wait_until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Poll ``condition`` from the event loop (the batch thread cannot await)."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.001)


def run_with_batcher(
    model: FakeModel,
    batching: DynamicBatching,
    body: Callable[[DynamicBatcher[int, int]], Awaitable[Any]],
    **kwargs: Any,
) -> Any:
    """Start a batcher, run ``body`` with it, stop it (draining) and return body's result."""

    async def main() -> Any:
        batcher: DynamicBatcher[int, int] = DynamicBatcher("m", model, batching, **kwargs)
        await batcher.start()
        try:
            return await body(batcher)
        finally:
            model.release.set()
            await batcher.stop()

    return asyncio.run(main())


async def submit_all(batcher: DynamicBatcher[int, int], items: Sequence[int]) -> list[Any]:
    return await asyncio.gather(*(batcher.submit(x) for x in items), return_exceptions=True)


# --- policies ------------------------------------------------------------------------------------


def test_policies_with_plain_numbers() -> None:
    assert batch_is_full(8, 8) and batch_is_full(9, 8) and not batch_is_full(7, 8)
    assert delay_remaining(10.0, 10.0015, 0.002) == pytest.approx(0.0005)
    assert delay_remaining(10.0, 10.003, 0.002) < 0
    assert is_expired(5.0, 5.0) and not is_expired(5.0, 4.9) and not is_expired(None, 1e9)
    assert deadline_for(1.0, 0.5, 30_000) == 1.5  # the client's timeout wins
    assert deadline_for(1.0, None, 2_000) == 3.0
    assert deadline_for(1.0, None, 0) is None  # Triton: 0 = no default deadline


# --- batching ------------------------------------------------------------------------------------


def test_concurrent_submits_are_batched_and_results_map_back() -> None:
    model = FakeModel()
    results = run_with_batcher(
        model,
        make_settings(max_batch_size=8, max_queue_delay_us=20_000),
        lambda b: submit_all(b, range(20)),
    )
    assert results == [2 * x for x in range(20)]
    assert all(1 <= len(batch) <= 8 for batch in model.batches)
    assert max(len(batch) for batch in model.batches) > 1
    assert sorted(model.seen) == list(range(20))


def test_full_batch_leaves_without_waiting_for_the_delay() -> None:
    model = FakeModel()
    start = time.monotonic()
    results = run_with_batcher(
        model,
        make_settings(max_batch_size=4, max_queue_delay_us=LONG_DELAY_US),
        lambda b: submit_all(b, range(4)),
    )
    assert results == [0, 2, 4, 6]
    assert model.batches == [[0, 1, 2, 3]]
    assert time.monotonic() - start < 2


def test_max_queue_delay_flushes_a_partial_batch() -> None:
    model = FakeModel()

    async def body(batcher: DynamicBatcher[int, int]) -> tuple[list[Any], float]:
        start = time.monotonic()
        results = await submit_all(batcher, range(3))
        return results, time.monotonic() - start

    results, elapsed = run_with_batcher(
        model, make_settings(max_batch_size=8, max_queue_delay_us=5_000), body
    )
    assert results == [0, 2, 4]
    assert model.batches == [[0, 1, 2]]
    assert 0.004 <= elapsed < 2  # waited for batch-mates, then flushed


def test_queue_full_is_rejected_while_queued_requests_still_succeed() -> None:
    model = FakeModel(block_first=True)

    async def body(batcher: DynamicBatcher[int, int]) -> list[Any]:
        running = asyncio.ensure_future(batcher.submit(0))
        await wait_until(model.started.is_set)  # item 0 holds the single batch slot
        queued = [asyncio.ensure_future(batcher.submit(x)) for x in (1, 2)]
        await wait_until(lambda: batcher.queue_depth == 2)
        with pytest.raises(ResourceExhausted, match="max_queue_size") as excinfo:
            await batcher.submit(3)
        assert "2 requests" in str(excinfo.value)
        model.release.set()
        return await asyncio.gather(running, *queued)

    results = run_with_batcher(
        model, make_settings(max_batch_size=1, max_queue_size=2, max_queue_delay_us=0), body
    )
    assert results == [0, 2, 4]
    assert 3 not in model.seen


def test_an_item_error_stays_with_its_item() -> None:
    model = FakeModel(fail_items=[3])
    results = run_with_batcher(model, make_settings(), lambda b: submit_all(b, range(8)))
    assert isinstance(results[3], ValueError) and "bad item 3" in str(results[3])
    assert [r for i, r in enumerate(results) if i != 3] == [2 * x for x in range(8) if x != 3]


def test_run_batch_raising_fails_only_that_batch() -> None:
    model = FakeModel(raise_if=lambda items: 3 in items)
    results = run_with_batcher(
        model,
        make_settings(max_batch_size=2, max_queue_delay_us=LONG_DELAY_US),
        lambda b: submit_all(b, range(6)),
    )
    assert model.batches == [[0, 1], [2, 3], [4, 5]]
    for failed in (results[2], results[3]):
        assert isinstance(failed, Internal)
        assert "boom" in str(failed) and "batch of 2" in str(failed)
        assert isinstance(failed.__cause__, RuntimeError)
    assert [results[i] for i in (0, 1, 4, 5)] == [0, 2, 8, 10]


def test_wrong_number_of_results_fails_the_batch_with_internal() -> None:
    async def main() -> list[Any]:
        def drops_one(items: list[int]) -> list[int | BaseException]:
            return list(items[:-1])

        batcher: DynamicBatcher[int, int] = DynamicBatcher("m", drops_one, make_settings())
        await batcher.start()
        try:
            return await submit_all(batcher, range(3))
        finally:
            await batcher.stop()

    results = asyncio.run(main())
    assert all(isinstance(r, Internal) and "2 results for 3 items" in str(r) for r in results)


# --- deadlines, cancellation, stop -------------------------------------------------------------


def test_timeout_gives_deadline_exceeded_and_the_item_never_runs() -> None:
    model = FakeModel(block_first=True)

    async def body(batcher: DynamicBatcher[int, int]) -> int:
        running = asyncio.ensure_future(batcher.submit(0, timeout_s=5))
        await wait_until(model.started.is_set)
        with pytest.raises(DeadlineExceeded, match="timeout_ms"):
            await batcher.submit(1, timeout_s=0.02)
        with pytest.raises(DeadlineExceeded):  # settings.timeout_ms when the client sets none
            await batcher.submit(2)
        assert batcher.queue_depth == 0
        model.release.set()
        return await running

    result = run_with_batcher(
        model, make_settings(max_batch_size=1, max_queue_delay_us=0, timeout_ms=20), body
    )
    assert result == 0
    assert model.seen == [0]


def test_expired_items_are_dropped_before_batching() -> None:
    """The loop drops an item its clock says expired even if the caller's timer has not fired."""
    model = FakeModel(block_first=True)
    now = [0.0]

    async def body(batcher: DynamicBatcher[int, int]) -> int:
        running = asyncio.ensure_future(batcher.submit(0))
        await wait_until(model.started.is_set)
        late = asyncio.ensure_future(batcher.submit(1, timeout_s=1.0))
        await wait_until(lambda: batcher.queue_depth == 1)
        now[0] = 2.0  # the batcher's clock passes item 1's deadline while item 0 runs
        model.release.set()
        with pytest.raises(DeadlineExceeded):
            await late
        return await running

    result = run_with_batcher(
        model, make_settings(max_batch_size=1, max_queue_delay_us=0), body, clock=lambda: now[0]
    )
    assert result == 0
    assert model.seen == [0]


def test_zero_timeout_is_rejected_at_once() -> None:
    model = FakeModel()

    async def body(batcher: DynamicBatcher[int, int]) -> None:
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(1, timeout_s=0)

    run_with_batcher(model, make_settings(), body)
    assert model.seen == []


def test_cancelled_submit_removes_its_item() -> None:
    model = FakeModel(block_first=True)

    async def body(batcher: DynamicBatcher[int, int]) -> int:
        running = asyncio.ensure_future(batcher.submit(0))
        await wait_until(model.started.is_set)
        cancelled = asyncio.ensure_future(batcher.submit(1))
        await wait_until(lambda: batcher.queue_depth == 1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert batcher.queue_depth == 0
        model.release.set()
        return await running

    result = run_with_batcher(model, make_settings(max_batch_size=1, max_queue_delay_us=0), body)
    assert result == 0
    assert model.seen == [0]


def test_enqueued_items_answer_through_their_futures_and_a_withdrawn_one_never_runs() -> None:
    """``enqueue`` (what the engine process uses, no task per request): each future gets its
    own item's outcome; a withdrawn ticket's future is cancelled and its item leaves the queue;
    a ticket past its deadline fails with DEADLINE_EXCEEDED."""
    model = FakeModel(block_first=True, fail_items=[3])

    async def body(batcher: DynamicBatcher[int, int]) -> list[Any]:
        first = batcher.enqueue(0)
        await wait_until(model.started.is_set)
        tickets = [batcher.enqueue(x) for x in (1, 2, 3)]
        late = batcher.enqueue(4, timeout_s=0.02)
        await wait_until(lambda: batcher.queue_depth == 4)
        tickets[1].withdraw()
        assert tickets[1].future.cancelled() and batcher.queue_depth == 3
        with pytest.raises(DeadlineExceeded):
            await late.future  # its timer fired while item 0 blocks the batcher
        late.done()
        model.release.set()
        outcomes = []
        for ticket in (first, tickets[0], tickets[2]):
            try:
                outcomes.append(await ticket.future)
            except ValueError as err:
                outcomes.append(str(err))
            ticket.done()
        return outcomes

    outcomes = run_with_batcher(model, make_settings(max_batch_size=1, max_queue_delay_us=0), body)
    assert outcomes == [0, 2, "bad item 3"]
    assert model.seen == [0, 1, 3]  # neither the withdrawn item nor the expired one ran


def test_stop_with_drain_finishes_queued_work_then_refuses_new() -> None:
    model = FakeModel()

    async def main() -> tuple[list[Any], float]:
        batcher = DynamicBatcher("m", model, make_settings(max_queue_delay_us=LONG_DELAY_US))
        await batcher.start()
        pending = [asyncio.ensure_future(batcher.submit(x)) for x in range(5)]
        await wait_until(lambda: batcher.queue_depth == 5)  # not full: would wait 10 s
        start = time.monotonic()
        await batcher.stop(drain=True)
        elapsed = time.monotonic() - start
        with pytest.raises(Unavailable, match="stopping"):
            await batcher.submit(9)
        return await asyncio.gather(*pending), elapsed

    results, elapsed = asyncio.run(main())
    assert results == [0, 2, 4, 6, 8]
    assert elapsed < 2  # draining flushes at once instead of waiting out the delay


def test_stop_without_drain_fails_queued_work_and_lets_the_running_batch_finish() -> None:
    model = FakeModel(block_first=True)

    async def main() -> list[Any]:
        batcher = DynamicBatcher("m", model, make_settings(max_batch_size=1, max_queue_delay_us=0))
        await batcher.start()
        running = asyncio.ensure_future(batcher.submit(0))
        await wait_until(model.started.is_set)
        queued = [asyncio.ensure_future(batcher.submit(x)) for x in (1, 2)]
        await wait_until(lambda: batcher.queue_depth == 2)
        stopping = asyncio.ensure_future(batcher.stop(drain=False))
        await asyncio.sleep(0.01)
        model.release.set()
        await stopping
        return await asyncio.gather(running, *queued, return_exceptions=True)

    results = asyncio.run(main())
    assert results[0] == 0
    assert all(isinstance(r, Unavailable) for r in results[1:])
    assert model.seen == [0]


def test_submit_before_start_is_unavailable() -> None:
    async def main() -> None:
        batcher = DynamicBatcher("m", FakeModel(), make_settings())
        with pytest.raises(Unavailable, match="start"):
            await batcher.submit(1)

    asyncio.run(main())


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_record_batches_queue_time_and_return_queue_depth_to_zero() -> None:
    metrics = ServingMetrics()
    model = FakeModel()
    results = run_with_batcher(
        model,
        make_settings(max_batch_size=4, max_queue_delay_us=5_000),
        lambda b: submit_all(b, range(10)),
        metrics=metrics,
        stage="classifier",
    )
    assert results == [2 * x for x in range(10)]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    batch_labels = (("model", "m"), ("stage", "classifier"), ("version", ""))
    assert samples[("attnserve_batch_size_count", batch_labels)] == len(model.batches) > 0
    assert samples[("attnserve_batch_size_sum", batch_labels)] == 10
    assert samples[("attnserve_compute_duration_seconds_count", batch_labels)] == len(model.batches)
    model_labels = (("model", "m"), ("version", ""))
    assert samples[("attnserve_queue_duration_seconds_count", model_labels)] == 10
    assert samples[("attnserve_queue_depth", model_labels)] == 0


# --- property ------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(st.integers(-1000, 1000), min_size=0, max_size=30),
    max_batch_size=st.integers(1, 8),
    failing=st.sets(st.integers(0, 29), max_size=10),
)
def test_every_submit_gets_exactly_its_own_outcome(
    items: list[int], max_batch_size: int, failing: set[int]
) -> None:
    # Items are made unique by position so each outcome can be traced to its caller.
    tagged = [(i, x) for i, x in enumerate(items)]
    batches: list[list[tuple[int, int]]] = []

    def run_batch(batch: list[tuple[int, int]]) -> list[Any]:
        batches.append(batch)
        return [ValueError(f"item {i}") if i in failing else (i, 3 * x) for i, x in batch]

    async def main() -> list[Any]:
        batcher = DynamicBatcher(
            "p",
            run_batch,
            make_settings(max_batch_size=max_batch_size, max_queue_delay_us=200),
        )
        await batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.submit(t) for t in tagged), return_exceptions=True
            )
        finally:
            await batcher.stop()

    results = asyncio.run(main())
    assert len(results) == len(tagged)
    for (i, x), result in zip(tagged, results, strict=True):
        if i in failing:
            assert isinstance(result, ValueError) and str(result) == f"item {i}"
        else:
            assert result == (i, 3 * x)
    assert all(1 <= len(batch) <= max_batch_size for batch in batches)
    assert sorted(t for batch in batches for t in batch) == sorted(tagged)
    assert not any(isinstance(r, ServingError) for r in results)


# --- instances: several batches at once -----------------------------------------------------


class ConcurrencyProbe:
    """A ``run_batch`` that records how many calls overlap; each call lasts ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, items: list[int]) -> list[int]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.batches.append(list(items))
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return [2 * x for x in items]


@pytest.mark.parametrize("instances", [1, 2, 3])
def test_instances_bound_the_batches_running_at_once(instances: int) -> None:
    """With ``instances`` N, N batches run at once when the load allows and never more; every
    request still gets its own answer."""
    probe = ConcurrencyProbe(seconds=0.05)
    batching = make_settings(max_batch_size=2, max_queue_delay_us=0, instances=instances)

    async def body(batcher: DynamicBatcher[int, int]) -> list[int]:
        return list(await asyncio.gather(*(batcher.submit(i) for i in range(12))))

    results = run_with_batcher(probe, batching, body)  # type: ignore[arg-type]
    assert results == [2 * i for i in range(12)]
    assert probe.most == instances
    assert sorted(x for batch in probe.batches for x in batch) == list(range(12))
    assert all(len(batch) <= 2 for batch in probe.batches)


def test_stop_waits_for_every_running_batch() -> None:
    """A drain with two batches in flight ends after both, each caller answered."""
    probe = ConcurrencyProbe(seconds=0.1)
    batching = make_settings(max_batch_size=1, max_queue_delay_us=0, instances=2)

    async def main() -> list[int]:
        batcher: DynamicBatcher[int, int] = DynamicBatcher("m", probe, batching)  # type: ignore[arg-type]
        await batcher.start()
        calls = [asyncio.ensure_future(batcher.submit(i)) for i in range(2)]
        await wait_until(lambda: probe.running == 2)
        await batcher.stop(drain=True)
        assert probe.running == 0 and all(call.done() for call in calls)
        return [call.result() for call in calls]

    assert asyncio.run(main()) == [0, 2]
