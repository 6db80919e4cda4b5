"""``serving.engine.loop_wake.call_soon_threadsafe``: asyncio's hand-off to a loop on another
thread, its wake-up written with the GIL held. Real loops on real threads: every callback runs
once, on the loop's thread, in order per sender, promptly from a sleeping loop; a closed loop
refuses as asyncio does; loops without a self-pipe are woken their own way."""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from serving.engine import loop_wake
from serving.engine.loop_wake import call_soon_threadsafe


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_the_wake_keeps_the_gil() -> None:
    """libc's send through ctypes.PyDLL: called with the GIL held (the point of the module)."""
    assert loop_wake._SEND is not None  # Linux, macOS: libc has send
    flags = loop_wake._SEND._flags_
    assert flags & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_a_sleeping_loop_runs_the_callback_on_its_thread(
    running_loop: asyncio.AbstractEventLoop,
) -> None:
    for _ in range(50):  # the loop sleeps in select between the calls
        ran = threading.Event()
        seen: list[Any] = []

        def record(value: int, ran: threading.Event = ran, seen: list[Any] = seen) -> None:
            seen.append((value, threading.current_thread().name))
            ran.set()

        call_soon_threadsafe(running_loop, record, 7)
        assert ran.wait(5), "the loop was not woken"
        assert seen == [(7, "loop")]


def test_callbacks_from_many_threads_run_once_each_in_order_per_sender(
    running_loop: asyncio.AbstractEventLoop,
) -> None:
    senders, per_sender = 4, 2000
    got: dict[int, list[int]] = {s: [] for s in range(senders)}
    done = threading.Event()
    remaining = [senders * per_sender]

    def record(sender: int, index: int) -> None:  # on the loop: no lock needed
        got[sender].append(index)
        remaining[0] -= 1
        if not remaining[0]:
            done.set()

    def send(sender: int) -> None:
        for index in range(per_sender):
            call_soon_threadsafe(running_loop, record, sender, index)

    threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert done.wait(10)
    assert got == {s: list(range(per_sender)) for s in range(senders)}


def test_a_closed_loop_refuses_as_asyncio_does() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        call_soon_threadsafe(loop, print)
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon_threadsafe(print)  # the same answer


class _OtherLoop:
    """A loop that is not asyncio's selector loop (no self-pipe socket): only the public call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        self.calls.append((callback, args))


def test_other_loops_are_woken_their_own_way() -> None:
    loop = _OtherLoop()
    call_soon_threadsafe(loop, print, 1, 2)  # type: ignore[arg-type]
    assert loop.calls == [(print, (1, 2))]


class _Sink:
    """A token sink on a real loop (the engine process's frontend sinks are such)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.got: list[list[int]] = []
        self.ran = threading.Event()

    def tokens(self, routes: Any, tokens: Any, indices: Any) -> None:
        self.got.append(tokens.tolist())
        self.ran.set()


def test_the_outbox_keeps_the_gil_only_for_the_engine_process_token_columns(
    running_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routed token columns (the engine process's loop) are handed over with the GIL kept;
    a request's events on a caller's loop in this process the way asyncio does."""
    import numpy as np

    from serving.engine import requests
    from serving.engine.requests import FinishEvent, GenerationRequest, Outbox
    from serving.generation.options import DecodingOptions

    kept: list[Any] = []

    def spy(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
        kept.append(loop)
        call_soon_threadsafe(loop, callback, *args)

    monkeypatch.setattr(requests, "call_soon_threadsafe", spy)
    outbox, sink = Outbox(), _Sink(running_loop)
    keys = np.array([0, 1], dtype=np.int64)
    outbox.post_tokens(sink, keys, np.array([5, 6], dtype=np.int64), keys)
    outbox.flush()
    assert sink.ran.wait(5) and sink.got == [[5, 6]]
    assert kept == [running_loop]

    request = GenerationRequest(options=DecodingOptions(), source_ids=np.array([3, 4]))
    channel = request.attach(running_loop)
    outbox.post(request, FinishEvent(reason="stop", tokens=[5]))
    outbox.flush()
    chunk = asyncio.run_coroutine_threadsafe(channel.chunk(), running_loop).result(5)
    assert [type(event) for event in chunk] == [FinishEvent]
    assert kept == [running_loop]  # not again: asyncio's own wake
