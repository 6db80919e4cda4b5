"""The decode loop's per-row state arrays (``RowState``) and the all-greedy step that reads and
writes them for every row at once: the same tokens, events and finishes as one row at a time."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from serving.engine.requests import Event, FinishEvent, GenerationRequest, TokenEvent
from serving.engine.row_state import RowState
from serving.engine.slots import SlotsExhausted
from serving.generation.options import DecodingOptions
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)
from tests.serving.test_token_sink import RecordingSink, submit_logged


def test_slots_are_set_for_a_first_step_and_reused() -> None:
    state = RowState(5, 8)
    a, b = state.take(
        [2, 1], 3, min_new=[1, 0], forced_eos_at=[6, -1], limit=[7, 4], route=[11, -1]
    )
    assert a.tolist() == [0, 1] and b.tolist() == [2]
    assert state.next_id[:3].tolist() == [3, 3, 3] and state.limit[:3].tolist() == [7, 7, 4]
    assert state.min_new[:3].tolist() == [1, 1, 0] and state.forced_eos_at[:3].tolist() == [
        6,
        6,
        -1,
    ]
    assert np.isnan(state.last_time[:3]).all() and state.route[:3].tolist() == [11, 11, -1]
    state.generated[a] = 5
    state.last_time[a] = 1.5
    state.tokens[0, :3] = [9, 8, 7]
    assert state.tokens_of(0, 3) == [9, 8, 7]
    state.give_back(a)
    (c,) = state.take([3], 2, min_new=[0], forced_eos_at=[-1], limit=[4], route=[5])
    assert c.tolist() == [0, 1, 3]  # the lowest free slots
    assert state.generated[c].tolist() == [0, 0, 0] and state.next_id[c].tolist() == [2, 2, 2]
    assert np.isnan(state.last_time[c]).all() and state.route[c].tolist() == [5, 5, 5]
    with pytest.raises(SlotsExhausted):
        state.take([2], 2, min_new=[0], forced_eos_at=[-1], limit=[4], route=[-1])


# all greedy: with 4 or more rows the step takes the all-rows path (``GREEDY_PASS_ROWS``)
GREEDY = [
    DecodingOptions(max_new_tokens=12),
    DecodingOptions(max_new_tokens=5),
    DecodingOptions(max_new_tokens=9, min_new_tokens=9),
    DecodingOptions(max_new_tokens=16, min_new_tokens=3),
    DecodingOptions(max_new_tokens=1),
    DecodingOptions(max_new_tokens=20),
]
REQUESTS = 14  # more than the engine's 6 rows: slots are given back and taken again


async def _generate(
    engine: Any, keys: list[int], stagger: float, one_sink: bool = False
) -> list[tuple[int, Event]]:
    """Requests ``keys`` (sources and options by key), submitted in pairs ``stagger`` seconds
    apart (a pair's two share steps however fast the machine): even keys routed to one of two
    sinks, odd ones as events (``one_sink``: every key routed to one sink); all events and sink
    tokens, in arrival order."""
    loop = asyncio.get_running_loop()
    log: list[tuple[int, Event]] = []
    sinks = [RecordingSink(loop, log), RecordingSink(loop, log)]
    ended = []
    for index, key in enumerate(keys):
        options = GREEDY[key % len(GREEDY)]
        request = GenerationRequest(options=options, source_ids=source(key))
        if one_sink:
            request.token_route = (sinks[0], key)
        elif key % 2 == 0:
            request.token_route = (sinks[key % 4 // 2], key)
        ended.append(submit_logged(engine, request, key, log))
        if index % 2:
            await asyncio.sleep(stagger)
    await asyncio.wait_for(asyncio.gather(*ended), 60)
    return log


def test_all_greedy_rows_at_once_match_each_alone(runner_and_config) -> None:  # noqa: F811
    engine = make_engine(runner_and_config, max_active_sequences=6)
    engine.start()
    try:
        alone = {k: asyncio.run(_generate(engine, [k], 0)) for k in range(REQUESTS)}
        steps = engine.steps
        together = asyncio.run(_generate(engine, list(range(REQUESTS)), 0.002))
        together_steps = engine.steps - steps
    finally:
        engine.stop()
    assert together_steps < steps  # they shared steps
    for key in range(REQUESTS):
        events = [event for k, event in together if k == key]
        *streamed, finish = events
        assert isinstance(finish, FinishEvent)
        assert all(isinstance(event, TokenEvent) for event in streamed)
        assert [e.token_id for e in streamed] == finish.tokens
        assert [e.index for e in streamed] == list(range(len(finish.tokens)))
        solo = alone[key][-1][1]
        assert isinstance(solo, FinishEvent)
        assert (finish.tokens, finish.reason) == (solo.tokens, solo.reason), key
        options = GREEDY[key % len(GREEDY)]
        assert options.min_new_tokens <= len(finish.tokens) <= options.max_new_tokens


def _rig(engine: Any) -> None:
    """Make the tiny model's choices tell rows apart: its random weights pick the same token
    for nearly every row, which would hide a token given to the wrong row. The real graphs
    still run every step (in-place cache); the token then chosen is a hash of the row's input
    id, position and source length (EOS now and then, another token where EOS is not yet
    allowed), on both the all-rows path (``step_greedy``) and the per-row one (logits)."""
    from serving.engine.decode_cache import GreedyStep

    cache, spec = engine.cache, engine.spec
    low = max(spec.pad_id, spec.eos_id, spec.decoder_start_id, *spec.suppress_ids) + 1
    real_step, real_greedy = cache.step, cache.step_greedy

    def choose(rows: np.ndarray, ids: np.ndarray, positions: np.ndarray) -> tuple:
        mixed = ids * 31 + positions * 17 + cache.cross_lengths[rows] * 101
        token = low + mixed % (spec.vocab_size - low)
        other = low + (mixed + 1) % (spec.vocab_size - low)  # the best but EOS
        return np.where(mixed % 11 == 0, spec.eos_id, token), other

    def step(rows: np.ndarray, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        logits = np.zeros_like(real_step(rows, ids, positions))
        token, other = choose(rows, ids, positions)
        logits[np.arange(len(rows)), other] = 5.0
        logits[np.arange(len(rows)), token] = 10.0
        return logits

    def step_greedy(rows, ids, positions, no_eos=None) -> GreedyStep:  # type: ignore[no-untyped-def]
        engine.rigged_batches.append(len(rows))
        real_greedy(rows, ids, positions, no_eos)
        token, other = choose(rows, ids, positions)
        if no_eos is not None:
            token = np.where(no_eos & (token == spec.eos_id), other, token)
        return GreedyStep(token, np.full(len(rows), 10.0, np.float32), lambda: None)

    cache.step, cache.step_greedy = step, step_greedy
    engine.rigged_batches = []


@pytest.mark.parametrize("one_sink", [False, True], ids=["two_sinks_and_events", "one_sink"])
def test_all_greedy_rows_at_once_give_each_row_its_own_token(
    runner_and_config,  # noqa: F811
    one_sink: bool,
) -> None:
    if runner_and_config[2] != "inplace":
        pytest.skip("the rig reads the in-place cache's source lengths")
    engine = make_engine(runner_and_config, max_active_sequences=6)
    _rig(engine)
    engine.start()
    try:
        alone = {
            k: asyncio.run(_generate(engine, [k], 0, one_sink))[-1][1] for k in range(REQUESTS)
        }
        together = asyncio.run(_generate(engine, list(range(REQUESTS)), 0, one_sink))
    finally:
        engine.stop()
    assert max(engine.rigged_batches) >= 4  # steps took the all-rows path
    finishes = {k: event for k, event in together if isinstance(event, FinishEvent)}
    assert {f.reason for f in finishes.values()} == {"stop", "length"}  # both ends happen
    assert len({tuple(f.tokens) for f in finishes.values()}) > REQUESTS // 2  # rows differ
    for key in range(REQUESTS):
        solo = alone[key]
        assert isinstance(solo, FinishEvent)
        assert (finishes[key].tokens, finishes[key].reason) == (solo.tokens, solo.reason), key
        streamed = [e.token_id for k, e in together if k == key and isinstance(e, TokenEvent)]
        assert streamed == finishes[key].tokens
