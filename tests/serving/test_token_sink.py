"""Tokens in columns (``GenerationRequest.token_route``): the decode loop hands a step's tokens
of every routed request to their sink at once, on the sink's loop, instead of one TokenEvent
each; the engine process sends its frontends a step's tokens this way.

Asserted with the real engine and the tiny translator: every routed request's tokens reach the
sink in order, indices 0..n-1, and equal its finish's tokens, which arrive after them; a sink
call carries several requests' tokens; beam search and requests without a route still get
TokenEvents; with a stream interval no token bypasses the interval.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from serving.engine.requests import Event, FinishEvent, GenerationRequest, TokenEvent
from serving.generation.options import DecodingOptions
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)

ROUTED = [
    DecodingOptions(max_new_tokens=10, min_new_tokens=10),
    DecodingOptions(max_new_tokens=7),
    DecodingOptions(max_new_tokens=12, temperature=0.8, top_k=20, seed=3),
    DecodingOptions(max_new_tokens=9, min_new_tokens=9),
]


class RecordingSink:
    """Records what arrives, in arrival order, together with the requests' other events."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: list[tuple[int, Any]]) -> None:
        self.loop = loop
        self.log = log
        self.calls: list[int] = []  # tokens per call

    def tokens(self, routes: np.ndarray, tokens: np.ndarray, indices: np.ndarray) -> None:
        assert asyncio.get_running_loop() is self.loop
        assert all(np.asarray(c).dtype == np.int64 for c in (routes, tokens, indices))
        self.calls.append(len(routes))
        columns = (np.asarray(c).tolist() for c in (routes, tokens, indices))
        for route, token, index in zip(*columns, strict=True):
            self.log.append((route, TokenEvent(token, index)))


async def generate_routed(engine: Any, options: list[DecodingOptions], routed: int) -> tuple:
    """Submit one request per options (the first ``routed`` with a route); wait for all."""
    loop = asyncio.get_running_loop()
    log: list[tuple[int, Event]] = []
    sink = RecordingSink(loop, log)
    ended: list[asyncio.Future[None]] = []
    for key, opts in enumerate(options):
        request = GenerationRequest(options=opts, source_ids=source(key))
        if key < routed:
            request.token_route = (sink, key)
        ended.append(submit_logged(engine, request, key, log))
    await asyncio.wait_for(asyncio.gather(*ended), 60)
    return log, sink.calls


def submit_logged(
    engine: Any, request: GenerationRequest, key: int, log: list[tuple[int, Event]]
) -> asyncio.Future[None]:
    """Submit ``request``, its events logged under ``key``; done once it finishes."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def listen(events: list[Event]) -> None:
        log.extend((key, event) for event in events)
        if isinstance(events[-1], FinishEvent) and not done.done():
            done.set_result(None)

    engine.submit(request, listen)
    return done


def by_request(log: list[tuple[int, Event]], key: int) -> list[Event]:
    return [event for k, event in log if k == key]


def test_routed_tokens_reach_the_sink_in_columns_before_their_finish(runner_and_config) -> None:  # noqa: F811
    engine = make_engine(runner_and_config)
    engine.start()
    try:
        beam = DecodingOptions(max_new_tokens=6, beam_size=3)
        plain = DecodingOptions(max_new_tokens=8, min_new_tokens=8)
        # the routed ones, a beam search with a route, one without a route
        log, calls = asyncio.run(generate_routed(engine, [*ROUTED, beam, plain], len(ROUTED) + 1))
    finally:
        engine.stop()
    for key in range(len(ROUTED) + 2):
        events = by_request(log, key)
        *streamed, finish = events
        assert isinstance(finish, FinishEvent), events
        assert [e.token_id for e in streamed] == finish.tokens
        assert [e.index for e in streamed] == list(range(len(finish.tokens)))
    routed_tokens = sum(len(by_request(log, k)) - 1 for k in range(len(ROUTED)))
    assert sum(calls) == routed_tokens  # the beam's and the unrouted request's are events
    assert max(calls) > 1  # a step's tokens of several requests in one call


def test_with_a_stream_interval_no_token_bypasses_it(runner_and_config) -> None:  # noqa: F811
    engine = make_engine(runner_and_config, stream_interval_ms=600_000)
    engine.start()
    try:
        log, calls = asyncio.run(generate_routed(engine, ROUTED[:2], 2))
    finally:
        engine.stop()
    assert calls == []
    for key in range(2):
        *streamed, finish = by_request(log, key)
        assert isinstance(finish, FinishEvent)
        assert [e.token_id for e in streamed] == finish.tokens
