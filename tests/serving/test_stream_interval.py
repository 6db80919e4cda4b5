"""``batching.stream_interval_ms``: a stream's tokens leave in one message per interval.

Asserted: ``EventChannel`` hands out every event once, in order, whatever the timing, awaited
or handed to a listener (property test); it never holds the first chunk nor one that ends the
request, and holds the others until the interval has passed; the real engine yields the same
tokens with and without an interval, in at most two chunks under a long one; and over gRPC, one
process and two frontend processes, a stream of the tiny translator arrives in at most three
messages with the same tokens and text as without an interval.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.server_process import ServeProcess
from serving.engine.requests import (
    ErrorEvent,
    Event,
    EventChannel,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from serving.errors import Internal
from serving.generation.options import DecodingOptions
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.harness import copy_repository
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)

TIMEOUT = 60
LONG = 600_000  # ms: an interval no test waits for


def tokens(n: int, start: int = 0) -> list[Event]:
    return [TokenEvent(100 + i, i) for i in range(start, start + n)]


def finish(n: int) -> FinishEvent:
    return FinishEvent(reason="length", tokens=[100 + i for i in range(n)])


async def within(awaitable, seconds: float = 5.0):
    return await asyncio.wait_for(awaitable, seconds)


def test_without_an_interval_each_chunk_is_what_has_arrived() -> None:
    async def go() -> list[list[Event]]:
        channel = EventChannel(asyncio.get_running_loop())
        out = []
        for group in (tokens(1), tokens(3, 1), [*tokens(1, 4), finish(5)]):
            for event in group:
                channel.put(event)
            out.append(await within(channel.chunk()))
        return out

    assert asyncio.run(go()) == [tokens(1), tokens(3, 1), [*tokens(1, 4), finish(5)]]


def test_the_first_chunk_and_the_last_are_never_held() -> None:
    async def go() -> tuple[list[Event], list[Event], float]:
        loop = asyncio.get_running_loop()
        channel = EventChannel(loop, LONG / 1000)
        channel.put(tokens(1)[0])
        first = await within(channel.chunk())  # at once, though the interval is 10 minutes
        started = loop.time()
        taker = asyncio.ensure_future(channel.chunk())
        for event in tokens(3, 1):
            channel.put(event)
            await asyncio.sleep(0.01)
        assert not taker.done()  # held: the interval has not passed
        channel.put(finish(4))
        last = await within(taker)  # the finish releases it at once
        return first, last, loop.time() - started

    first, last, waited = asyncio.run(go())
    assert first == tokens(1)
    assert last == [*tokens(3, 1), finish(4)]
    assert waited < 5


async def held_taker(channel: EventChannel) -> asyncio.Future[list[Event]]:
    """The first token taken from ``channel``, the second put, and a reader of the next chunk
    waiting on it (held: ``channel``'s interval is long)."""
    channel.put(tokens(1)[0])
    await within(channel.chunk())
    channel.put(tokens(1, 1)[0])
    taker = asyncio.ensure_future(channel.chunk())
    await asyncio.sleep(0.01)
    assert not taker.done()
    return taker


def test_an_error_releases_a_held_chunk() -> None:
    async def go() -> list[Event]:
        channel = EventChannel(asyncio.get_running_loop(), LONG / 1000)
        taker = await held_taker(channel)
        channel.put(ErrorEvent(Internal("the decoder failed")))
        return await within(taker)

    chunk = asyncio.run(go())
    assert chunk[0] == tokens(1, 1)[0] and isinstance(chunk[1], ErrorEvent)


def test_a_held_chunk_leaves_once_the_interval_has_passed() -> None:
    interval = 0.15

    async def go() -> tuple[list[list[Event]], list[float]]:
        loop = asyncio.get_running_loop()
        channel = EventChannel(loop, interval)
        chunks, taken = [], []

        async def take() -> None:
            while True:
                chunks.append(await channel.chunk())
                taken.append(loop.time())
                if isinstance(chunks[-1][-1], FinishEvent):
                    return

        taker = asyncio.ensure_future(take())
        for event in tokens(12):  # a token every 20 ms: about 7 per interval
            channel.put(event)
            await asyncio.sleep(0.02)
        channel.put(finish(12))
        await within(taker)
        return chunks, taken

    chunks, taken = asyncio.run(go())
    assert [e for chunk in chunks for e in chunk] == [*tokens(12), finish(12)]
    assert chunks[0] == tokens(1)
    # 12 tokens over about 0.24 s: the first at once, then one chunk per 0.15 s
    assert 2 <= len(chunks) <= 2 + (taken[-1] - taken[0]) / interval
    gaps = [b - a for a, b in itertools.pairwise(taken[:-1])]  # the finish left early
    assert all(gap >= interval * 0.95 for gap in gaps)  # held chunks waited their interval


def test_a_listener_gets_held_chunks_once_the_interval_has_passed() -> None:
    interval = 0.15

    async def go() -> tuple[list[list[Event]], list[float]]:
        loop = asyncio.get_running_loop()
        chunks, taken = [], []

        def listen(chunk: list[Event]) -> None:
            chunks.append(chunk)
            taken.append(loop.time())

        channel = EventChannel(loop, interval, listen)
        for event in tokens(12):  # a token every 20 ms: about 7 per interval
            channel.put(event)
            await asyncio.sleep(0.02)
        channel.put(finish(12))
        return chunks, taken

    chunks, taken = asyncio.run(go())
    assert [e for chunk in chunks for e in chunk] == [*tokens(12), finish(12)]
    assert chunks[0] == tokens(1)  # at once, in put's own call
    assert 2 <= len(chunks) <= 2 + (taken[-1] - taken[0]) / interval
    gaps = [b - a for a, b in itertools.pairwise(taken[:-1])]
    assert all(gap >= interval * 0.95 for gap in gaps)


def test_a_cancelled_taker_leaves_the_channel_usable() -> None:
    async def go() -> list[Event]:
        channel = EventChannel(asyncio.get_running_loop(), LONG / 1000)
        taker = await held_taker(channel)
        taker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taker
        channel.put(finish(2))
        return await within(channel.chunk())

    assert asyncio.run(go()) == [tokens(1, 1)[0], finish(2)]


def test_a_negative_interval_is_refused() -> None:
    async def go() -> None:
        EventChannel(asyncio.get_running_loop(), -0.001)

    with pytest.raises(ValueError, match="interval"):
        asyncio.run(go())


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    pauses=st.lists(st.sampled_from([0, 0, 1, 3]), min_size=12, max_size=12),
    interval_ms=st.sampled_from([0, 1, 5, LONG]),
    ends_in_error=st.booleans(),
    listening=st.booleans(),
)
def test_chunks_hand_out_every_event_once_in_order(
    groups: list[int], pauses: list[int], interval_ms: int, ends_in_error: bool, listening: bool
) -> None:
    """Whatever the arrival pattern (events put in groups, as the decode loop delivers them,
    with pauses of a few ms between groups) and interval, the chunks concatenate to the events
    put, each chunk holds at least one, and only the last chunk holds the final event; awaited
    (``chunk``) or handed to a listener."""
    count = sum(groups)
    final: Event = ErrorEvent(Internal("failed")) if ends_in_error else finish(count)
    expected = [*tokens(count), final]

    async def go() -> list[list[Event]]:
        chunks: list[list[Event]] = []
        ended = asyncio.Event()

        def listen(chunk: list[Event]) -> None:
            chunks.append(chunk)
            if isinstance(chunk[-1], FinishEvent | ErrorEvent):
                ended.set()

        loop = asyncio.get_running_loop()
        channel = EventChannel(loop, interval_ms / 1000, listen if listening else None)

        async def take() -> None:
            if listening:
                await ended.wait()
            while not chunks or not isinstance(chunks[-1][-1], FinishEvent | ErrorEvent):
                chunks.append(await channel.chunk())

        taker = asyncio.ensure_future(take())
        sent = 0
        for size, pause in zip(groups, pauses, strict=False):
            for event in expected[sent : sent + size]:
                channel.put(event)
            sent += size
            await asyncio.sleep(pause / 1000)
        channel.put(final)
        await within(taker)
        return chunks

    chunks = asyncio.run(go())
    assert [e for chunk in chunks for e in chunk] == expected
    assert all(chunks)
    assert not any(isinstance(e, FinishEvent | ErrorEvent) for c in chunks[:-1] for e in c)


