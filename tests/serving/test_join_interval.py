"""``batching.join_interval_steps``: waiting requests join a running batch at most every N decode
steps, their encoder passes run as one batch (TGI's max_waiting_tokens).

Asserted with the real engine on the tiny translator, its decode loop driven step by step (no
thread): with an interval of 4, requests that arrive one per step while a long one decodes join
together 4 steps after the last join, in one encoder batch; an idle batch and a full encoder
batch (max_batch_size waiting) take requests at once; an interval of 1 joins each at the next
step; the tokens are those of the same requests decoded alone.
"""

from __future__ import annotations

import asyncio

import pytest

from contract.model_config import InFlightBatching
from contract.schema import SchemaError, from_mapping
from serving.engine.requests import Event, FinishEvent, GenerationRequest
from serving.generation.options import DecodingOptions
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)

LONG = DecodingOptions(max_new_tokens=18, min_new_tokens=18)
SHORT = DecodingOptions(max_new_tokens=6, min_new_tokens=6)


async def drive(engine, arrivals: dict[int, int], steps: int) -> tuple[list, list, dict]:
    """Submit the long request, then ``arrivals[step]`` short ones before each step; run
    ``steps`` iterations. Returns the encoder batch sizes, the joins (step, how many) and each
    request's events."""
    encoded: list[int] = []
    encode = engine._encode
    engine._encode = lambda joiners: encoded.append(len(joiners)) or encode(joiners)
    events: dict[int, list[Event]] = {}

    def submit(key: int, options: DecodingOptions) -> None:
        request = GenerationRequest(options=options, source_ids=source(key))
        events[key] = []
        engine.submit(request, lambda chunk, key=key: events[key].extend(chunk))

    submit(0, LONG)
    joins, key = [], 1
    for step in range(steps):
        for _ in range(arrivals.get(step, 0)):
            submit(key, SHORT)
            key += 1
        before = len(encoded)
        engine._iterate()
        engine._outbox.flush()
        if len(encoded) > before:
            joins.append((step, encoded[-1]))
        await asyncio.sleep(0)  # the events reach their listeners
    await asyncio.sleep(0)
    return encoded, joins, events


def run(setup, interval: int, arrivals: dict[int, int], steps: int = 24, **more):
    engine = make_engine(setup, join_interval_steps=interval, **more)
    return asyncio.run(drive(engine, arrivals, steps))


def test_requests_join_together_every_interval(runner_and_config) -> None:  # noqa: F811
    arrivals = {2: 1, 3: 1, 4: 1, 5: 1, 6: 1}  # one request before each of steps 2..6
    _, joins, events = run(runner_and_config, 4, arrivals)
    # step 0: the long one into the idle batch; then at most every 4 steps
    assert joins == [(0, 1), (4, 3), (8, 2)]
    _, every_step, alone = run(runner_and_config, 1, arrivals)
    assert every_step == [(0, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
    for key, got in events.items():  # the same tokens, whenever they joined
        assert isinstance(got[-1], FinishEvent) and got[-1].tokens == alone[key][-1].tokens


def test_a_full_encoder_batch_joins_at_once(runner_and_config) -> None:  # noqa: F811
    _, joins, _ = run(runner_and_config, 8, {1: 1, 2: 3}, steps=6, max_batch_size=3)
    # 4 waiting at step 2 (>= max_batch_size 3): 3 join at once; the fourth waits its 8 steps
    assert joins == [(0, 1), (2, 3)]


def test_the_interval_is_at_least_one() -> None:
    with pytest.raises(SchemaError, match="join_interval_steps"):
        from_mapping(InFlightBatching, {"join_interval_steps": 0})
