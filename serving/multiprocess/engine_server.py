"""The engine process's side of the socket: frontends' requests run on this process's models.

Frontends connect to the engine's Unix socket (``framing``: multi-frame messages read and written
by the event loop itself); a frontend whose connection closes has its requests cancelled. A
connection opens with the frontend's hello, which may hand over its shared memory arena for
large arrays (``shm``); every message back says how many of its messages were read ("ack").

Every generation becomes a ``GenerationRequest`` on the model's in-flight engine, every image a
submission to the classifier's dynamic batcher, exactly as in a single-process server. The
events a loop turn produces for one frontend leave as one message (the decode loop already wakes
this loop once per step), so the messaging cost per step does not grow with the streams. A
step's tokens go into that message as three arrays (request ids, tokens, indices) from a
``FrontendSink``: no event object, list item or msgpack entry per token here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
from collections import defaultdict
from typing import Any

import numpy as np

from serving.batching.dynamic import DynamicBatcher, Ticket
from serving.engine.inflight import InFlightEngine
from serving.engine.pool import EnginePool
from serving.engine.requests import (
    Columns,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    TokenSink,
    joined_columns,
)
from serving.errors import Internal, InvalidArgument, ServingError
from serving.log_settings import LogControl
from serving.model_control import LocalModelControl
from serving.multiprocess.framing import Frames, MessageConnection
from serving.multiprocess.protocol import (
    ProtocolError,
    bad_words_from,
    decode,
    event_item,
    events_message,
    options_from,
    prefix_from,
)
from serving.multiprocess.shm import ArenaError, ArenaReader, receive_hello
from serving.repository import ModelRepository
from serving.scoring import ScoreItem
from serving.served import ServedClassifier, ServedGenerator

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (frontend connection, request id)
HELLO_TIMEOUT_S = 10.0  # a connection that does not open with a frontend's hello is closed


class EngineServer:
    """Serves frontends' requests on ``repository``; each frontend connects to the Unix socket
    at ``path`` (``bind`` opens it; requests are served on the running loop until ``close``).
    ``grace``: seconds the running requests of a model that a load replaces, or an unload
    stops, get to finish."""

    def __init__(
        self,
        repository: ModelRepository,
        path: str,
        grace: float = 10.0,
        logs: LogControl | None = None,
    ) -> None:
        self.repository = repository
        self.path = path
        self.logs = logs  # this process's log settings (LogSettings changes them here too)
        self.control = LocalModelControl(repository, grace, announce=self._tell_frontends)
        self._changes = itertools.count(1)
        self._applying: dict[int, _Change] = {}  # model changes the frontends are applying
        self._controls: set[asyncio.Task[None]] = set()
        self._frontends: dict[int, MessageConnection] = {}
        self._sinks: dict[int, FrontendSink] = {}
        self._connections = itertools.count(1)
        self._generations: dict[Key, GenerationRequest] = {}
        self._batched: dict[Key, Ticket[np.ndarray]] = {}
        self._outgoing: dict[int, _Outgoing] = defaultdict(_Outgoing)
        self._flush_scheduled = False
        self._arenas: dict[int, ArenaReader] = {}
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    async def bind(self) -> None:
        """Listen on the socket (frontends may connect from now on)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept(), name="engine-accept")

    async def close(self) -> None:
        """Cancel what still runs and close the socket and the connections."""
        for key in [*self._generations, *self._batched]:
            self._cancel(key)
        for task in self._controls:
            task.cancel()
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        for connection in list(self._frontends.values()):
            connection.close()

    async def _accept(self) -> None:
        """Each frontend's connection opens with its hello (``shm``: its tensor arena), read
        before the event loop's transport takes the socket over."""
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        handshakes: set[asyncio.Task[None]] = set()
        try:
            while True:
                sock, _ = await loop.sock_accept(self._listener)
                task = asyncio.create_task(self._handshake(sock))
                handshakes.add(task)
                task.add_done_callback(handshakes.discard)
        finally:
            for task in handshakes:
                task.cancel()

    async def _handshake(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                arena = await receive_hello(sock)
        except (TimeoutError, OSError, ArenaError) as err:
            log.error("a connection to the engine socket without a frontend's hello (%s)", err)
            sock.close()
            return
        try:
            await loop.connect_accepted_socket(lambda: self._connection(arena), sock)
        except BaseException:
            if arena is not None:
                arena.close()
            sock.close()
            raise

    def _connection(self, arena: ArenaReader | None) -> MessageConnection:
        frontend = next(self._connections)
        connection = MessageConnection(
            lambda frames: self._dispatch(frontend, frames), lambda: self._lost(frontend)
        )
        self._frontends[frontend] = connection
        self._sinks[frontend] = FrontendSink(asyncio.get_running_loop(), self, frontend)
        if arena is not None:
            self._arenas[frontend] = arena
        return connection

    def _lost(self, frontend: int) -> None:
        """A frontend went away: its requests stop, freeing their rows."""
        self._frontends.pop(frontend, None)
        self._outgoing.pop(frontend, None)
        self._sinks.pop(frontend, None)
        if (arena := self._arenas.pop(frontend, None)) is not None:
            arena.close()
        for key in [k for k in (*self._generations, *self._batched) if k[0] == frontend]:
            self._cancel(key)
        for seq in list(self._applying):  # a model change waits for it no longer
            self._applied(frontend, seq, None)

    def _dispatch(self, frontend: int, frames: Frames) -> None:
        sink = self._sinks.get(frontend)
        if sink is not None:
            sink.read += 1  # its arrays in shared memory are copied out below: the space is free
        try:
            header, arrays = decode(frames, self._arenas.get(frontend))
            key: Key = (frontend, int(header["id"]))
        except (ProtocolError, KeyError, TypeError, ValueError):
            log.exception("malformed message from a frontend; dropped")
            return
        if len(arrays) > len(frames) - 1:  # some came out of its arena: say so this loop turn
            _ = self._outgoing[frontend]  # an entry, even empty, is sent: an "ack"
            self._schedule_flush()
        kind = header["t"]
        if kind == "cancel" and "keep" in header:
            self._finish_at(key, header["keep"])
        elif kind == "cancel":
            self._cancel(key)
        elif kind == "generate" and len(arrays) == 1:
            self._generate(key, header, _owned(arrays[0]))
        elif kind == "classify" and len(arrays) == 1:
            self._batch(key, header, _owned(arrays[0]))
        elif kind == "score" and len(arrays) == 2:
            self._batch(key, header, ScoreItem(_owned(arrays[0]), _owned(arrays[1])))
        elif kind in ("load", "unload", "trace", "log"):
            task = asyncio.create_task(self._control(key, kind, header))
            self._controls.add(task)
            task.add_done_callback(self._controls.discard)
        elif kind == "applied":
            self._applied(frontend, key[1], header.get("error"))
        else:
            log.error("unknown message %r from a frontend; dropped", kind)

    # --- model control (serving.model_control) --------------------------------------------------
    async def _control(self, key: Key, op: str, header: dict[str, Any]) -> None:
        """Load or unload a model here and on every frontend, or have every frontend change
        its trace settings (``serving.trace_control``) or its log settings (and this process
        its own: ``serving.log_settings``); then answer the asking one."""
        name = str(header["model"])
        try:
            if op in ("trace", "log"):
                if op == "log" and self.logs is not None:
                    self.logs.update(header["settings"])
                errors = await self._tell_frontends(op, name, settings=header["settings"])
                if errors:
                    raise Internal(f"{op} settings not applied: {'; '.join(errors)}")
            else:
                await (self.control.load if op == "load" else self.control.unload)(name)
        except Exception as err:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(err))))
            return
        self._post(key, [key[1], "done", None])

    async def _tell_frontends(self, op: str, name: str, **more: Any) -> list[str]:
        """Have every connected frontend apply the change (``more``: its other fields); the
        errors they reported."""
        seq = next(self._changes)
        change = self._applying[seq] = _Change(set(self._frontends))
        for frontend in list(self._frontends):
            self._post((frontend, 0), [0, "model", {"op": op, "model": name, "seq": seq, **more}])
        self._applied(None, seq, None)  # no frontend at all: done now
        await change.done.wait()
        return change.errors

    def _applied(self, frontend: int | None, seq: int, error: Any) -> None:
        """``frontend`` has applied change ``seq`` (None: only check whether all have)."""
        change = self._applying.get(seq)
        if change is None:
            return
        if frontend in change.pending:
            change.pending.discard(frontend)
            if error:
                change.errors.append(f"frontend {frontend}: {error}")
        if not change.pending:
            del self._applying[seq]
            change.done.set()

    def _cancel(self, key: Key) -> None:
        request = self._generations.pop(key, None)
        if request is not None:
            request.cancel()  # the decode loop frees its rows before the next step
        elif (ticket := self._batched.pop(key, None)) is not None:
            ticket.withdraw()  # an image or pair still waiting in its batcher

    def _finish_at(self, key: Key, keep: Any) -> None:
        """A stop string ended the generation after ``keep`` tokens: the engine finishes it
        (its finish still goes to the frontend)."""
        request = self._generations.get(key)
        if request is not None and isinstance(keep, int) and keep >= 0:
            request.finish_at(keep)
        elif request is not None:
            self._cancel(key)

    def _generate(self, key: Key, header: dict[str, Any], source: np.ndarray) -> None:
        """Queue the generation on its model's engine; its events go to the frontend as the
        decode loop delivers them (a listener on this loop, no task per request)."""
        try:
            model = self.repository.get(str(header["model"]), str(header.get("version", "")))
            if not isinstance(model, ServedGenerator):
                raise InvalidArgument(f"model {model.name!r} does not generate text")
            engine = model.engine
            if not isinstance(engine, InFlightEngine | EnginePool):
                raise Internal(f"model {model.name!r} has no engine in this process")
            request = GenerationRequest(
                options=options_from(header["options"]),
                source_ids=source if header["input"] == "source_ids" else None,
                pixels=source if header["input"] == "pixels" else None,
                deadline=header["deadline"],
                arrival=header["arrival"],
                priority=header["priority"],
                prefix=prefix_from(header.get("prefix", ())),
                bad_words=bad_words_from(header.get("bad_words", ())),
            )
            request.token_route = (self._sinks[key[0]], key[1])
            engine.submit(request, functools.partial(self._forward, key))
            self._generations[key] = request
        except Exception as err:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(err))))

    def _forward(self, key: Key, events: list[Event]) -> None:
        """A generation's events, on their way to its frontend; its last one ends it here."""
        for event in events:
            self._post(key, event_item(key[1], event))
        if isinstance(events[-1], FinishEvent | ErrorEvent):
            self._generations.pop(key, None)

    def _batch(self, key: Key, header: dict[str, Any], item: np.ndarray | ScoreItem) -> None:
        """Queue an image in its classifier's batcher, or a pair in its generator's scoring
        batcher; the answer goes to the frontend from a callback on the result (no task per
        request)."""
        try:
            model = self.repository.get(str(header["model"]), str(header.get("version", "")))
            batcher: Any = None
            if isinstance(item, ScoreItem):
                if not isinstance(model, ServedGenerator):
                    raise InvalidArgument(f"model {model.name!r} does not generate: no scores")
                batcher = model.scorer
            elif isinstance(model, ServedClassifier):
                batcher = model.batcher
            else:
                raise InvalidArgument(f"model {model.name!r} is not a classifier")
            if not isinstance(batcher, DynamicBatcher):
                raise Internal(f"model {model.name!r} has no batcher in this process")
            times: list[float] | None = [] if header.get("times") else None
            ticket = batcher.enqueue(
                item, timeout_s=header["timeout"], priority=header["priority"], times=times
            )
        except Exception as err:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(err))))
            return
        self._batched[key] = ticket
        ticket.future.add_done_callback(functools.partial(self._classified, key, ticket, times))

    def _classified(
        self,
        key: Key,
        ticket: Ticket[np.ndarray],
        times: list[float] | None,
        future: asyncio.Future,
    ) -> None:
        ticket.done()
        self._batched.pop(key, None)
        if future.cancelled():  # the frontend cancelled it: nobody waits for an answer
            return
        error = future.exception()
        if error is None:
            item = [key[1], "result", None]
            self._post(key, item, future.result())
            if times:  # a traced request's: [array index, enqueued, batch start, batch end]
                item[2] = [item[2], *times]
        else:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(error))))

    def _post(self, key: Key, item: list[Any], array: np.ndarray | None = None) -> None:
        """Queue an event for the frontend; one message per frontend per loop turn."""
        out = self._outgoing[key[0]]
        if array is not None:
            item[2] = len(out.arrays)
            out.arrays.append(array)
        out.items.append(item)
        self._schedule_flush()

    def post_tokens(self, frontend: int, columns: Columns) -> None:
        """A decode step's tokens for the frontend: in this loop turn's message, before its
        events (a stream's finish comes after its last token)."""
        if frontend in self._frontends:
            self._outgoing[frontend].tokens.append(columns)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """One ``events`` message per frontend: what this loop turn gathered for it."""
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, defaultdict(_Outgoing)
        for frontend, out in outgoing.items():
            connection, sink = self._frontends.get(frontend), self._sinks.get(frontend)
            if connection is not None and sink is not None:
                connection.send(events_message(out.items, out.arrays, out.joined(), sink.read))


