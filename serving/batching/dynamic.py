"""Dynamic batching with Triton's semantics, for one-shot work (classification, encoder passes).

Requests queue up; a batch is dispatched when ``max_batch_size`` requests are queued or when the
oldest queued request has waited ``max_queue_delay_us``. The batch function runs in an executor
thread (ONNX Runtime releases the GIL), so the event loop keeps accepting requests; up to
``instances`` batches run at a time per batcher (Triton's instance_group), each on its own
executor thread. A batch of N items gives exactly N results, each carrying its own error.

No model and no I/O in here: ``run_batch`` is whatever the caller passes.

Triton conventions kept: ``max_queue_size == 0`` means an unbounded queue and
``timeout_ms == 0`` means no default deadline. With ``priority_levels`` the queue is kept highest
priority first (``batching/priority.py``), so batches take priority 1 before 2; the delay runs
from the arrival of the request at the queue's front.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from contract.model_config import DynamicBatching, level_timeout_ms, priority_level
from serving.batching.priority import insert_by_priority, level_limit, queue_is_full
from serving.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from serving.metrics import ServingMetrics

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)


# --- policies: pure functions of counts and times, testable with plain numbers -----------------


def batch_is_full(queued: int, max_batch_size: int) -> bool:
    """True when enough requests are queued to fill a batch."""
    return queued >= max_batch_size


def delay_remaining(oldest_enqueued_at: float, now: float, max_delay_s: float) -> float:
    """Seconds until the oldest queued request has waited ``max_delay_s``; <= 0: flush now."""
    return oldest_enqueued_at + max_delay_s - now


def is_expired(deadline: float | None, now: float) -> bool:
    """True when a request's deadline has passed (``None``: no deadline)."""
    return deadline is not None and now >= deadline


def deadline_for(now: float, timeout_s: float | None, default_timeout_ms: int) -> float | None:
    """The absolute deadline of a request arriving at ``now``.

    Args:
        now: arrival time on the batcher's clock.
        timeout_s: the client's timeout, when it sent one.
        default_timeout_ms: ``batching.timeout_ms``, used when the client sent none; 0 = none.

    Returns:
        The deadline, or ``None`` when the request has none.
    """
    if timeout_s is not None:
        return now + timeout_s
    return now + default_timeout_ms / 1000 if default_timeout_ms > 0 else None


# --- the batcher --------------------------------------------------------------------------------


@dataclass(eq=False)  # identity equality: deque.remove must find this very request
class _Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    enqueued_at: float
    deadline: float | None
    priority: int = 0  # queue level (1 first; 0 with priorities off)
    times: list[float] | None = None  # traced: gets (enqueued, batch started, batch ended)


class Ticket(Generic[R]):
    """A queued request (``DynamicBatcher.enqueue``): its future, and what ends its wait."""

    __slots__ = ("_timer", "_withdraw", "future")

    def __init__(
        self,
        future: asyncio.Future[R],
        timer: asyncio.TimerHandle | None,
        withdraw: Callable[[], None],
    ) -> None:
        self.future = future
        self._timer = timer
        self._withdraw = withdraw

    def done(self) -> None:
        """The result is in (or the caller left): the deadline timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def withdraw(self) -> None:
        """The caller gives up: the future is cancelled and the item leaves the queue if it has
        not been dispatched yet."""
        self._withdraw()
        self.done()


@dataclass(frozen=True)
class _Instruments:
    """The batcher's metric children, bound to its model and stage labels once."""

    queue_time: Any
    batch_size: Any
    compute_time: Any
    request_compute: Any
    queue_depth: Any

    @classmethod
    def bind(cls, metrics: ServingMetrics, model: str, version: str, stage: str) -> _Instruments:
        labels = {"model": model, "version": version}
        return cls(
            queue_time=metrics.queue_time.labels(**labels),
            batch_size=metrics.batch_size.labels(**labels, stage=stage),
            compute_time=metrics.compute_time.labels(**labels, stage=stage),
            request_compute=metrics.request_compute.labels(**labels, stage=stage),
            queue_depth=metrics.queue_depth.labels(**labels),
        )


