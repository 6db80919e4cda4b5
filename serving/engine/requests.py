"""What flows between callers and the engine thread: requests, their events, the outbox.

A caller (the servicer, on its event loop) creates a ``GenerationRequest`` and reads its events;
the engine thread posts the events of one decode step into an ``Outbox`` and flushes it once, so
each caller loop wakes once per step, not once per token.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from serving.engine.loop_wake import call_soon_threadsafe
from serving.generation.options import DecodingOptions
from serving.generation.top_tokens import TopTokens

_ids = itertools.count()


@dataclass
class TokenEvent:
    """A generated token (streamed as soon as it is chosen)."""

    token_id: int
    index: int  # 0-based position in the output
    log_prob: float | None = None  # the token's log-probability (``return_log_probs``)
    top: TopTokens | None = None  # the position's most likely tokens (``top_log_probs``)


@dataclass
class FinishEvent:
    """The end of a sequence: its tokens (without EOS) and how it ended."""

    # "stop" (EOS) | "length" (max_new_tokens or the position table) | "stop_sequence" (a stop
    # string: ``GenerationRequest.finish_at``)
    reason: str
    tokens: list[int]
    score: float | None = None  # beam search: length-penalised log-probability; else the
    # sum of the chosen tokens' log-probabilities, EOS included (``return_log_probs``)
    log_probs: list[float] | None = None  # ``return_log_probs``: one per token of ``tokens``
    # beam search's runner-ups: (tokens, score, whether it ended with EOS), and with
    # ``return_log_probs`` their tokens' log-probabilities
    alternatives: list[tuple[list[int], float, bool]] = field(default_factory=list)
    alternative_log_probs: list[list[float]] | None = None
    top_log_probs: list[TopTokens] | None = None  # ``top_log_probs``: one per token of ``tokens``
    alternative_top_log_probs: list[list[TopTokens]] | None = None  # the runner-ups' (beams)
    input_tokens: int = 0
    queue_seconds: float = 0.0  # arrival to admission
    compute_seconds: float = 0.0  # admission to this finish


@dataclass
class ErrorEvent:
    """The request failed; ``error`` carries the status and message."""

    error: Exception


Event = TokenEvent | FinishEvent | ErrorEvent


class GenerationRequest:
    """One sequence to generate: its encoder input, options and deadline."""

    def __init__(
        self,
        *,
        options: DecodingOptions,
        source_ids: np.ndarray | None = None,
        pixels: np.ndarray | None = None,
        deadline: float | None = None,
        arrival: float | None = None,
        priority: int = 0,
        prefix: tuple[int, ...] = (),
        bad_words: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        if (source_ids is None) == (pixels is None):
            raise ValueError("give exactly one of source_ids (text) or pixels (image)")
        self.id = next(_ids)
        self.options = options
        self.source_ids = source_ids
        self.pixels = pixels
        self.deadline = deadline
        self.arrival = time.monotonic() if arrival is None else arrival
        self.priority = priority  # queue level: lower joins first (0: priorities off)
        # the target prefix: the output's first tokens, fed to the decoder one a step, then
        # ``options.max_new_tokens`` tokens chosen after them
        self.prefix = prefix
        # ``options.bad_words`` as token sequences (``serving.generation.history_rules``)
        self.bad_words = bad_words
        # set by ``finish_at``: the tokens the output keeps (a stop string ended it)
        self.keep: int | None = None
        # an image's encoder positions (its patches and class token), set by its encoder pass:
        # the input tokens its usage reports
        self.encoded_positions: int | None = None
        self._cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: EventChannel | None = None
        # (sink, route): the decode loop hands this request's tokens to ``sink`` in columns, a
        # step's tokens of every request on that sink at once, instead of as TokenEvents
        self.token_route: tuple[TokenSink, int] | None = None
        self._on_cancel: Callable[[], None] | None = None

    # --- what the admission policy sees -------------------------------------------------------
    @property
    def rows(self) -> int:
        return max(1, self.options.beam_size)

    @property
    def source_tokens(self) -> int:
        return len(self.source_ids) if self.source_ids is not None else 1

    @property
    def input_tokens(self) -> int:
        """What the request's usage counts as its input: the source's tokens, or the image's
        encoder positions (1 before its encoder pass)."""
        if self.source_ids is None and self.encoded_positions is not None:
            return self.encoded_positions
        return self.source_tokens

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request: the engine frees its cache rows before the next step."""
        self._cancelled.set()
        if (hook := self._on_cancel) is not None:
            hook()

    def finish_at(self, tokens: int) -> None:
        """End this request with its first ``tokens`` tokens (a stop string appeared in its
        text): the engine finishes it with reason "stop_sequence" before its next step, as for
        a cancel, and frees its rows; a request that already ended keeps its own finish."""
        self.keep = tokens
        self.cancel()

    def watch_cancel(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (from the cancelling thread) when this request is cancelled; at once
        if it already is. The decode loop looks for cancelled rows only after such a call."""
        self._on_cancel = hook
        if self.is_cancelled():
            hook()

    # --- event delivery (engine thread -> caller's loop) ----------------------------------------
    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float = 0.0,
        listener: Listener | None = None,
    ) -> EventChannel:
        """Where this request's events arrive on ``loop``; ``interval`` and ``listener`` as
        ``EventChannel``'s."""
        self._loop = loop
        self._channel = EventChannel(loop, interval, listener)
        return self._channel

    def emit(self, event: Event) -> None:
        """Deliver one event now (outside the decode loop; the loop batches through Outbox)."""
        if self._loop is None or self._channel is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._channel.put, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self.cancel()


Listener = Callable[[list[Event]], None]


class TokenSink(Protocol):
    """Where a decode step's tokens for many requests go at once, on ``loop``: the requests'
    routes (``GenerationRequest.token_route``), their tokens and the tokens' output indices, in
    the order the engine chose them. Its requests' other events (finish, error) still arrive
    through their channels, after the tokens of the same step (the engine process sends its
    frontends one message per step this way, not an event per token)."""

    loop: asyncio.AbstractEventLoop

    def tokens(self, routes: np.ndarray, tokens: np.ndarray, indices: np.ndarray) -> None:
        """One flush's tokens for this sink: three int64 arrays of one length."""
        ...


class EventChannel:
    """One request's events on its caller's event loop, taken a chunk at a time.

    A chunk is every event that has arrived since the previous one. With ``interval`` > 0 (model
    config ``batching.stream_interval_ms``) a chunk is not taken before ``interval`` seconds
    after the previous one, so the tokens decoded meanwhile travel together: a stream sends a
    message per interval instead of one per decode step, and its caller wakes once per message.
    The first chunk and a chunk that ends the request (finish or error) are never held.

    With a ``listener`` the chunks are not awaited (``chunk``) but handed to it on the loop as
    soon as they are due: no task wakes per chunk (the engine process forwards its frontends'
    events this way).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float = 0.0,
        listener: Listener | None = None,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        self._loop = loop
        self._interval = interval
        self._listener = listener
        self._items: list[Event] = []
        self._ended = False  # a finish or error event is among the items
        self._due = 0.0  # loop time before which a chunk waits for more (the first never does)
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def put(self, event: Event) -> None:
        """Add an event (on the loop); wake the taker if its chunk is due."""
        if self._listener is not None and not self._interval:  # due at once: no list kept
            self._listener([event])
            return
        self._items.append(event)
        if isinstance(event, FinishEvent | ErrorEvent):
            self._ended = True
        if self._waiter is not None or self._listener is not None:
            self._wake_when_due()

    def _ready(self) -> bool:
        if not self._items:
            return False
        return self._ended or not self._interval or self._loop.time() >= self._due

    def _wake_when_due(self) -> None:
        if self._ready():
            self._wake()
        elif self._items and self._timer is None:
            self._timer = self._loop.call_at(self._due, self._wake)

    def _wake(self) -> None:
        if self._timer is not None:  # due now (this is its call) or released early
            self._timer.cancel()
            self._timer = None
        if self._listener is not None:
            if self._items:
                self._listener(self._take())
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def chunk(self) -> list[Event]:
        """The events that arrived since the last chunk (at least one), once the chunk is due."""
        while not self._ready():
            self._waiter = self._loop.create_future()
            self._wake_when_due()
            try:
                await self._waiter
            finally:
                self._waiter = None
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
        return self._take()

    def _take(self) -> list[Event]:
        items, self._items = self._items, []
        if self._interval:
            self._due = self._loop.time() + self._interval
        return items


class Outbox:
    """Events of one engine iteration, handed to each caller event loop in ONE wake-up.

    A decode step produces a token for every running sequence; waking the callers' loop once
    per step instead of once per token keeps the cross-thread cost flat in the batch size. The
    tokens of requests with a ``token_route`` travel as columns per sink (no event objects).
    """

    def __init__(self) -> None:
        self._items: list[tuple[GenerationRequest, Event]] = []
        self._columns: dict[TokenSink, tuple[list[int], list[int], list[int]]] = {}
        self._arrays: dict[TokenSink, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def post(self, request: GenerationRequest, event: Event) -> None:
        self._items.append((request, event))

    def post_token(self, request: GenerationRequest, token: int, index: int) -> None:
        """A generated token: into its sink's columns, else as a ``TokenEvent``."""
        route = request.token_route
        if route is None:
            self._items.append((request, TokenEvent(token, index)))
            return
        sink, key = route
        columns = self._columns.get(sink)
        if columns is None:
            columns = self._columns[sink] = ([], [], [])
        columns[0].append(key)
        columns[1].append(token)
        columns[2].append(index)

    def post_tokens(
        self, sink: TokenSink, routes: np.ndarray, tokens: np.ndarray, indices: np.ndarray
    ) -> None:
        """Tokens of many routed requests for one sink at once: their routes' keys, the tokens
        and their output indices (int64 arrays of one length)."""
        self._arrays.setdefault(sink, []).append((routes, tokens, indices))

    def flush(self) -> None:
        if not self._items and not self._columns and not self._arrays:
            return
        by_loop: dict[asyncio.AbstractEventLoop, Delivery] = {}
        for sink in self._columns.keys() | self._arrays.keys():
            columns = joined_columns(self._columns.get(sink), self._arrays.get(sink, []))
            by_loop.setdefault(sink.loop, ([], []))[0].append((sink, columns))
        for request, event in self._items:
            if request._loop is not None and request._channel is not None:
                by_loop.setdefault(request._loop, ([], []))[1].append((request, event))
        self._items, self._columns, self._arrays = [], {}, {}
        for loop, delivery in by_loop.items():
            # Token columns go to the engine process's loop, whose callbacks only forward them
            # to the frontends' sockets: it is woken with the GIL kept (``loop_wake``), so that
            # they run during the next step. A caller's loop in this process (its callbacks the
            # streams' gRPC writes, often longer than a GPU step) is woken as asyncio does:
            # keeping the GIL there measured slower (``benchmarks.engine_loop``, 128 streams).
            try:
                if delivery[0]:
                    call_soon_threadsafe(loop, _deliver, delivery)
                else:
                    loop.call_soon_threadsafe(_deliver, delivery)
            except RuntimeError:  # the callers' loop is closed: nobody is listening any more
                for request, _ in delivery[1]:
                    request.cancel()


# (token columns per sink, events per request) of one flush, for one loop
Columns = tuple[np.ndarray, np.ndarray, np.ndarray]
Delivery = tuple[list[tuple[TokenSink, Columns]], list[tuple[GenerationRequest, Event]]]


def joined_columns(
    columns: tuple[list[int], list[int], list[int]] | None,
    arrays: list[Columns],
) -> Columns:
    """A sink's tokens of one flush as three int64 arrays: those posted one at a time, then
    those posted as arrays."""
    parts = list(arrays)
    if columns is not None:
        first, second, third = (np.asarray(column, dtype=np.int64) for column in columns)
        parts.insert(0, (first, second, third))
    if len(parts) == 1:
        return parts[0]  # type: ignore[return-value]
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))  # type: ignore[return-value]


def _deliver(delivery: Delivery) -> None:
    columns, items = delivery
    for sink, (routes, tokens, indices) in columns:  # before the same step's finish events
        sink.tokens(routes, tokens, indices)
    for request, event in items:
        assert request._channel is not None
        request._channel.put(event)
