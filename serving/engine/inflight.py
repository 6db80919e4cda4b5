"""In-flight batching of encoder-decoder generation.

One worker thread per model runs the decode loop. Every iteration it

1. drops waiting or running requests that were cancelled or ran past their deadline
   (their cache rows are freed at once);
2. admits waiting requests that fit (``AdmissionQueue``) and runs their encoder passes as one
   batch, appending their rows to the shared ``BatchKVCache``;
3. runs ONE decoder step for every active row together, picks each row's next token with the
   sequence's own sampler or beam search, and streams tokens back to the callers' event loops;
4. removes finished sequences.

Each sequence owns its sampler (and random generator), so its output does not depend on which
other requests share the batch.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.backends.base import BackendError
from serving.engine.cache import BatchKVCache
from serving.engine.scheduler import AdmissionLimits, AdmissionQueue
from serving.errors import Cancelled, DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from serving.generation.beam import BeamSearch
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler
from serving.metrics import ServingMetrics
from serving.model_config import Batching, DecoderSpec
from serving.seq2seq import Encoded, Seq2SeqRunner

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


class _Sequence:
    """A running request: its rows in the batch and its decoding state."""

    def __init__(self, request: GenerationRequest, spec: DecoderSpec, max_new: int, now: float):
        self.request = request
        self.options = request.options
        self.max_new = max_new
        self.tokens: list[int] = []
        self.generated = 0
        self.admitted = now
        self.last_token_time: float | None = None
        self.beam: BeamSearch | None = None
        self.sampler: RowSampler | None = None
        if self.options.beam_size > 1:
            self.beam = BeamSearch(
                beam_size=self.options.beam_size,
                eos_id=spec.eos_id,
                max_new_tokens=max_new,
                min_new_tokens=self.options.min_new_tokens,
                length_penalty=self.options.length_penalty,
                num_alternatives=self.options.num_alternatives,
            )
        else:
            self.sampler = RowSampler(self.options, eos_id=spec.eos_id)
        self.next_inputs = np.full(request.rows, spec.decoder_start_id, dtype=np.int64)


class InFlightEngine:
    """Generation for one seq2seq model with in-flight batching over one backend."""

    def __init__(
        self,
        name: str,
        runner: Seq2SeqRunner,
        spec: DecoderSpec,
        max_new_tokens: int,
        batching: Batching,
        metrics: ServingMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.runner = runner
        self.spec = spec
        self.max_new_tokens = max_new_tokens
        self.batching = batching
        self.metrics = metrics
        self.clock = clock
        max_rows = batching.max_active_sequences if batching.in_flight else batching.max_batch_size
        self.queue: AdmissionQueue[GenerationRequest] = AdmissionQueue(
            AdmissionLimits(
                max_rows=max_rows,
                max_queue=batching.max_queue_size,
                token_budget=batching.token_budget,
                max_joiners=max(1, batching.max_batch_size),
            ),
            clock,
        )
        self.cache = BatchKVCache(spec.num_layers, spec.num_heads, spec.head_dim, runner.kv_dtype)
        self.sequences: list[_Sequence] = []
        self._wake = threading.Condition()
        self._outbox = Outbox()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decoder steps run (tests and benchmarks read it)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish running and queued work (until ``timeout``), then stop the worker."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        for request in self.queue.drain():
            request.emit(ErrorEvent(Unavailable("the server is shutting down; retry elsewhere")))

    @property
    def running(self) -> bool:
        """The worker thread runs and the engine takes requests."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def active_rows(self) -> int:
        return self.cache.rows

    # --- the caller's side ----------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Queue ``request`` and yield its events until the final one.

        Raises:
            Unavailable: the engine is stopping.
            ResourceExhausted: the queue is full.
        """
        async for chunk in self.generate_chunks(request):
            for event in chunk:
                yield event

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        """Like ``generate``, but each item is every event that has arrived since the last one.

        A caller that falls behind the decode loop (a slow stream) gets several tokens at once
        and can send them as one message.
        """
        if self._stopping:
            raise Unavailable(f"model {self.name!r} is shutting down; retry on another replica")
        events = request.attach(asyncio.get_running_loop())
        if not self.queue.offer(request):
            raise ResourceExhausted(
                f"model {self.name!r} has {self.batching.max_queue_size} requests waiting "
                "(batching.max_queue_size); retry later or raise the limit"
            )
        self._gauge_queue()
        with self._wake:
            self._wake.notify()
        try:
            while True:
                chunk = [await events.get()]
                while not events.empty() and not isinstance(chunk[-1], FinishEvent | ErrorEvent):
                    chunk.append(events.get_nowait())
                yield chunk
                if isinstance(chunk[-1], FinishEvent | ErrorEvent):
                    return
        finally:
            request.cancel()  # a no-op after the final event; frees the rows otherwise
            with self._wake:
                self._wake.notify()

    # --- the worker thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self.sequences and not len(self.queue) and not self._stopping:
                    self._wake.wait(timeout=0.5)
                if self._stopping and not self.sequences and not len(self.queue):
                    return
            try:
                self._iterate()
            except BackendError as err:
                self._fail_all(Internal(f"model {self.name!r}: {err}"))
            except Exception as err:  # never let the worker die silently: fail the batch instead
                self._fail_all(Internal(f"model {self.name!r}: {type(err).__name__}: {err}"))
            finally:
                self._outbox.flush()

    def _iterate(self) -> None:
        self._drop_dead()
        joiners = self.queue.admit(self.cache.rows)
        self._gauge_queue()
        if joiners:
            self._admit(joiners)
        if self.sequences:
            self._step()
        self._gauges()

    def _drop_dead(self) -> None:
        expired, cancelled = self.queue.drop_dead()
        for request in expired:
            self._outbox.post(request, ErrorEvent(_deadline_error(self.name)))
        for request in cancelled:
            self._outbox.post(request, ErrorEvent(Cancelled("the request was cancelled")))
        now = self.clock()
        gone = []
        for seq in self.sequences:
            request = seq.request
            if request.is_cancelled():
                gone.append(seq)
                self._outbox.post(request, ErrorEvent(Cancelled("the request was cancelled")))
            elif request.deadline is not None and now >= request.deadline:
                gone.append(seq)
                self._outbox.post(request, ErrorEvent(_deadline_error(self.name)))
        if gone:
            self._remove(gone)

    def _admit(self, joiners: list[GenerationRequest]) -> None:
        started = self.clock()
        try:
            encoded = self._encode(joiners)
        except Exception as err:  # this encoder batch fails alone; the decode batch goes on
            cause = str(err) if isinstance(err, BackendError) else f"{type(err).__name__}: {err}"
            for request in joiners:  # they left the queue: an event is all they will ever get
                self._outbox.post(request, ErrorEvent(Internal(f"model {self.name!r}: {cause}")))
            return
        rows_per = [request.rows for request in joiners]
        repeat = np.repeat(np.arange(len(joiners)), rows_per)
        cross = [c[repeat] for c in encoded.cross]
        self.cache.add_rows(cross, encoded.mask[repeat])
        now = self.clock()
        self._observe("compute_time", now - started, stage="encoder")
        self._observe("batch_size", len(joiners), stage="encoder")
        for request in joiners:
            limit = request.options.max_new_tokens or self.max_new_tokens
            seq = _Sequence(request, self.spec, limit, now)
            self._observe("queue_time", now - request.arrival)
            self.sequences.append(seq)

    def _encode(self, joiners: list[GenerationRequest]) -> Encoded:
        if joiners[0].source_ids is not None:
            length = max(len(r.source_ids) for r in joiners)  # type: ignore[arg-type]
            ids = np.full((len(joiners), length), self.spec.pad_id, dtype=np.int64)
            mask = np.zeros((len(joiners), length), dtype=np.int64)
            for row, request in enumerate(joiners):
                assert request.source_ids is not None
                ids[row, : len(request.source_ids)] = request.source_ids
                mask[row, : len(request.source_ids)] = 1
            return self.runner.encode({"input_ids": ids, "attention_mask": mask})
        pixels = np.stack([r.pixels for r in joiners]).astype(self.runner.kv_dtype)
        return self.runner.encode({"pixel_values": pixels})

    def _step(self) -> None:
        started = self.clock()
        input_ids = np.concatenate([seq.next_inputs for seq in self.sequences])[:, None]
        positions = np.concatenate(
            [np.full(seq.request.rows, seq.generated, dtype=np.int64) for seq in self.sequences]
        )[:, None]
        step_mask = self.cache.step_mask()
        encoded = Encoded(self.cache.cross, self.cache.cross_mask)
        logits, presents = self.runner.step(
            input_ids, positions, step_mask, self.cache.past, encoded
        )
        self.cache.append(presents, step_mask)
        self.steps += 1
        now = self.clock()
        self._observe("compute_time", now - started, stage="decoder_step")
        self._observe("batch_size", len(input_ids), stage="decoder_step")

        keep: list[np.ndarray] = []
        finished: list[_Sequence] = []
        first = 0
        for seq in self.sequences:
            rows = np.arange(first, first + seq.request.rows)
            first += seq.request.rows
            done = self._advance(seq, logits[rows, -1], now)
            if done:
                finished.append(seq)
            else:
                keep.append(rows[self._row_order(seq)])
        if finished or any(seq.beam is not None for seq in self.sequences):
            self.sequences = [seq for seq in self.sequences if seq not in finished]
            self.cache.keep_rows(np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64))

    def _row_order(self, seq: _Sequence) -> np.ndarray:
        return seq.parents if seq.beam is not None else np.zeros(1, dtype=np.int64)  # type: ignore[attr-defined]

    def _advance(self, seq: _Sequence, logits: np.ndarray, now: float) -> bool:
        """Choose the sequence's next token(s); True when the sequence is finished."""
        seq.generated += 1
        if seq.beam is not None:
            parents, tokens = seq.beam.step(logits)
            seq.parents = parents  # type: ignore[attr-defined]
            seq.next_inputs = np.asarray(tokens, dtype=np.int64)
            self._count_token(seq, now)
            if seq.beam.done or seq.generated >= self._position_limit(seq):
                return self._finish_beam(seq)
            return False
        assert seq.sampler is not None
        token = seq.sampler.choose(logits[0], seq.generated - 1)
        self._count_token(seq, now)
        if token == self.spec.eos_id:
            return self._finish(seq, "stop")
        seq.tokens.append(token)
        seq.next_inputs = np.array([token], dtype=np.int64)
        self._outbox.post(seq.request, TokenEvent(token, len(seq.tokens) - 1))
        if len(seq.tokens) >= seq.max_new or seq.generated >= self._position_limit(seq):
            return self._finish(seq, "length")
        return False

    def _position_limit(self, seq: _Sequence) -> int:
        """The decoder position table bounds the sequence (start token included)."""
        return min(seq.max_new, self.spec.max_positions - 1)

    def _count_token(self, seq: _Sequence, now: float) -> None:
        if seq.last_token_time is None:
            self._observe("time_to_first_token", now - seq.request.arrival)
        else:
            self._observe("time_per_output_token", now - seq.last_token_time)
        seq.last_token_time = now
        if self.metrics is not None:
            self.metrics.generated_tokens.labels(self.name).inc()

    def _finish(self, seq: _Sequence, reason: str) -> bool:
        self._outbox.post(
            seq.request,
            FinishEvent(
                reason=reason,
                tokens=list(seq.tokens),
                input_tokens=seq.request.source_tokens,
                queue_seconds=seq.admitted - seq.request.arrival,
            ),
        )
        return True

    def _finish_beam(self, seq: _Sequence) -> bool:
        assert seq.beam is not None
        best = seq.beam.best()
        top = best[0]
        for index, token in enumerate(top.tokens):
            self._outbox.post(seq.request, TokenEvent(token, index))
        reason = "stop" if top.finished else "length"
        self._outbox.post(
            seq.request,
            FinishEvent(
                reason=reason,
                tokens=list(top.tokens),
                score=float(top.score),
                alternatives=[(list(h.tokens), float(h.score)) for h in best[1:]],
                input_tokens=seq.request.source_tokens,
                queue_seconds=seq.admitted - seq.request.arrival,
            ),
        )
        return True

    def _remove(self, gone: list[_Sequence]) -> None:
        keep, first = [], 0
        for seq in self.sequences:
            rows = np.arange(first, first + seq.request.rows)
            first += seq.request.rows
            if seq not in gone:
                keep.append(rows)
        self.sequences = [seq for seq in self.sequences if seq not in gone]
        self.cache.keep_rows(np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64))

    def _fail_all(self, error: Exception) -> None:
        """A backend failure fails the requests of this batch only; later ones run normally."""
        for seq in self.sequences:
            self._outbox.post(seq.request, ErrorEvent(error))
        self._remove(list(self.sequences))
        self._gauges()

    # --- metrics --------------------------------------------------------------------------------
    def _observe(self, metric: str, value: float, **labels: Any) -> None:
        if self.metrics is not None:
            getattr(self.metrics, metric).labels(model=self.name, **labels).observe(value)

    def _gauge_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(len(self.queue))

    def _gauges(self) -> None:
        if self.metrics is None:
            return
        capacity = self.queue.limits.max_rows * self.spec.max_positions
        self.metrics.active_sequences.labels(self.name).set(len(self.sequences))
        self.metrics.kv_cache_tokens.labels(self.name).set(self.cache.tokens)
        self.metrics.kv_cache_usage.labels(self.name).set(self.cache.tokens / capacity)


def _deadline_error(name: str) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"the deadline passed before model {name!r} finished; allow more time or ask for fewer "
        "new tokens"
    )
