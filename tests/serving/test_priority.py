"""Priority levels (Triton's ``priority_levels``): the queue order of the dynamic batcher and of
in-flight admission, the level a request's priority resolves to, the config's checks, and the
levels with a queue of their own (``priority_queue_policy``)."""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.model_config import DynamicBatching, InFlightBatching, QueuePolicy, priority_level
from contract.schema import SchemaError, from_mapping
from serving.batching import DynamicBatcher
from serving.batching.priority import insert_by_priority, queue_is_full
from serving.engine.scheduler import AdmissionLimits, AdmissionQueue
from serving.errors import DeadlineExceeded, ResourceExhausted
from tests.serving.test_dynamic_batcher import (
    FakeModel,
    make_settings,
    run_with_batcher,
    wait_until,
)


@dataclasses.dataclass(eq=False)
class Item:
    priority: int
    order: int = 0
    rows: int = 1
    source_tokens: int = 5
    deadline: float | None = None

    def is_cancelled(self) -> bool:
        return False


@given(st.lists(st.integers(min_value=0, max_value=5), max_size=60))
def test_a_queue_is_highest_priority_first_then_first_come(levels: list[int]) -> None:
    """Whatever order the levels arrive in, the queue equals a stable sort by level."""
    queue: deque[Item] = deque()
    items = [Item(level, order) for order, level in enumerate(levels)]
    for item in items:
        insert_by_priority(queue, item)
    assert list(queue) == sorted(items, key=lambda item: item.priority)


@given(
    levels=st.integers(min_value=1, max_value=10),
    data=st.data(),
    requested=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_a_priority_resolves_as_triton_resolves_it(
    levels: int, data: st.DataObject, requested: int
) -> None:
    """1..levels is kept; 0 (none asked) and anything above the levels take the default."""
    default = data.draw(st.integers(min_value=1, max_value=levels))
    section = DynamicBatching(priority_levels=levels, default_priority_level=default)
    level = priority_level(requested, section)
    assert level == (requested if 1 <= requested <= levels else default)
    assert priority_level(requested, DynamicBatching()) == 0  # off: every request is equal


@pytest.mark.parametrize("section", [DynamicBatching, InFlightBatching])
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"priority_levels": 2, "default_priority_level": 0}, r"must be 1\.\.2"),
        ({"priority_levels": 2, "default_priority_level": 3}, r"must be 1\.\.2"),
        ({"priority_levels": 0, "default_priority_level": 1}, "needs priority_levels"),
        ({"priority_levels": -1}, "priority_levels must be >= 0"),
    ],
)
def test_the_config_refuses_a_default_level_outside_the_levels(
    section: Any, fields: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        section(**fields)


def run_order(settings: DynamicBatching, priorities: list[int], max_batch_size: int) -> list[Any]:
    """Item 0 occupies the only instance; items 1.. queue with ``priorities``; the batches."""
    model = FakeModel(block_first=True)
    settings = dataclasses.replace(settings, max_batch_size=max_batch_size, max_queue_delay_us=0)

    async def body(batcher: DynamicBatcher[int, int]) -> None:
        first = batcher.enqueue(0)
        await wait_until(model.started.is_set)
        tickets = [batcher.enqueue(i + 1, priority=p) for i, p in enumerate(priorities)]
        model.release.set()
        for ticket in (first, *tickets):
            await ticket.future
            ticket.done()

    run_with_batcher(model, settings, body)
    return model.batches


def test_the_batcher_takes_the_highest_priority_first() -> None:
    levels = make_settings(priority_levels=3, default_priority_level=2)
    # items 1..6 ask for: 3, 2, 0 (= default 2), 1, 9 (above the levels: default 2), 1
    asked = [3, 2, 0, 1, 9, 1]
    assert run_order(levels, asked, max_batch_size=1) == [[0], [4], [6], [2], [3], [5], [1]]
    assert run_order(levels, asked, max_batch_size=2) == [[0], [4, 6], [2, 3], [5, 1]]
    # without levels the same requests are served first come, first served
    assert run_order(make_settings(), asked, max_batch_size=2) == [[0], [1, 2], [3, 4], [5, 6]]


def test_admission_takes_the_highest_priority_first_and_still_never_skips() -> None:
    limits = AdmissionLimits(max_rows=4, max_queue=10, token_budget=100, max_joiners=8)
    queue: AdmissionQueue[Item] = AdmissionQueue(limits, clock=lambda: 0.0)
    low, beam, urgent, also = Item(2, 0), Item(1, 1, rows=4), Item(1, 2), Item(2, 3)
    for item in (low, beam, urgent, also):
        assert queue.offer(item)
    assert queue.admit(active_rows=1) == []  # the 4-row beam is first and does not fit yet
    assert queue.admit(active_rows=0) == [beam]
    assert queue.admit(active_rows=0) == [urgent, low, also]


# --- priority_queue_policy: a level's own queue limit and default deadline ---------------------


@pytest.mark.parametrize("section", [DynamicBatching, InFlightBatching])
def test_a_queue_policy_must_name_a_level_once(section: Any) -> None:
    levels = {"priority_levels": 2, "default_priority_level": 2}
    with pytest.raises(ValueError, match=r"names level 3; the levels are 1\.\.2"):
        section(**levels, priority_queue_policy=(QueuePolicy(level=3),))
    with pytest.raises(ValueError, match="names level 1 twice"):
        section(**levels, priority_queue_policy=(QueuePolicy(level=1),) * 2)
    with pytest.raises(ValueError, match=r"off \(priority_levels 0\)"):
        section(priority_queue_policy=(QueuePolicy(level=1),))
    with pytest.raises(SchemaError, match="missing required field"):
        from_mapping(section, {**levels, "priority_queue_policy": [{"max_queue_size": 3}]})
    read = from_mapping(section, {**levels, "priority_queue_policy": [{"level": 1}]})
    assert read.priority_queue_policy == (QueuePolicy(level=1),)


@given(
    st.lists(st.integers(min_value=1, max_value=3), max_size=12),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=0, max_value=4),
    st.integers(min_value=0, max_value=4),
)
def test_a_level_with_a_policy_counts_only_its_own_requests(
    waiting: list[int], level: int, shared: int, own: int
) -> None:
    """Level 1 has a queue of its own (``own``); levels 2 and 3 share ``shared``; 0 = no limit."""
    queue = [Item(w) for w in waiting]
    policies = (QueuePolicy(level=1, max_queue_size=own),)
    if level == 1:
        expected = own > 0 and waiting.count(1) >= own
    else:
        expected = shared > 0 and len(waiting) - waiting.count(1) >= shared
    assert queue_is_full(queue, level, shared, policies) is expected
    assert queue_is_full(queue, level, shared) is (shared > 0 and len(waiting) >= shared)