class _Change:
    """A model change told to the frontends: those that have not applied it yet, the errors
    reported, and whether all have."""

    def __init__(self, pending: set[int]) -> None:
        self.pending = pending
        self.errors: list[str] = []
        self.done = asyncio.Event()


class _Outgoing:
    """What one loop turn has for one frontend: event items, their arrays, token columns."""

    __slots__ = ("arrays", "items", "tokens")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.arrays: list[np.ndarray] = []
        self.tokens: list[Columns] = []

    def joined(self) -> Columns | None:
        return joined_columns(None, self.tokens) if self.tokens else None


class FrontendSink(TokenSink):
    """A decode step's tokens for one frontend's requests, into its next ``events`` message."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, server: EngineServer, frontend: int
    ) -> None:
        self.loop = loop
        self.server = server
        self.frontend = frontend
        self.read = 0  # messages read from this frontend: every message to it says so ("ack")

    def tokens(self, routes: np.ndarray, tokens: np.ndarray, indices: np.ndarray) -> None:
        self.server.post_tokens(self.frontend, (routes, tokens, indices))


def _owned(array: np.ndarray) -> np.ndarray:
    """``array`` with memory of its own: a frame's view is copied (the message's bytes go
    away), an array copied out of shared memory already is."""
    return array if array.flags.owndata else np.array(array)


def _serving_error(err: BaseException) -> ServingError:
    if isinstance(err, ServingError):
        return err
    log.exception("internal error in the engine process", exc_info=err)
    return Internal(f"internal error: {type(err).__name__}: {err}")