class DynamicBatcher(Generic[T, R]):
    """Merges concurrent ``submit`` calls into batched ``run_batch`` calls.

    Usage::

        batcher = DynamicBatcher("vit", classify_batch, config.batching, metrics=metrics)
        await batcher.start()
        label = await batcher.submit(image, timeout_s=remaining)
        await batcher.stop(drain=True)
    """

    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[T]], Sequence[R | BaseException]],
        settings: DynamicBatching,
        *,
        stage: str = "batch",
        executor: concurrent.futures.Executor | None = None,
        metrics: ServingMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        version: str = "",
        reports_depth: bool = True,
    ) -> None:
        """Create a stopped batcher; ``start()`` it inside the event loop that will submit.

        Args:
            name: model name, used in error messages and as the metrics ``model`` label.
            run_batch: runs a list of items and returns one result or exception per item, in
                order. Called in ``executor``, at most ``settings.instances`` calls at once.
            settings: max_batch_size, max_queue_delay_us, max_queue_size, timeout_ms,
                instances.
            stage: the metrics ``stage`` label of batch size and compute time.
            executor: where ``run_batch`` runs; by default a pool of ``settings.instances``
                threads the batcher owns.
            metrics: where to record queue time, batch size, compute time and queue depth.
            clock: monotonic seconds; injectable for tests.
            version: the model's version, the metrics ``version`` label.
            reports_depth: sets the model's queue depth gauge (False: another queue of the
                model, its in-flight engine's, sets it).
        """
        self.name = name
        self.stage = stage
        self._run_batch = run_batch
        self._settings = settings
        self._max_delay_s = settings.max_queue_delay_us / 1e6
        self._executor = executor
        self._owns_executor = executor is None
        self._instruments = _Instruments.bind(metrics, name, version, stage) if metrics else None
        self._reports_depth = reports_depth
        self._clock = clock
        self._queue: deque[_Pending[T, R]] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # batches being run
        self._closed = False

    @property
    def running(self) -> bool:
        """Started and not stopped: submits are accepted."""
        return self._task is not None and not self._closed

    @property
    def queue_depth(self) -> int:
        """Requests queued and not yet dispatched."""
        return len(self._queue)

    async def start(self) -> None:
        """Start the batching loop in the running event loop.

        Raises:
            Unavailable: when the batcher was stopped (a stopped batcher does not restart).
        """
        if self._closed:
            raise Unavailable(f"{self.name}: batcher was stopped; create a new one")
        if self._task is not None:
            return
        if self._owns_executor:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._settings.instances, thread_name_prefix=f"batcher-{self.name}"
            )
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"batcher-{self.name}"
        )

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting requests and end the loop; idempotent.

        Args:
            drain: True: run every queued request first. False: fail queued requests with
                UNAVAILABLE (the batch already running still completes).
        """
        self._closed = True
        if not drain:
            self._fail_queued(lambda: Unavailable(f"{self.name}: server is stopping; retry"))
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=False)

    async def submit(
        self,
        item: T,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        times: list[float] | None = None,
    ) -> R:
        """Queue ``item`` and wait for its own result.

        Args:
            item: one request's input, as ``run_batch`` takes it.
            timeout_s: the client's remaining deadline; ``settings.timeout_ms`` when None.
            priority: the client's priority (1 highest; 0 = the default level), resolved
                against ``settings.priority_levels`` as Triton does.
            times: a list that gets the item's queue entry, and its batch's start and end
                (clock seconds) once its batch has run (a traced request's).

        Returns:
            The result ``run_batch`` returned for this item.

        Raises:
            ResourceExhausted: the queue holds ``max_queue_size`` requests already.
            DeadlineExceeded: no result before the deadline (the item is dropped if still queued).
            Unavailable: the batcher is not started or is stopping.
            Internal: ``run_batch`` raised or returned the wrong number of results.
            Exception: whatever exception ``run_batch`` returned for this item.
        """
        ticket = self.enqueue(item, timeout_s=timeout_s, priority=priority, times=times)
        try:
            return await ticket.future
        except asyncio.CancelledError:
            ticket.withdraw()
            raise
        finally:
            ticket.done()

    def enqueue(
        self,
        item: T,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        times: list[float] | None = None,
    ) -> Ticket[R]:
        """Queue ``item`` without waiting: its result or error arrives in the ticket's future
        (``submit``'s, which awaits it). The caller calls ``done()`` once the future is done,
        or ``withdraw()`` if it gives up first. No task per request: the engine process answers
        its frontends from a callback on the future.

        Raises:
            ResourceExhausted, DeadlineExceeded, Unavailable: as ``submit`` (``times`` too).
        """
        level = priority_level(priority, self._settings)
        self._check_accepting(level)
        now = self._clock()
        deadline = deadline_for(now, timeout_s, level_timeout_ms(level, self._settings))
        if is_expired(deadline, now):
            raise DeadlineExceeded(self._deadline_message(timeout_s or 0.0))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        pending = _Pending(item, future, now, deadline, level, times)
        insert_by_priority(self._queue, pending)
        self._queue_changed()
        self._wakeup.set()
        # The deadline is a timer that fails the future, not asyncio.wait (a waiter, a callback
        # and a timer per request: about 6% of the engine process's time per classification).
        timer = None
        if deadline is not None:
            timer = loop.call_later(deadline - now, self._expire, pending, deadline - now)
        return Ticket(future, timer, lambda: self._discard(pending))

    # --- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        """The loop, with a guard: a bug in it fails the waiting requests instead of hanging."""
        try:
            await self._loop()
        except Exception:
            logger.exception("batcher %s crashed", self.name)
            self._closed = True
            self._fail_queued(lambda: Internal(f"{self.name}: batcher crashed; see server log"))

    async def _loop(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                now = self._clock()
                self._drop_expired(now)
                if not self._queue:
                    if self._closed:
                        return
                    await self._wakeup.wait()
                elif len(self._running) >= self._settings.instances:
                    await self._batch_done()  # every instance busy: batch-mates keep queueing
                elif self._closed or self._ready(now):  # draining: no need to wait for mates
                    self._dispatch(self._take_batch(now))
                else:
                    await self._sleep(
                        delay_remaining(self._queue[0].enqueued_at, now, self._max_delay_s)
                    )
        finally:
            if self._running:  # stopping (or a crash): the batches already running finish
                await asyncio.wait(self._running)

    def _dispatch(self, batch: list[_Pending[T, R]]) -> None:
        """Start running ``batch`` on a free instance; the loop goes on meanwhile."""
        task = asyncio.get_running_loop().create_task(self._execute(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _batch_done(self) -> None:
        """Wait until a running batch ends (what queues meanwhile forms the next batch)."""
        await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)

    def _ready(self, now: float) -> bool:
        full = batch_is_full(len(self._queue), self._settings.max_batch_size)
        oldest = self._queue[0].enqueued_at  # the next to go (with priorities: of the first level)
        return full or delay_remaining(oldest, now, self._max_delay_s) <= 0

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds`` or until a submit / stop wakes the loop."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)

    def _drop_expired(self, now: float) -> None:
        """Fail and remove queued requests past their deadline, so no compute is spent on them."""
        expired = [p for p in self._queue if is_expired(p.deadline, now)]
        for pending in expired:
            self._queue.remove(pending)
            waited = now - pending.enqueued_at
            self._settle(pending, error=DeadlineExceeded(self._deadline_message(waited)))
        if expired:
            self._queue_changed()

    def _take_batch(self, now: float) -> list[_Pending[T, R]]:
        """Pop up to ``max_batch_size`` live requests from the front (the highest priority first,
        then the oldest) and record their queue time."""
        batch: list[_Pending[T, R]] = []
        while self._queue and len(batch) < self._settings.max_batch_size:
            pending = self._queue.popleft()
            if not pending.future.done():  # a cancelled caller's item may still be here
                batch.append(pending)
        self._queue_changed()
        if self._instruments:
            for pending in batch:
                self._instruments.queue_time.observe(now - pending.enqueued_at)
        return batch

    async def _execute(self, batch: list[_Pending[T, R]]) -> None:
        """Run one batch in the executor and hand every item its own result or error."""
        if not batch:
            return
        items = [p.item for p in batch]
        started = self._clock()
        try:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self._executor, self._call_run_batch, items)
        except Exception as err:
            message = f"{self.name}: batch of {len(batch)} failed: {type(err).__name__}: {err}"
            for pending in batch:
                self._settle(pending, error=Internal(message), cause=err)
            return
        finally:
            ended = self._clock()
            self._record_batch(len(batch), ended - started)
            for pending in batch:
                if pending.times is not None:
                    pending.times += (pending.enqueued_at, started, ended)
        if len(results) != len(batch):
            message = (
                f"{self.name}: run_batch returned {len(results)} results for {len(batch)} items; "
                "it must return exactly one result or exception per item, in order"
            )
            for pending in batch:
                self._settle(pending, error=Internal(message))
            return
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                self._settle(pending, error=result)
            else:
                self._settle(pending, result=result)

    def _call_run_batch(self, items: list[T]) -> list[R | BaseException]:
        """Runs in the executor; ``list`` so a lazy sequence is evaluated off the event loop."""
        return list(self._run_batch(items))

    # --- small helpers -------------------------------------------------------------------------

    def _check_accepting(self, level: int) -> None:
        if self._closed:
            raise Unavailable(
                f"{self.name}: server is stopping; send the request to another replica"
            )
        if self._task is None:
            raise Unavailable(f"{self.name}: batcher is not started; call start() first")
        settings = self._settings
        policies = settings.priority_queue_policy
        if queue_is_full(self._queue, level, settings.max_queue_size, policies):
            limit, field = level_limit(level, settings.max_queue_size, policies)
            raise ResourceExhausted(
                f"{self.name}: queue is full ({limit} requests waiting, {field}); "
                "retry with backoff, or raise the limit / add replicas"
            )

    def _deadline_message(self, seconds: float) -> str:
        return (
            f"{self.name}: request not served within {seconds:.3f} s (the client's deadline, or "
            f"batching.timeout_ms={self._settings.timeout_ms} when it sets none); allow a longer "
            "deadline or add capacity"
        )

    def _expire(self, pending: _Pending[T, R], timeout: float) -> None:
        """The request's deadline passed without a result: fail it, drop it if still queued."""
        if not pending.future.done():
            pending.future.set_exception(DeadlineExceeded(self._deadline_message(timeout)))
        self._drop(pending)

    def _discard(self, pending: _Pending[T, R]) -> None:
        """Forget a request whose caller gave up; drop it from the queue if not yet dispatched."""
        if not pending.future.done():
            pending.future.cancel()
        self._drop(pending)

    def _drop(self, pending: _Pending[T, R]) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(pending)
            self._queue_changed()

    def _fail_queued(self, make_error: Callable[[], BaseException]) -> None:
        while self._queue:
            self._settle(self._queue.popleft(), error=make_error())
        self._queue_changed()

    @staticmethod
    def _settle(
        pending: _Pending[T, R],
        *,
        result: Any = None,
        error: BaseException | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """Complete a request's future unless its caller already gave up."""
        if pending.future.done():
            return
        if error is None:
            pending.future.set_result(result)
            return
        if cause is not None:
            error.__cause__ = cause
        pending.future.set_exception(error)

    def _queue_changed(self) -> None:
        if self._instruments and self._reports_depth:
            self._instruments.queue_depth.set(len(self._queue))

    def _record_batch(self, size: int, seconds: float) -> None:
        if self._instruments:
            self._instruments.batch_size.observe(size)
            self._instruments.compute_time.observe(seconds)
            self._instruments.request_compute.inc(seconds * size)
