"""The frontend's side of the socket, without an engine: what ``EngineClient`` does with the
items of an events message, and when the engine goes away."""

from __future__ import annotations

import asyncio

import numpy as np

from serving.engine.requests import ErrorEvent, FinishEvent, TokenEvent
from serving.errors import Internal, Unavailable
from serving.multiprocess.protocol import encode, events_message
from serving.multiprocess.remote import ENGINE_GONE, EngineClient


def test_items_reach_their_streams_and_calls_and_a_malformed_one_ends_its_stream() -> None:
    async def main() -> tuple[list, list, tuple, tuple]:
        client = EngineClient("/nonexistent.sock")
        (good, good_events), (bad, bad_events) = client.open_stream(), client.open_stream()
        call, answer = client.open_call()
        finish = {"reason": "length", "tokens": [7, 8], "score": None, "alternatives": []}
        items = [
            [good, "token", [7, 0]],
            [bad, "token", "not a pair"],
            [call, "error", ["RESOURCE_EXHAUSTED", "full"]],
            [999, "token", [1, 0]],  # a caller that went away: dropped
            [good, "token", [8, 1]],
            [good, "finish", finish],
        ]
        client._route({"items": items}, [])
        taken = await good_events.chunk(), await bad_events.chunk(), await answer
        _, late = client.open_call()
        client._engine_gone()
        return (*taken, await late)

    good, bad, answer, late = asyncio.run(main())
    assert good == [TokenEvent(7, 0), TokenEvent(8, 1), FinishEvent("length", [7, 8])]
    (error,) = bad  # not left waiting for a final event that will never come
    assert isinstance(error, ErrorEvent) and isinstance(error.error, Internal)
    assert answer == ("error", ["RESOURCE_EXHAUSTED", "full"])
    assert late == ("error", ["UNAVAILABLE", ENGINE_GONE])


def test_streams_open_when_the_engine_goes_end_unavailable() -> None:
    async def main() -> list:
        client = EngineClient("/nonexistent.sock")
        _, events = client.open_stream()
        client._engine_gone()
        return await events.chunk()

    (event,) = asyncio.run(main())
    assert isinstance(event, ErrorEvent) and isinstance(event.error, Unavailable)


def test_a_steps_tokens_reach_their_streams_and_a_malformed_message_is_dropped() -> None:
    async def main() -> tuple[list, list, bool]:
        client = EngineClient("/nonexistent.sock")
        (first, first_events), (second, second_events) = client.open_stream(), client.open_stream()
        call, answer = client.open_call()
        # a step's tokens: both streams, a caller that went away, a classification's id
        client._receive(events_message([], [], ([first, 999, second, call], [7, 1, 4, 2], [0] * 4)))
        malformed = encode({"t": "events", "items": [], "tokens": True}, [np.zeros(2, np.int64)])
        client._receive(malformed)  # logged, dropped
        finish = {"reason": "length", "tokens": [7, 8], "score": None, "alternatives": []}
        # the next step's tokens, then (same message) the first stream's finish
        client._receive(
            events_message([[first, "finish", finish]], [], ([second, first], [5, 8], [1, 1]))
        )
        return await first_events.chunk(), await second_events.chunk(), answer.done()

    first, second, answered = asyncio.run(main())
    assert first == [TokenEvent(7, 0), TokenEvent(8, 1), FinishEvent("length", [7, 8])]
    assert second == [TokenEvent(4, 0), TokenEvent(5, 1)]
    assert not answered  # a classification waits for its result, not for tokens
