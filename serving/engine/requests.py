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
from dataclasses import dataclass, field

import numpy as np

from serving.generation.options import DecodingOptions

_ids = itertools.count()


@dataclass
class TokenEvent:
    """A generated token (streamed as soon as it is chosen)."""

    token_id: int
    index: int  # 0-based position in the output


@dataclass
class FinishEvent:
    """The end of a sequence: its tokens (without EOS) and how it ended."""

    reason: str  # "stop" (EOS) | "length" (max_new_tokens or the position table)
    tokens: list[int]
    score: float | None = None  # beam search: length-penalised log-probability
    alternatives: list[tuple[list[int], float]] = field(default_factory=list)
    input_tokens: int = 0
    queue_seconds: float = 0.0


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
    ) -> None:
        if (source_ids is None) == (pixels is None):
            raise ValueError("give exactly one of source_ids (text) or pixels (image)")
        self.id = next(_ids)
        self.options = options
        self.source_ids = source_ids
        self.pixels = pixels
        self.deadline = deadline
        self.arrival = time.monotonic() if arrival is None else arrival
        self._cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Event] | None = None

    # --- what the admission policy sees -------------------------------------------------------
    @property
    def rows(self) -> int:
        return max(1, self.options.beam_size)

    @property
    def source_tokens(self) -> int:
        return len(self.source_ids) if self.source_ids is not None else 1

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request: the engine frees its cache rows before the next step."""
        self._cancelled.set()

    # --- event delivery (engine thread -> caller's loop) ----------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> asyncio.Queue[Event]:
        self._loop = loop
        self._queue = asyncio.Queue()
        return self._queue

    def emit(self, event: Event) -> None:
        """Deliver one event now (outside the decode loop; the loop batches through Outbox)."""
        if self._loop is None or self._queue is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self._cancelled.set()


class Outbox:
    """Events of one engine iteration, handed to each caller event loop in ONE wake-up.

    A decode step produces a token for every running sequence; waking the callers' loop once
    per step instead of once per token keeps the cross-thread cost flat in the batch size.
    """

    def __init__(self) -> None:
        self._items: list[tuple[GenerationRequest, Event]] = []

    def post(self, request: GenerationRequest, event: Event) -> None:
        self._items.append((request, event))

    def flush(self) -> None:
        if not self._items:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[GenerationRequest, Event]]] = {}
        for request, event in self._items:
            if request._loop is not None and request._queue is not None:
                by_loop.setdefault(request._loop, []).append((request, event))
        self._items = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the callers' loop is closed: nobody is listening any more
                for request, _ in items:
                    request.cancel()


def _deliver(items: list[tuple[GenerationRequest, Event]]) -> None:
    for request, event in items:
        assert request._queue is not None
        request._queue.put_nowait(event)
