"""In-flight batching of encoder-decoder generation.

One worker thread per model runs the decode loop. Every iteration it

1. drops waiting or running requests that were cancelled or ran past their deadline
   (their cache rows are freed at once);
2. admits waiting requests that fit (``AdmissionQueue``; with ``in_flight`` off only into an
   empty batch) and runs their encoder passes as one batch, taking rows of the ``DecodeCache``;
3. runs ONE decoder step for every active row together, picks each row's next token with the
   sequence's own sampler or beam search, and streams tokens back to the callers' event loops
   (when every row is greedy, for all rows at once: the rows' state lives in numpy arrays,
   ``RowState``, and no Python runs per row unless a request takes its tokens as events);
4. removes finished sequences.

With ``overlap`` (``batching.overlap_steps``), a greedy step whose tokens are chosen starts the
next step of the rows that go on, on a thread of its own, before its bookkeeping (streaming the
tokens, finishing sequences, metrics): that Python then runs while the device computes instead
of between its steps. Nothing joins while such a step runs (joiners wait for the step after it);
sequences that leave meanwhile are dropped from its result.

With ``block`` (``batching.decode_block``) and a cache with a decode block graph, the greedy
steps of a batch in which every sequence decodes greedily and none waits to join run K at a time:
one run of the device (``InPlaceKVCache.step_block``), then each step's bookkeeping in turn, as
for a single greedy step. A sequence that ends within a block drops the block's later picks for
it; tokens stream K at a time.

Each sequence owns its sampler (and random generator), so its output does not depend on which
other requests share the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from contract.model_config import DecoderSpec, InFlightBatching
from serving.backends.base import BackendError
from serving.batching.priority import level_limit
from serving.engine.decode_cache import DecodeCache
from serving.engine.gauges import GaugeBoard
from serving.engine.inplace_cache import InPlaceKVCache
from serving.engine.meters import EngineMeters
from serving.engine.padded_cache import PaddedKVCache
from serving.engine.requests import (
    ErrorEvent,
    Event,
    EventChannel,
    FinishEvent,
    GenerationRequest,
    Listener,
    Outbox,
    TokenEvent,
)
from serving.engine.row_state import RowState
from serving.engine.scheduler import AdmissionLimits, AdmissionQueue
from serving.engine.step_layout import ActiveSequence, StepAhead, StepLayout
from serving.errors import Cancelled, DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from serving.generation.sampling import greedy_decide, greedy_rows
from serving.metrics import ServingMetrics
from serving.seq2seq import Encoded, Seq2SeqRunner, padded_sources

# greedy rows from which the step chooses their tokens in one numpy pass (``greedy_rows``)
GREEDY_PASS_ROWS = 4
# Between joins and leaves the gauges (queue depth, cached tokens) are set at most this often: a
# scrape reads them seconds apart, and setting them every step costs as much as a step's token
# counting. A join or leave sets them at once.
GAUGE_INTERVAL_S = 0.05


class InFlightEngine:
    """Generation for one seq2seq model with in-flight batching over one backend."""

    def __init__(
        self,
        name: str,
        runner: Seq2SeqRunner,
        spec: DecoderSpec,
        max_new_tokens: int,
        batching: InFlightBatching,
        metrics: ServingMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        cache: DecodeCache | None = None,
        instance: int = 0,
        gauge_board: GaugeBoard | None = None,
        overlap: bool = False,
        block: bool = False,
        version: str = "",
    ) -> None:
        """Create a stopped engine; ``start()`` it.

        Args:
            name: the model's name (messages, metric labels).
            version: the model's version (the metrics' ``version`` label).
            runner: runs the encoder (and, for the padded cache, the decoder).
            spec: the decoder facts.
            max_new_tokens: the model's limit on generated tokens.
            batching: admission limits and queue settings.
            metrics: where to record; None in tests.
            clock: monotonic seconds; injectable for tests.
            cache: the KV cache; by default the padded cache over ``runner`` (see
                ``serving.engine.decode_cache`` for the in-place one).
            instance: this engine's index among the model's instances (``EnginePool``).
            gauge_board: where the instances' gauges are summed into the model's; None for a
                model of one instance.
            overlap: start a greedy step's successor before its bookkeeping (module docstring;
                the in-place cache only).
            block: run greedy steps K at a time where the cache has a decode block graph
                (``InPlaceKVCache.step_block``; module docstring).
        """
        self.name = name
        self.runner = runner
        self.spec = spec
        self.max_new_tokens = max_new_tokens
        self.batching = batching
        self.clock = clock
        max_rows = batching.decode_rows
        self.queue: AdmissionQueue[GenerationRequest] = AdmissionQueue(
            AdmissionLimits(
                max_rows=max_rows,
                max_queue=batching.max_queue_size,
                token_budget=batching.token_budget,
                max_joiners=max(1, batching.max_batch_size),
                policies=batching.priority_queue_policy,
            ),
            clock,
        )
        self.cache: DecodeCache = cache or PaddedKVCache(runner, max_rows * spec.max_positions)
        self.sequences: list[ActiveSequence] = []
        self._wake = threading.Condition()
        self._outbox = Outbox()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decoder steps run (tests and benchmarks read it)
        self._joined_at = 0  # self.steps when requests last joined (join_interval_steps)
        self._joining_rows = 0  # rows of the joiners whose encoder pass runs now
        self._suppress = np.asarray(sorted(set(spec.suppress_ids)), dtype=np.int64)
        self._state = RowState(max_rows, spec.max_positions)
        self.meters = EngineMeters(name, metrics, self._state, instance, gauge_board, version)
        self._layout = StepLayout(self._state)  # of ``sequences``, changed with them
        # set when a request of this engine is cancelled: the next iteration looks for its rows
        self._cancels = threading.Event()
        self._earliest_deadline = math.inf  # at most the running sequences' earliest deadline
        self._gauged_at = -math.inf  # the clock when the gauges were last set
        self._gauges_due = False  # a sequence joined or left since then
        if overlap and not hasattr(self.cache, "start_greedy"):
            raise ValueError("overlap needs a cache that starts steps on a thread (in-place)")
        self.overlap = overlap
        self._ahead: StepAhead | None = None  # the step started during the last bookkeeping
        self._executor: ThreadPoolExecutor | None = None  # its thread, made on first use
        self.steps_ahead = 0  # steps started before the last one's bookkeeping (tests read it)
        # the cache whose decode block runs greedy steps K at a time (None: one step per run)
        self._block = (
            cache if block and isinstance(cache, InPlaceKVCache) and cache.block_steps else None
        )
        self._single_next = False  # the last block stopped at an undecided pick: one step next
        self.blocks = 0  # decode blocks run (tests and benchmarks read it)
        self.blocks_cut = 0  # blocks stopped at an undecided pick (tests read it)

    @property
    def metrics(self) -> ServingMetrics | None:
        """Where the engine records (its ``meters``'); settable before ``start``."""
        return self.meters.metrics

    @metrics.setter
    def metrics(self, metrics: ServingMetrics | None) -> None:
        self.meters.metrics = metrics

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
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        for request in self.queue.drain():
            request.emit(ErrorEvent(Unavailable("the server is shutting down; retry elsewhere")))

    @property
    def running(self) -> bool:
        """The worker thread runs and the engine takes requests."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def max_rows(self) -> int:
        """Decode rows the cache has (a request needs one per beam)."""
        return self.queue.limits.max_rows

    @property
    def active_rows(self) -> int:
        return self.cache.rows

    @property
    def waiting_rows(self) -> int:
        """Rows of the requests that wait or are being admitted (their encoder pass runs)."""
        return self.queue.rows + self._joining_rows

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
        events = self.submit(request)
        ended = False
        try:
            while True:
                chunk = await events.chunk()
                ended = isinstance(chunk[-1], FinishEvent | ErrorEvent)
                yield chunk
                if ended:
                    return
        finally:
            if not ended:  # the caller left early: free its rows before the next step
                request.cancel()
                with self._wake:
                    self._wake.notify()

    def submit(self, request: GenerationRequest, listener: Listener | None = None) -> EventChannel:
        """Queue ``request`` (on the caller's running loop); its events arrive in the returned
        channel, or are handed to ``listener`` on the loop as they come (``EventChannel``). The
        caller cancels the request if it stops listening before its final event.

        Raises:
            Unavailable: the engine is stopping.
            ResourceExhausted: the queue is full.
        """
        if self._stopping:
            raise Unavailable(f"model {self.name!r} is shutting down; retry on another replica")
        interval = self.batching.stream_interval_ms / 1000
        events = request.attach(asyncio.get_running_loop(), interval, listener)
        if interval:  # tokens are held for the interval in the channel: none bypass it
            request.token_route = None
        request.watch_cancel(self._cancels.set)
        if not self.queue.offer(request):
            b = self.batching
            limit, field = level_limit(request.priority, b.max_queue_size, b.priority_queue_policy)
            raise ResourceExhausted(
                f"model {self.name!r} has {limit} requests waiting ({field}); retry later or "
                "raise the limit"
            )
        self._gauge_queue()
        with self._wake:
            self._wake.notify()
        return events

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
        if self._ahead is not None and not self.sequences:  # every one of its rows left
            self._discard_ahead()
        # Without in-flight batching a batch runs to its end before the next one is admitted;
        # nothing joins while a step started ahead runs (the cache's rows are busy).
        joining = self._ahead is None and (
            not self.sequences or (self.batching.in_flight and self._joining_due())
        )
        joiners = self.queue.admit(self.cache.rows) if joining else []
        if joiners:
            self._gauge_queue()  # before their encoder pass: they left the queue
            self._joined_at = self.steps
            self._admit(joiners)
        if self.sequences:
            self._step()
        if self._gauges_due or self.clock() - self._gauged_at >= GAUGE_INTERVAL_S:
            self._gauges()

    def _joining_due(self, ahead: int = 0) -> bool:
        """Waiting requests may join the running batch at this step (or, with ``ahead``, at
        one of the next ``ahead`` steps): ``join_interval_steps`` have passed since the last
        join, or a full encoder batch waits."""
        interval = self.batching.join_interval_steps
        return (
            interval <= 1
            or self.steps + ahead - self._joined_at >= interval
            or len(self.queue) >= self.batching.max_batch_size
        )

    def _joins_within(self, steps: int) -> bool:
        """A waiting request could join the running batch within the next ``steps`` steps, so
        that a block of them would hold it back. Without in-flight batching nothing joins a
        running batch."""
        return bool(len(self.queue)) and self.batching.in_flight and self._joining_due(steps - 1)

    def _drop_dead(self) -> None:
        """Cancelled and expired requests leave, waiting or running. Their requests are looked
        at only when one was cancelled or a deadline may have passed: a check of every request
        at every step costs more than the step's own bookkeeping."""
        now = self.clock()
        cancels = self._cancels.is_set()
        if cancels:
            self._cancels.clear()  # a cancel from now on sets it again: none is missed
        if cancels or now >= self.queue.earliest_deadline:
            expired, cancelled = self.queue.drop_dead()
            for request in expired:
                self._outbox.post(request, ErrorEvent(_deadline_error(self.name)))
            for request in cancelled:
                self._outbox.post(request, ErrorEvent(Cancelled("the request was cancelled")))
        if not cancels and now < self._earliest_deadline:
            return
        gone, earliest = [], math.inf
        for index, seq in enumerate(self.sequences):
            request = seq.request
            if request.is_cancelled():
                gone.append(index)
                if request.keep is None:
                    self._outbox.post(request, ErrorEvent(Cancelled("the request was cancelled")))
                else:  # a stop string: the output ends with its first ``keep`` tokens
                    generated = int(self._state.generated[seq.slot])
                    self._finish(seq, "stop_sequence", min(request.keep, generated))
            elif request.deadline is not None and now >= request.deadline:
                gone.append(index)
                self._outbox.post(request, ErrorEvent(_deadline_error(self.name)))
            elif request.deadline is not None:
                earliest = min(earliest, request.deadline)
        self._earliest_deadline = earliest
        if gone:
            self._remove(gone)

    def _admit(self, joiners: list[GenerationRequest]) -> None:
        started = self.clock()
        self._joining_rows = sum(request.rows for request in joiners)
        try:
            rows = self._encode_into_cache(joiners)
        finally:
            self._joining_rows = 0
        if rows is None:
            return
        now = self.clock()
        self.meters.batched("encoder", now - started, len(joiners))
        joined = []
        for request, request_rows in zip(joiners, rows, strict=True):
            limit = request.options.max_new_tokens or self.max_new_tokens
            # a request's wait ends where its admission starts: the encoder pass is compute
            seq = ActiveSequence(request, self.spec, limit, started)
            seq.rows = request_rows
            self.meters.observe("queue_time", started - request.arrival)
            joined.append(seq)
        slots = self._state.take(
            [len(seq.rows) for seq in joined],
            self.spec.decoder_start_id,
            [seq.min_new for seq in joined],
            [seq.forced_eos_at for seq in joined],
            [seq.limit for seq in joined],
            [-1 if r.token_route is None else r.token_route[1] for r in joiners],
        )
        for seq, seq_slots in zip(joined, slots, strict=True):
            seq.slots, seq.slot = seq_slots, int(seq_slots[0])
            if seq.request.deadline is not None:
                self._earliest_deadline = min(self._earliest_deadline, seq.request.deadline)
        self.sequences.extend(joined)
        self._layout.extend(joined)
        self._gauges_due = True

    def _encode_into_cache(self, joiners: list[GenerationRequest]) -> list[np.ndarray] | None:
        """The joiners' cache rows, after their encoder pass; None when that pass failed (then
        they alone fail; the decode batch goes on)."""
        try:
            encoded = self._encode(joiners)
        except Exception as err:
            cause = str(err) if isinstance(err, BackendError) else f"{type(err).__name__}: {err}"
            for request in joiners:  # they left the queue: an event is all they will ever get
                self._outbox.post(request, ErrorEvent(Internal(f"model {self.name!r}: {cause}")))
            return None
        return self.cache.admit(encoded, [request.rows for request in joiners])

    def _encode(self, joiners: list[GenerationRequest]) -> Encoded:
        # on a device the in-place cache takes the encoder's output where it is computed
        device = getattr(self.cache, "encoder_device", None)
        if joiners[0].source_ids is not None:
            sources = [r.source_ids for r in joiners if r.source_ids is not None]
            ids, mask = padded_sources(sources, self.spec.pad_id)
            return self.runner.encode({"input_ids": ids, "attention_mask": mask}, device)
        images = []
        for request in joiners:
            assert request.pixels is not None
            images.append(request.pixels)
        pixels = np.stack(images).astype(self.runner.kv_dtype)
        encoded = self.runner.encode({"pixel_values": pixels}, device)
        for request in joiners:
            request.encoded_positions = int(encoded.mask.shape[1])
        return encoded

    def _step(self) -> None:
        started = self.clock()
        sequences = self.sequences
        layout = self._layout.current()
        state, rows = self._state, layout.rows
        positions = state.generated[layout.slots]  # a beam's rows share their sequence's count
        done = positions if layout.single else state.generated[layout.first]
        input_ids = state.next_id[layout.slots]
        if (
            self._block is not None
            and layout.single
            and layout.greedy
            and self._block_due(layout, done)
        ):
            self._step_block(layout, input_ids, done, started)
            return
        if self._ahead is not None or (
            len(rows) >= GREEDY_PASS_ROWS and layout.single and layout.greedy
        ):
            self._step_greedy(layout, input_ids, done, started)
            return
        counts, offsets = layout.counts, layout.offsets
        logits = self.cache.step(rows, input_ids, positions)
        self.steps += 1
        now = self.clock()
        self.meters.batched("decoder_step", now - started, len(rows))
        greedy = self._greedy_tokens(sequences, logits, offsets, done, layout.first)
        finished: list[int] = []
        moves: list[tuple[np.ndarray, np.ndarray]] = []  # beams' (rows, rows they continue)
        for index, seq in enumerate(sequences):
            first = offsets[index]
            if seq.beam is not None:
                if self._advance_beam(seq, logits[first : first + counts[index]], now):
                    finished.append(index)
                elif seq.beam.generated:  # new beam i continues old beam parents[i]
                    moves.append((seq.rows, seq.rows[seq.parents]))
                continue
            token = greedy.get(index, -1)
            if token < 0:  # sampling, or a greedy row its sampler must decide
                assert seq.sampler is not None
                count = int(done[index])
                history = None  # the tokens so far, for the history rules only
                if seq.sampler.rules is not None:
                    history = state.tokens[seq.slot, :count]
                token = seq.sampler.choose(logits[first], count, history)
                if seq.sampler.log_probs:
                    state.log_probs[seq.slot, count] = seq.sampler.last_log_prob
                    if seq.sampler.top:
                        seq.tops.append(seq.sampler.last_top)
                if count + 1 == seq.forced and seq.greedy_after:  # past its target prefix
                    seq.greedy = True
                    self._layout.make_greedy(index)
            if self._advance(seq, token, now):
                finished.append(index)
        if moves:  # every request's beams in one copy (rows of requests never overlap)
            rows, sources = zip(*moves, strict=True)
            self.cache.reorder(np.concatenate(rows), np.concatenate(sources))
        layout.stepped_at = None  # tokens counted per sequence: their times to be read
        self.meters.count_new_tokens(now)
        if finished:
            self._remove(finished)

    def _step_greedy(
        self, layout: StepLayout, input_ids: np.ndarray, done: np.ndarray, started: float
    ) -> None:
        """A step in which every sequence is greedy with one row: the argmax over the allowed
        tokens (from the device where the cache can; the logits only if a row's sampler must
        decide, a NaN), and each row's bookkeeping for all rows at once."""
        state, slots = self._state, layout.slots
        if self._ahead is not None:  # started during the last step's bookkeeping
            running, self._ahead = self._ahead, None
            outputs, seconds = running.wait()  # from its start, not this iteration's
        else:
            no_eos = done < layout.min_new if layout.any_min_new else None
            outputs = self.cache.step_greedy(layout.rows, input_ids, done, no_eos)
            seconds = None
        self.steps += 1
        now = self.clock()
        took = now - started if seconds is None else seconds
        self.meters.batched("decoder_step", took, len(slots))
        eos_id = self.spec.eos_id
        chosen = greedy_decide(
            outputs.tokens,
            outputs.best,
            done,
            layout.min_new,
            eos_id,
            self._suppress,
            layout.forced_eos_at,
        )
        for index in np.flatnonzero(chosen < 0).tolist():  # its sampler decides (a NaN row)
            sampler = self.sequences[index].sampler
            assert sampler is not None
            chosen[index] = sampler.choose(outputs.logits()[index], int(done[index]))
        generated = done + 1
        state.generated[slots] = generated
        stops = chosen == eos_id
        ending = stops | (generated >= layout.limit)
        ahead = self._start_ahead(layout, ending, chosen, generated) if self.overlap else None
        try:
            self._book_greedy(layout, chosen, done, stops, ending, now)
        finally:  # from now on a sequence that leaves is dropped from its result
            self._ahead = ahead

    def _block_due(self, layout: StepLayout, done: np.ndarray) -> bool:
        """The next greedy steps run as a block: no waiting request could join before the
        block's end, every row has its first token (a joiner's comes from a single step, at
        once), room for the block and, for one row at least, more than one token to go; and the
        last block did not stop at an undecided pick."""
        if self._single_next:
            self._single_next = False
            return False
        assert self._block is not None
        return (
            self._ahead is None
            and not self._joins_within(self._block.block_steps)
            and bool(done.all())
            and self._block.block_fits(done)
            and bool((layout.limit - done > 1).any())
        )

    def _step_block(
        self, layout: StepLayout, input_ids: np.ndarray, done: np.ndarray, started: float
    ) -> None:
        """The cache's block of greedy steps in one run, then each step's bookkeeping in turn
        as ``_step_greedy`` books one: sequences that end at a step leave before the next step
        is booked, their later picks dropped. At a step where a row's pick is undecided (a NaN:
        its sampler must see the logits) every row stops, and that step runs again alone."""
        cache = self._block
        assert cache is not None
        state, eos_id = self._state, self.spec.eos_id
        eos_after = np.maximum(layout.min_new - done, 0)
        tokens, best = cache.step_block(layout.rows, input_ids, done, eos_after)
        now = self.clock()
        self.blocks += 1
        per_step = (now - started) / cache.block_steps
        going = np.arange(len(done))  # the running sequences' rows of the block's outputs
        for column in range(cache.block_steps):
            layout = self._layout.current()
            done = state.generated[layout.slots]
            chosen = greedy_decide(
                tokens[going, column],
                best[going, column],
                done,
                layout.min_new,
                eos_id,
                self._suppress,
                layout.forced_eos_at,
            )
            if (chosen < 0).any():
                self._single_next = True
                self.blocks_cut += 1
                return
            self.steps += 1
            self.meters.batched("decoder_step", per_step, len(going))
            generated = done + 1
            state.generated[layout.slots] = generated
            stops = chosen == eos_id
            ending = stops | (generated >= layout.limit)
            self._book_greedy(layout, chosen, done, stops, ending, now)
            going = going[~ending]
            if not len(going):
                return

    def _book_greedy(
        self,
        layout: StepLayout,
        chosen: np.ndarray,
        done: np.ndarray,
        stops: np.ndarray,
        ending: np.ndarray,
        now: float,
    ) -> None:
        """A greedy step's bookkeeping: token times, the rows' tokens, streaming, finishes."""
        state, slots = self._state, layout.slots
        self.meters.count_tokens(layout, self.sequences, now)
        going = ~stops if stops.any() else None  # None: every row goes on (the usual step)
        live = slice(None) if going is None else going  # a slice: views, no copies
        kept, tokens = slots[live], chosen[live]
        state.tokens[kept, done[live]] = tokens
        state.next_id[kept] = tokens
        for sink, indices, keys in layout.sinks:
            if indices is None and going is None:  # all rows, in order: the step's own arrays
                self._outbox.post_tokens(sink, keys, chosen, done)
                continue
            if indices is None:
                indices = np.arange(len(slots))
            if going is not None:
                live = going[indices]
                indices, keys = indices[live], keys[live]
            if len(indices):
                self._outbox.post_tokens(sink, keys, chosen[indices], done[indices])
        for index in layout.unrouted:
            if going is None or going[index]:
                request = self.sequences[index].request
                self._outbox.post(request, TokenEvent(int(chosen[index]), int(done[index])))
        finished = np.flatnonzero(ending).tolist()
        for index in finished:
            seq = self.sequences[index]
            if stops[index]:
                self._finish(seq, "stop", int(done[index]))
            else:
                self._finish(seq, "length", int(done[index]) + 1)
        self.meters.count_new_tokens(now)
        if finished:
            self._remove(finished)

    def _start_ahead(
        self, layout: StepLayout, ending: np.ndarray, chosen: np.ndarray, generated: np.ndarray
    ) -> StepAhead | None:
        """The next step of the sequences that go on, started on the step thread; None when
        none goes on or a waiting request may join now (it joins first)."""
        leaving = int(ending.sum())
        if leaving == len(ending) or (
            len(self.queue)
            and self._joining_due()
            and self.queue.can_admit(self.cache.rows - leaving)
        ):
            return None
        rows, ids, positions, min_new = layout.rows, chosen, generated, layout.min_new
        if leaving:
            go = ~ending
            rows, ids, positions, min_new = rows[go], ids[go], positions[go], min_new[go]
        no_eos = positions < min_new if layout.any_min_new else None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"step-{self.name}")
        start = self.cache.start_greedy  # type: ignore[attr-defined]  # __init__ checked it
        result = start(rows, ids, positions, no_eos, self._executor)
        self.steps_ahead += 1
        return StepAhead(result, len(rows))

    def _discard_ahead(self) -> None:
        """Wait for the step started ahead and drop its result (its rows left, or failed)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with contextlib.suppress(Exception):  # its rows are gone, or failing already
                ahead.result()

    def _greedy_tokens(
        self,
        sequences: list[ActiveSequence],
        logits: np.ndarray,
        offsets: list[int],
        done: np.ndarray,
        first: np.ndarray,
    ) -> dict[int, int]:
        """The greedy sequences' tokens in one pass (``greedy_rows``), by index in ``sequences``;
        -1 where the sequence's sampler must decide. Below ``GREEDY_PASS_ROWS`` greedy rows each
        sampler decides (one pass costs more than a few rows' own argmax)."""
        picked = [i for i, seq in enumerate(sequences) if seq.greedy]
        if len(picked) < GREEDY_PASS_ROWS:
            return {}
        every_row = len(picked) == len(logits)  # each sequence greedy, a row each: no gather
        slots = first[picked]
        chosen = greedy_rows(
            logits if every_row else logits[[offsets[i] for i in picked]],
            done[picked],
            self._state.min_new[slots],
            self.spec.eos_id,
            self._suppress,
            self._state.forced_eos_at[slots],
        )
        return dict(zip(picked, chosen.tolist(), strict=True))

    def _advance(self, seq: ActiveSequence, token: int, now: float) -> bool:
        """Record the sequence's next token; True when the sequence is finished."""
        state, slot = self._state, seq.slot
        done = int(state.generated[slot])
        state.generated[slot] = done + 1
        self.meters.count_token(seq, now)
        if token == self.spec.eos_id:
            return self._finish(seq, "stop", done)
        state.tokens[slot, done] = token
        state.next_id[slot] = token
        if seq.options.return_log_probs:  # with its log-probability: never in token columns
            log_prob = float(state.log_probs[slot, done])
            top = seq.tops[done] if seq.tops else None
            self._outbox.post(seq.request, TokenEvent(token, done, log_prob, top))
        else:
            self._outbox.post_token(seq.request, token, done)
        if done + 1 >= seq.limit:
            return self._finish(seq, "length", done + 1)
        return False

    def _advance_beam(self, seq: ActiveSequence, logits: np.ndarray, now: float) -> bool:
        """Advance the sequence's beams; True when the sequence is finished."""
        assert seq.beam is not None
        state = self._state
        generated = int(state.generated[seq.slot]) + 1
        state.generated[seq.slots] = generated
        if generated <= seq.forced:  # the target prefix: every beam is fed its next token
            state.next_id[seq.slots] = seq.request.prefix[generated - 1]
            self.meters.count_token(seq, now)
            return False  # the prefix leaves room for a token: the search ends after it
        parents, tokens = seq.beam.step(logits)
        seq.parents = np.asarray(parents, dtype=np.int64)
        state.next_id[seq.slots] = np.asarray(tokens, dtype=np.int64)
        self.meters.count_token(seq, now)
        if seq.beam.done or generated >= seq.limit:
            return self._finish_beam(seq)
        return False

    def _finish(self, seq: ActiveSequence, reason: str, count: int) -> bool:
        """Post the sequence's finish with its first ``count`` tokens (and, with
        ``return_log_probs``, their log-probabilities and their sum as the score, with EOS's
        where it ended with one: reason "stop")."""
        tokens = self._state.tokens_of(seq.slot, count)
        if not seq.options.return_log_probs:
            return self._post_finish(seq, reason=reason, tokens=tokens)
        chosen = self._state.log_probs[seq.slot, : count + (reason == "stop")]
        log_probs = chosen[:count].tolist()
        score = float(chosen.sum())
        tops = seq.tops[:count] if seq.options.top_log_probs else None
        return self._post_finish(
            seq, reason=reason, tokens=tokens, log_probs=log_probs, score=score, top_log_probs=tops
        )

    def _finish_beam(self, seq: ActiveSequence) -> bool:
        assert seq.beam is not None
        best = seq.beam.best()
        top = best[0]
        scored = seq.options.return_log_probs  # each token's log-probability too
        topped = bool(seq.options.top_log_probs)  # and its position's most likely tokens
        for index, token in enumerate(top.tokens):
            log_prob = top.log_probs[index] if scored else None
            tops = top.tops[index] if topped else None
            self._outbox.post(seq.request, TokenEvent(token, index, log_prob, tops))
        return self._post_finish(
            seq,
            reason="stop" if top.finished else "length",
            tokens=list(top.tokens),
            score=float(top.score),
            log_probs=list(top.log_probs) if scored else None,
            alternatives=[(list(h.tokens), float(h.score), h.finished) for h in best[1:]],
            alternative_log_probs=[list(h.log_probs) for h in best[1:]] if scored else None,
            top_log_probs=list(top.tops) if topped else None,
            alternative_top_log_probs=[list(h.tops) for h in best[1:]] if topped else None,
        )

    def _post_finish(self, seq: ActiveSequence, **event: Any) -> bool:
        """Post the sequence's FinishEvent (``event``: its reason, tokens, ...); the time since
        its admission counts as its request's compute, once per request (not per step)."""
        request = seq.request
        computed = self.clock() - seq.admitted
        self.meters.request_computed(computed)
        finish = FinishEvent(
            input_tokens=request.input_tokens,
            queue_seconds=seq.admitted - request.arrival,
            compute_seconds=computed,
            **event,
        )
        self._outbox.post(request, finish)
        return True

    def _remove(self, gone: list[int]) -> None:
        """Drop the sequences at ``gone`` (ascending indices in ``sequences``) and free their
        cache rows at once."""
        if not gone:
            return
        sequences = self.sequences
        leaving = [sequences[index] for index in gone]
        kept = np.ones(len(sequences), dtype=bool)
        kept[gone] = False
        remaining = sequences.copy()
        for index in reversed(gone):
            del remaining[index]
        self.sequences = remaining
        self._layout.keep(kept)
        if self._ahead is not None:
            self._ahead.keep(kept)
        self._gauges_due = True
        self._state.give_back(np.concatenate([seq.slots for seq in leaving]))
        self.cache.release(np.concatenate([seq.rows for seq in leaving]))

    def _fail_all(self, error: Exception) -> None:
        """A backend failure fails the requests of this batch only; later ones run normally."""
        self._discard_ahead()
        for seq in self.sequences:
            self._outbox.post(seq.request, ErrorEvent(error))
        self.meters.drop_gaps()  # a step that failed part-way counted some of its rows
        self._remove(list(range(len(self.sequences))))
        self._gauges()

    # --- gauges ---------------------------------------------------------------------------------
    def _gauge_queue(self) -> None:
        if self.metrics is not None:
            self.meters.set("queue_depth", len(self.queue))

    def _gauges(self) -> None:
        if self.metrics is None:
            return
        self._gauged_at, self._gauges_due = self.clock(), False
        self._gauge_queue()
        tokens = self.cache.tokens
        self.meters.set("active_sequences", len(self.sequences))
        self.meters.set("kv_cache_tokens", tokens)
        self.meters.set("kv_cache_usage", tokens / self.cache.capacity_tokens)


def _deadline_error(name: str) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"the deadline passed before model {name!r} finished; allow more time or ask for fewer "
        "new tokens"
    )