def test_the_batcher_keeps_room_for_a_level_with_its_own_queue() -> None:
    """Default-level requests fill max_queue_size; priority 1 still queues (its own limit, 1),
    a second one is refused naming its limit; a priority-1 request without a deadline gets the
    level's timeout_ms, not the model's."""
    model = FakeModel(block_first=True)
    settings = make_settings(
        max_batch_size=1,
        max_queue_delay_us=0,
        max_queue_size=2,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy=(QueuePolicy(level=1, max_queue_size=1, timeout_ms=30),),
    )

    async def body(batcher: DynamicBatcher[int, int]) -> None:
        first = batcher.enqueue(0)
        await wait_until(model.started.is_set)
        queued = [batcher.enqueue(1), batcher.enqueue(2)]
        with pytest.raises(ResourceExhausted, match=r"2 requests waiting, batching.max_queue"):
            batcher.enqueue(3)
        urgent = batcher.enqueue(4, priority=1)
        with pytest.raises(ResourceExhausted, match="priority_queue_policy level 1"):
            batcher.enqueue(5, priority=1)
        with pytest.raises(DeadlineExceeded):
            await urgent.future  # 30 ms, the level's timeout, while item 0 blocks the batcher
        urgent.done()
        model.release.set()
        for ticket in (first, *queued):
            await ticket.future
            ticket.done()

    run_with_batcher(model, settings, body)
    assert model.seen == [0, 1, 2]


def test_admission_keeps_room_for_a_level_with_its_own_queue() -> None:
    policies = (QueuePolicy(level=1, max_queue_size=1),)
    limits = AdmissionLimits(
        max_rows=4, max_queue=2, token_budget=100, max_joiners=8, policies=policies
    )
    queue: AdmissionQueue[Item] = AdmissionQueue(limits, clock=lambda: 0.0)
    assert queue.offer(Item(2)) and queue.offer(Item(2))
    assert not queue.offer(Item(2))  # the shared limit, 2
    assert queue.offer(Item(1)) and not queue.offer(Item(1))  # level 1's own, 1
    unbounded = AdmissionQueue(dataclasses.replace(limits, max_queue=0, policies=()), lambda: 0.0)
    assert all(unbounded.offer(Item(2)) for _ in range(50))  # 0 = no limit, as in Triton
