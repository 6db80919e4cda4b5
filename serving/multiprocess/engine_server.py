"""The engine process's side of the socket: frontends' requests run on this process's models.

Frontends connect to the engine's Unix socket (``framing``: multi-frame messages read and written
by the event loop itself); a frontend whose connection closes has its requests cancelled.

Every generation becomes a ``GenerationRequest`` on the model's in-flight engine, every image a
submission to the classifier's dynamic batcher, exactly as in a single-process server. The
events a loop turn produces for one frontend leave as one message (the decode loop already wakes
this loop once per step), so the messaging cost per step does not grow with the streams. A
step's tokens go to each frontend as three arrays (request ids, tokens, indices) from a
``FrontendSink``: no event object, list item or msgpack entry per token here.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import defaultdict
from typing import Any

import numpy as np

from serving.batching.dynamic import DynamicBatcher, Ticket
from serving.engine.inflight import InFlightEngine
from serving.engine.pool import EnginePool
from serving.engine.requests import ErrorEvent, Event, FinishEvent, GenerationRequest, TokenSink
from serving.errors import Internal, InvalidArgument, ServingError
from serving.multiprocess.framing import Frames, MessageConnection
from serving.multiprocess.protocol import (
    ProtocolError,
    decode,
    encode,
    event_item,
    options_from,
    tokens_message,
)
from serving.repository import ModelRepository
from serving.served import ServedClassifier, ServedGenerator

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (frontend connection, request id)


class EngineServer:
    """Serves frontends' requests on ``repository``; each frontend connects to the Unix socket
    at ``path`` (``bind`` opens it; requests are served on the running loop until ``close``)."""

    def __init__(self, repository: ModelRepository, path: str) -> None:
        self.repository = repository
        self.path = path
        self._frontends: dict[int, MessageConnection] = {}
        self._sinks: dict[int, FrontendSink] = {}
        self._connections = itertools.count(1)
        self._generations: dict[Key, GenerationRequest] = {}
        self._classifications: dict[Key, Ticket[np.ndarray]] = {}
        self._outgoing: dict[int, tuple[list[Any], list[np.ndarray]]] = defaultdict(
            lambda: ([], [])
        )
        self._flush_scheduled = False
        self._server: asyncio.AbstractServer | None = None

    async def bind(self) -> None:
        """Listen on the socket (frontends may connect from now on)."""
        self._server = await asyncio.get_running_loop().create_unix_server(
            self._connection, self.path
        )

    async def close(self) -> None:
        """Cancel what still runs and close the socket and the connections."""
        for key in [*self._generations, *self._classifications]:
            self._cancel(key)
        if self._server is not None:
            self._server.close()
        for connection in list(self._frontends.values()):
            connection.close()

    def _connection(self) -> MessageConnection:
        frontend = next(self._connections)
        connection = MessageConnection(
            lambda frames: self._dispatch(frontend, frames), lambda: self._lost(frontend)
        )
        self._frontends[frontend] = connection
        self._sinks[frontend] = FrontendSink(asyncio.get_running_loop(), connection)
        return connection

    def _lost(self, frontend: int) -> None:
        """A frontend went away: its requests stop, freeing their rows."""
        self._frontends.pop(frontend, None)
        self._outgoing.pop(frontend, None)
        if (sink := self._sinks.pop(frontend, None)) is not None:
            sink.connection = None
        for key in [k for k in (*self._generations, *self._classifications) if k[0] == frontend]:
            self._cancel(key)

    def _dispatch(self, frontend: int, frames: Frames) -> None:
        try:
            header, arrays = decode(frames)
            key: Key = (frontend, int(header["id"]))
        except (ProtocolError, KeyError, TypeError, ValueError):
            log.exception("malformed message from a frontend; dropped")
            return
        kind = header["t"]
        if kind == "cancel":
            self._cancel(key)
        elif kind == "generate" and len(arrays) == 1:
            self._generate(key, header, np.array(arrays[0]))  # the copy owns its memory
        elif kind == "classify" and len(arrays) == 1:
            self._classify(key, header, np.array(arrays[0]))
        else:
            log.error("unknown message %r from a frontend; dropped", kind)

    def _cancel(self, key: Key) -> None:
        request = self._generations.pop(key, None)
        if request is not None:
            request.cancel()  # the decode loop frees its rows before the next step
        elif (ticket := self._classifications.pop(key, None)) is not None:
            ticket.withdraw()  # a classification still waiting in the batcher

    def _generate(self, key: Key, header: dict[str, Any], source: np.ndarray) -> None:
        """Queue the generation on its model's engine; its events go to the frontend as the
        decode loop delivers them (a listener on this loop, no task per request)."""
        try:
            model = self.repository.get(str(header["model"]))
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

    def _classify(self, key: Key, header: dict[str, Any], pixels: np.ndarray) -> None:
        """Queue the image in its model's batcher; the answer goes to the frontend from a
        callback on the result (no task per request)."""
        try:
            model = self.repository.get(str(header["model"]))
            if not isinstance(model, ServedClassifier):
                raise InvalidArgument(f"model {model.name!r} is not a classifier")
            batcher = model.batcher
            if not isinstance(batcher, DynamicBatcher):
                raise Internal(f"model {model.name!r} has no batcher in this process")
            ticket = batcher.enqueue(pixels, timeout_s=header["timeout"])
        except Exception as err:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(err))))
            return
        self._classifications[key] = ticket
        ticket.future.add_done_callback(functools.partial(self._classified, key, ticket))

    def _classified(self, key: Key, ticket: Ticket[np.ndarray], future: asyncio.Future) -> None:
        ticket.done()
        self._classifications.pop(key, None)
        if future.cancelled():  # the frontend cancelled it: nobody waits for an answer
            return
        error = future.exception()
        if error is None:
            self._post(key, [key[1], "result", None], future.result())
        else:
            self._post(key, event_item(key[1], ErrorEvent(_serving_error(error))))

    def _post(self, key: Key, item: list[Any], array: np.ndarray | None = None) -> None:
        """Queue an event for the frontend; one message per frontend per loop turn."""
        items, arrays = self._outgoing[key[0]]
        if array is not None:
            item[2] = len(arrays)
            arrays.append(array)
        items.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outgoing, self._outgoing = self._outgoing, defaultdict(lambda: ([], []))
        for frontend, (items, arrays) in outgoing.items():
            connection = self._frontends.get(frontend)
            if connection is not None:
                connection.send(encode({"t": "events", "items": items}, arrays))


class FrontendSink(TokenSink):
    """A decode step's tokens for one frontend's requests, sent as one ``tokens`` message."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connection: MessageConnection) -> None:
        self.loop = loop
        self.connection: MessageConnection | None = connection  # None once the frontend left

    def tokens(self, routes: np.ndarray, tokens: np.ndarray, indices: np.ndarray) -> None:
        if self.connection is not None:
            self.connection.send(tokens_message(routes, tokens, indices))


def _serving_error(err: Exception) -> ServingError:
    if isinstance(err, ServingError):
        return err
    log.exception("internal error in the engine process", exc_info=err)
    return Internal(f"internal error: {type(err).__name__}: {err}")
