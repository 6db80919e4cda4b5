"""Priority levels (Triton's ``priority_levels``): the queue order of the dynamic batcher and of
in-flight admission, the level a request's priority resolves to, and the config's checks."""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.model_config import DynamicBatching, InFlightBatching, priority_level
from serving.batching import DynamicBatcher
from serving.batching.priority import insert_by_priority
from serving.engine.scheduler import AdmissionLimits, AdmissionQueue
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