def test_the_engine_sends_the_same_tokens_in_at_most_two_chunks(runner_and_config) -> None:  # noqa: F811
    options = DecodingOptions(max_new_tokens=16, min_new_tokens=16)

    async def chunks(interval_ms: int) -> tuple[list[list[Event]], float]:
        engine = make_engine(runner_and_config, stream_interval_ms=interval_ms)
        engine.start()
        try:
            request = GenerationRequest(options=options, source_ids=source(2))
            started = time.monotonic()
            out = [chunk async for chunk in engine.generate_chunks(request)]
            return out, time.monotonic() - started
        finally:
            engine.stop()

    plain, _ = asyncio.run(chunks(0))
    held, seconds = asyncio.run(chunks(LONG))
    # what had arrived (the first token, unless the caller fell behind) at once, then everything
    # else with the finish: the request does not wait out the 10-minute interval. (Without an
    # interval the chunks follow the steps, as many as the caller keeps up with: up to 16.)
    assert len(held) <= 2 and seconds < TIMEOUT
    assert [e for c in held for e in c][:-1] == [e for c in plain for e in c][:-1]  # tokens
    assert held[-1][-1].tokens == plain[-1][-1].tokens  # the finish (its queue time differs)


@pytest.fixture(scope="module")
def interval_servers(tiny_repository: Path, tmp_path_factory) -> Iterator[list[ServeProcess]]:
    repository = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("interval") / "repository",
        translator={"batching": {"stream_interval_ms": LONG}},
    )
    no_metrics = ("--metrics-port", "-1")
    servers = [
        ServeProcess(tiny_repository, *no_metrics),
        ServeProcess(repository, *no_metrics),
        ServeProcess(repository, *no_metrics, "--frontend-workers", "2"),
    ]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def stream(address: str, text: str) -> list[pb.TranslateStreamResponse]:
    options = pb.DecodingOptions(max_new_tokens=12, min_new_tokens=12)
    request = pb.TranslateStreamRequest(text=text, target_language="de", options=options)
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.AttnServeStub(channel).TranslateStream(request, timeout=TIMEOUT))


@pytest.mark.parametrize("text", ["seven hundred and five", "forty-two"])
def test_a_stream_arrives_in_few_messages_with_the_same_text(interval_servers, text) -> None:
    plain, *held = (stream(s.address, text) for s in interval_servers)
    ids = [t for m in plain for t in m.token_ids]
    assert len(ids) == 12  # in up to 13 messages (fewer when the caller fell behind a step)
    for messages in held:  # one process, two frontend processes
        assert [t for m in messages for t in m.token_ids] == ids
        assert "".join(m.delta for m in messages) == "".join(m.delta for m in plain)
        assert messages[-1].finish_reason == plain[-1].finish_reason
        assert messages[-1].usage == plain[-1].usage
        assert len(messages) <= 3  # the first token, the rest, perhaps a closing delta
