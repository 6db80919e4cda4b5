"""A frontend process's handle on the engine process: one socket, and per model an engine or a
batcher with the interface the served models use in-process (``GenerationEngine``,
``Batcher``), so every servicer, input check and response path is the same code in both modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from serving.engine.requests import (
    ErrorEvent,
    Event,
    EventChannel,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from serving.errors import Internal, Unavailable
from serving.metrics import ServingMetrics
from serving.multiprocess.framing import Frames, MessageConnection
from serving.multiprocess.protocol import (
    ProtocolError,
    decode,
    encode,
    event_from,
    options_payload,
    tokens_from,
)
from serving.multiprocess.shm import TensorArena, send_hello

log = logging.getLogger(__name__)

ENGINE_CHECK_S = 0.2  # how often a frontend checks that the engine process lives
ENGINE_GONE = "the engine process stopped; retry on another replica"
Item = tuple[str, Any]  # (kind, payload) of one event from the engine
# applies a model change of the engine process (op "load" | "unload", model name) to the
# frontend's own models (serving.model_control)
ModelChange = Callable[[str, str], Awaitable[None]]


class EngineClient:
    """The frontend's connection to the engine: requests out, their events routed to each caller.

    Args:
        address: the engine's Unix socket path.
        engine_pid: the engine process; when it dies (or the connection closes) every waiting
            caller gets UNAVAILABLE.
        arena_bytes: shared memory for the arrays this frontend sends (``shm``); 0: none, every
            array travels in the socket.
        arena_min_bytes: smaller arrays travel in the socket all the same.
        metrics: where the larger arrays are counted by the way they went.
    """

    def __init__(
        self,
        address: str,
        engine_pid: int | None = None,
        arena_bytes: int = 0,
        arena_min_bytes: int = 0,
        metrics: ServingMetrics | None = None,
    ) -> None:
        self.address = address
        self.engine_pid = engine_pid
        self.arena_bytes = arena_bytes
        self.arena_min_bytes = arena_min_bytes
        self.arena: TensorArena | None = None
        self._large = (
            None
            if metrics is None
            else tuple(  # by "went through the socket": False, True
                metrics.frontend_large_arrays.labels(path=path)
                for path in ("shared_memory", "socket")
            )
        )
        self._sent = 0  # messages sent; the engine's "ack" counts those it has read
        self.alive = True
        self._ids = itertools.count(1)
        # per request id: a generation's events (channel) or a classification's answer (future)
        self._waiting: dict[int, EventChannel | asyncio.Future[Item]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._connection: MessageConnection | None = None
        self._outbox: list[list[bytes | memoryview]] = []  # this loop turn's, not yet written
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.on_model_change: ModelChange | None = None
        # by op ("trace", "log"): applies a settings change (model, parsed settings) here
        self.on_settings: dict[str, Callable[[str, Any], None]] = {}

    async def start(self) -> None:
        """Connect to the engine process.

        Raises:
            OSError: nothing listens at ``address``.
        """
        self._loop = asyncio.get_running_loop()
        connection = self._connection = MessageConnection(self._receive, self._lost)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await self._loop.sock_connect(sock, self.address)
            if self.arena_bytes:
                try:
                    self.arena = TensorArena(self.arena_bytes)
                except OSError as err:
                    log.warning("no shared memory for tensors (%s): they use the socket", err)
            send_hello(sock, self.arena)
            await self._loop.create_unix_connection(lambda: connection, sock=sock)
        except BaseException:
            sock.close()
            raise
        if self.engine_pid is not None:
            self._tasks.append(asyncio.create_task(self._watch(), name="engine-watch"))

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks)  # a finished model change takes itself off the list
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._connection is not None:
            self._connection.close()
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def open_stream(self) -> tuple[int, EventChannel]:
        """A new request id and the channel its events arrive in (a generation).

        Raises:
            Unavailable: the engine process is gone.
        """
        channel = EventChannel(asyncio.get_running_loop())
        return self._open(channel), channel

    def open_call(self) -> tuple[int, asyncio.Future[Item]]:
        """A new request id and the future its one answer arrives in (a classification).

        Raises:
            Unavailable: the engine process is gone.
        """
        future: asyncio.Future[Item] = asyncio.get_running_loop().create_future()
        return self._open(future), future

    def _open(self, waiter: EventChannel | asyncio.Future[Item]) -> int:
        if not self.alive:
            raise Unavailable(ENGINE_GONE)
        request_id = next(self._ids)
        self._waiting[request_id] = waiter
        return request_id

    def forget(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)

    async def ask(self, message: dict[str, Any]) -> None:
        """Send ``message`` (its ``id`` added) and wait for the engine's ``done`` (model control,
        trace settings).

        Raises:
            ServingError: what the engine process answered instead (NotFound, ...).
        """
        request_id, answer = self.open_call()
        try:
            self.send({**message, "id": request_id})
            kind, payload = await answer
        finally:
            self.forget(request_id)
        if kind != "done":
            event = _event(kind, payload)
            assert isinstance(event, ErrorEvent), event
            raise event.error

    def send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Queue a message for the engine; the messages of one event-loop turn leave in one
        write (one system call here, fewer reads in the engine process), in order."""
        if self._connection is None or self._loop is None:
            return
        self._sent += 1
        place = functools.partial(self._place, seq=self._sent) if arrays else None
        self._outbox.append(encode(header, arrays, place))
        if len(self._outbox) == 1:
            self._loop.call_soon(self._flush)

    def _place(self, array: np.ndarray, seq: int) -> int | None:
        """Where a large array of message ``seq`` lies in the arena; None: in the socket."""
        if array.nbytes < max(self.arena_min_bytes, 1):
            return None
        offset = None if self.arena is None else self.arena.put(array, seq)
        if self._large is not None:
            self._large[offset is None].inc()
        return offset

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self._connection is not None:
            self._connection.send_many(outbox)

    def _receive(self, frames: Frames) -> None:
        try:
            header, arrays = decode(frames)
            self._route(header, arrays)
        except ProtocolError:
            log.exception("malformed message from the engine process; dropped")

    def _route(self, header: dict[str, Any], arrays: list[np.ndarray]) -> None:
        if self.arena is not None and isinstance(ack := header.get("ack"), int):
            self.arena.release(ack)
        if header.get("tokens"):
            self._route_tokens(arrays[-3:])
        for request_id, kind, payload in header.get("items", []):
            if request_id == 0:  # not a request's: a model change
                self._model_change(kind, payload)
                continue
            waiter = self._waiting.get(request_id)
            if waiter is None:  # the caller went away; its cancel is on its way
                continue
            if isinstance(waiter, EventChannel):
                waiter.put(_event(kind, payload))
            elif not waiter.done():
                if kind == "result":  # the array; a traced one's with its batch times
                    times = isinstance(payload, list)
                    payload = (arrays[payload[0]], payload[1:]) if times else arrays[payload]
                waiter.set_result((kind, payload))

    def _model_change(self, kind: str, payload: Any) -> None:
        if kind != "model" or not isinstance(payload, dict):
            log.error("unknown message %r from the engine process; dropped", kind)
            return
        task = asyncio.ensure_future(self._apply(payload))
        self._tasks.append(task)
        task.add_done_callback(lambda done: self._tasks.remove(done))

    async def _apply(self, change: dict[str, Any]) -> None:
        """Apply the engine's model change here, then say so (with the error, if any)."""
        error = None
        try:
            op, model = str(change["op"]), str(change["model"])
            if op in self.on_settings:
                self.on_settings[op](model, change["settings"])
            elif self.on_model_change is not None:
                await self.on_model_change(op, model)
        except Exception as err:
            log.exception("cannot apply the engine process's model change %r", change)
            error = f"{type(err).__name__}: {err}"
        self.send({"t": "applied", "id": change["seq"], "error": error})

    def _route_tokens(self, arrays: list[np.ndarray]) -> None:
        waiting = self._waiting
        for request_id, token, index in tokens_from(arrays):
            waiter = waiting.get(request_id)
            if isinstance(waiter, EventChannel):  # None: the caller went away
                waiter.put(TokenEvent(token, index))

    def _lost(self) -> None:
        if not self._closing:
            log.error("the connection to the engine process closed; failing its requests")
            self._engine_gone()

    def _engine_gone(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for waiter in self._waiting.values():
            if isinstance(waiter, EventChannel):
                waiter.put(ErrorEvent(Unavailable(ENGINE_GONE)))
            elif not waiter.done():
                waiter.set_result(("error", ["UNAVAILABLE", ENGINE_GONE]))

    async def _watch(self) -> None:
        assert self.engine_pid is not None
        while _alive(self.engine_pid):
            await asyncio.sleep(ENGINE_CHECK_S)
        log.error("the engine process (pid %d) is gone; failing its requests", self.engine_pid)
        self._engine_gone()


def _event(kind: str, payload: Any) -> Event:
    """The event an item carries; a malformed one ends its request with INTERNAL (logged)
    rather than leaving its caller waiting for a final event."""
    try:
        return event_from(kind, payload)
    except ProtocolError:
        log.exception("malformed event from the engine process")
        return ErrorEvent(Internal("the engine process sent a malformed event; see the logs"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:  # a dead child of ours lingers as a zombie until reaped: ask /proc
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class RemoteEngine:
    """``GenerationEngine`` of one model whose decode loop runs in the engine process."""

    def __init__(self, client: EngineClient, model: str, version: int, max_rows: int) -> None:
        self.client = client
        self.model = model
        self.version = version
        self._max_rows = max_rows

    @property
    def running(self) -> bool:
        return self.client.alive

    @property
    def max_rows(self) -> int:
        return self._max_rows

    def start(self) -> None:
        """The engine process starts its own loop."""

    def stop(self, timeout: float = 10.0) -> None:
        """The engine process stops its own loop."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        async for chunk in self.generate_chunks(request):
            for event in chunk:
                yield event

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        """Send ``request`` to the engine process and yield its events as they arrive (all that
        arrived together as one chunk); cancelled in the engine when the caller stops early."""
        request_id, channel = self.client.open_stream()
        source = request.source_ids if request.source_ids is not None else request.pixels
        self.client.send(
            {
                "t": "generate",
                "id": request_id,
                "model": self.model,
                "version": self.version,
                "options": options_payload(request.options),
                "deadline": request.deadline,
                "arrival": request.arrival,
                "priority": request.priority,
                "input": "source_ids" if request.source_ids is not None else "pixels",
                **({"prefix": list(request.prefix)} if request.prefix else {}),
                **(
                    {"bad_words": [list(w) for w in request.bad_words]} if request.bad_words else {}
                ),
            },
            [np.asarray(source)],
        )

        def finish_early() -> None:  # ``request.finish_at``: a stop string ended it
            if request.keep is not None and self.client.alive:
                self.client.send({"t": "cancel", "id": request_id, "keep": request.keep})

        request.watch_cancel(finish_early)
        done = False
        try:
            while not done:
                chunk = await channel.chunk()
                done = isinstance(chunk[-1], FinishEvent | ErrorEvent)
                yield chunk
        finally:
            self.client.forget(request_id)
            if not done and self.client.alive:
                self.client.send({"t": "cancel", "id": request_id})


class RemoteBatcher:
    """``Batcher`` of one model whose dynamic batcher runs in the engine process: a classifier's
    (``kind`` "classify": an image's pixels in) or a generator's scoring batcher ("score": a
    ``ScoreItem``'s two arrays in)."""

    def __init__(
        self, client: EngineClient, model: str, version: int, kind: str = "classify"
    ) -> None:
        self.client = client
        self.model = model
        self.version = version
        self.kind = kind

    @property
    def running(self) -> bool:
        return self.client.alive

    async def start(self) -> None:
        """The engine process starts its own batcher."""

    async def stop(self, drain: bool = True) -> None:
        """The engine process stops its own batcher."""

    async def submit(
        self,
        item: np.ndarray | tuple[np.ndarray, ...],
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        times: list[float] | None = None,
    ) -> np.ndarray:
        """The result of one item (an image's class probabilities, a pair's log-probabilities),
        batched in the engine process (``times``: gets its queue entry and its batch's start and
        end there, as ``DynamicBatcher``'s).

        Raises:
            ServingError: what the engine's batcher raised (queue full, deadline, ...).
        """
        request_id, answer = self.client.open_call()
        header = {
            "t": self.kind,
            "id": request_id,
            "model": self.model,
            "version": self.version,
            "timeout": timeout_s,
            "priority": priority,
        }
        if times is not None:
            header["times"] = True
        self.client.send(header, list(item) if isinstance(item, tuple) else [item])
        answered = False
        try:
            kind, payload = await answer
            answered = True
        finally:
            self.client.forget(request_id)
            if not answered and self.client.alive:
                self.client.send({"t": "cancel", "id": request_id})
        if kind == "result":
            if isinstance(payload, tuple):
                payload, batch_times = payload
                if times is not None:
                    times += batch_times
            return np.array(payload)  # a copy: the frame's memory belongs to the message
        event = event_from(kind, payload)
        assert isinstance(event, ErrorEvent), event
        raise event.error
