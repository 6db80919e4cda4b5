"""Admission policy for in-flight batching: which waiting requests join the decode batch next.

No model and no I/O: it sees requests as (rows they need, source tokens, deadline) and the
running batch as a row count, so it is unit-tested with plain objects and a fake clock.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from contract.model_config import QueuePolicy
from serving.batching.priority import insert_by_priority, queue_is_full


class Schedulable(Protocol):
    """What the policy needs to know about a waiting request."""

    @property
    def rows(self) -> int:
        """Decode rows it occupies (beam size; 1 for greedy / sampling)."""
        ...

    @property
    def source_tokens(self) -> int:
        """Encoder positions its admission costs."""
        ...

    @property
    def deadline(self) -> float | None: ...

    @property
    def priority(self) -> int:
        """Queue level: lower joins first (0 for every request when priorities are off)."""
        ...

    def is_cancelled(self) -> bool: ...


R = TypeVar("R", bound=Schedulable)


@dataclass(frozen=True)
class AdmissionLimits:
    """The policies, each a plain number."""

    max_rows: int  # KV-cache capacity in decode rows (max_active_sequences)
    max_queue: int  # waiting requests beyond this are refused (RESOURCE_EXHAUSTED); 0 = no limit
    token_budget: int  # decode rows + encoder positions of joiners in one step
    max_joiners: int  # most requests admitted in one step (bounds the encoder batch)
    policies: tuple[QueuePolicy, ...] = ()  # priority levels with a queue limit of their own


def fits_capacity(
    active_rows: int, joining_rows: int, request: Schedulable, limits: AdmissionLimits
) -> bool:
    """The request's rows fit in the KV cache next to the running and already admitted rows."""
    return active_rows + joining_rows + request.rows <= limits.max_rows


def fits_budget(
    active_rows: int, joining_tokens: int, request: Schedulable, limits: AdmissionLimits
) -> bool:
    """This step's work stays within the token budget (always admits into an idle batch)."""
    spent = active_rows + joining_tokens
    return spent == 0 or spent + request.source_tokens + request.rows <= limits.token_budget


def expired(request: Schedulable, now: float) -> bool:
    """The request's deadline has passed."""
    return request.deadline is not None and now >= request.deadline


class AdmissionQueue(Generic[R]):
    """Waiting requests, highest priority first and first come first served within a level;
    thread-safe (servicers enqueue, the engine thread admits)."""

    def __init__(self, limits: AdmissionLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.clock = clock
        self._waiting: collections.deque[R] = collections.deque()
        self._lock = threading.Lock()
        # at most the earliest deadline of the waiting requests (exact after ``drop_dead``)
        self.earliest_deadline = math.inf

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def rows(self) -> int:
        """Decode rows the waiting requests will take (a beam per row)."""
        with self._lock:
            return sum(request.rows for request in self._waiting)

    def offer(self, request: R) -> bool:
        """Queue ``request``; False when full (the caller answers RESOURCE_EXHAUSTED)."""
        with self._lock:
            limits = self.limits
            if queue_is_full(self._waiting, request.priority, limits.max_queue, limits.policies):
                return False
            insert_by_priority(self._waiting, request)
            if request.deadline is not None:
                self.earliest_deadline = min(self.earliest_deadline, request.deadline)
            return True

    def drop_dead(self) -> tuple[list[R], list[R]]:
        """Remove waiting requests that expired or were cancelled: (expired, cancelled)."""
        now = self.clock()
        gone_expired, gone_cancelled = [], []
        with self._lock:
            keep: collections.deque[R] = collections.deque()
            earliest = math.inf
            for request in self._waiting:
                if request.is_cancelled():
                    gone_cancelled.append(request)
                elif expired(request, now):
                    gone_expired.append(request)
                else:
                    keep.append(request)
                    if request.deadline is not None:
                        earliest = min(earliest, request.deadline)
            self._waiting = keep
            self.earliest_deadline = earliest
        return gone_expired, gone_cancelled

    def admit(self, active_rows: int) -> list[R]:
        """Pop the requests that join the batch at this step, in queue order (the highest
        priority first, then the oldest).

        Stops at the first request that does not fit, so a large request is never starved by
        smaller ones behind it.
        """
        admitted: list[R] = []
        rows = tokens = 0
        with self._lock:
            while self._waiting and len(admitted) < self.limits.max_joiners:
                request = self._waiting[0]
                if not fits_capacity(active_rows, rows, request, self.limits):
                    break
                if not fits_budget(active_rows, tokens, request, self.limits):
                    break
                admitted.append(self._waiting.popleft())
                rows += request.rows
                tokens += request.source_tokens + request.rows
        return admitted

    def can_admit(self, active_rows: int) -> bool:
        """Whether ``admit`` would take the oldest waiting request now."""
        with self._lock:
            if not self._waiting:
                return False
            request = self._waiting[0]
            return fits_capacity(active_rows, 0, request, self.limits) and fits_budget(
                active_rows, 0, request, self.limits
            )

    def drain(self) -> list[R]:
        """Remove and return everything waiting (shutdown)."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        return waiting
