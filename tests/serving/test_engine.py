"""The in-flight engine over real ONNX Runtime sessions of a tiny exported translator.

Every engine test runs twice: with the growing cache of ``decoder.onnx`` and with the
fixed-capacity cache written in place by ``decoder_inplace.onnx``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.graphs import INPLACE_GRAPH_FILES, graph_files
from contract.repository import read_model_config, resolve_version
from serving.backends.base import BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.onnxruntime_io import InPlaceDecoder
from serving.engine.cache import BatchKVCache
from serving.engine.inflight import InFlightEngine
from serving.engine.inplace_cache import InPlaceKVCache
from serving.engine.requests import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from serving.engine.scheduler import AdmissionLimits, AdmissionQueue
from serving.errors import Cancelled, DeadlineExceeded, Internal, ResourceExhausted
from serving.generation.options import DecodingOptions
from serving.seq2seq import Seq2SeqRunner

# --- pure pieces --------------------------------------------------------------------------------


@dataclasses.dataclass
class Plain:
    rows: int = 1
    source_tokens: int = 5
    deadline: float | None = None
    cancelled: bool = False
    priority: int = 0

    def is_cancelled(self) -> bool:
        return self.cancelled


def test_admission_respects_capacity_budget_and_order() -> None:
    limits = AdmissionLimits(max_rows=4, max_queue=3, token_budget=20, max_joiners=8)
    queue: AdmissionQueue[Plain] = AdmissionQueue(limits, clock=lambda: 0.0)
    big, pair = Plain(rows=3), Plain(rows=2)
    assert queue.offer(big) and queue.offer(pair) and queue.offer(Plain())
    assert not queue.offer(Plain())  # full: the caller answers RESOURCE_EXHAUSTED
    assert queue.admit(active_rows=2) == []  # the beam request does not fit; nobody jumps it
    assert queue.admit(active_rows=0) == [big]  # 3 rows; 3 + 2 would exceed 4 rows
    assert queue.admit(active_rows=3) == []
    assert queue.admit(active_rows=2) == [pair]


def test_admission_token_budget_and_dead_requests() -> None:
    now = [0.0]
    limits = AdmissionLimits(max_rows=64, max_queue=10, token_budget=14, max_joiners=8)
    queue: AdmissionQueue[Plain] = AdmissionQueue(limits, clock=lambda: now[0])
    late, gone, a, b = Plain(deadline=1.0), Plain(cancelled=True), Plain(), Plain()
    for request in (late, gone, a, b):
        queue.offer(request)
    now[0] = 2.0
    assert queue.drop_dead() == ([late], [gone])
    assert queue.admit(active_rows=0) == [a, b]  # 6 + 6 tokens <= 14
    queue.offer(Plain(source_tokens=30))
    assert len(queue.admit(active_rows=0)) == 1  # an idle batch always admits one


def test_can_admit_says_whether_admit_would_take_the_oldest() -> None:
    limits = AdmissionLimits(max_rows=4, max_queue=10, token_budget=20, max_joiners=8)
    queue: AdmissionQueue[Plain] = AdmissionQueue(limits, clock=lambda: 0.0)
    assert not queue.can_admit(active_rows=0)  # nothing waits
    oldest = Plain(rows=2, source_tokens=12)
    queue.offer(oldest)
    queue.offer(Plain())
    assert queue.can_admit(0) and queue.can_admit(2)
    assert not queue.can_admit(3) and len(queue) == 2  # 3 + 2 rows > 4; asking takes nothing
    assert queue.admit(3) == [] and queue.admit(2) == [oldest]  # as admit does
    tight = AdmissionLimits(max_rows=64, max_queue=10, token_budget=14, max_joiners=8)
    budget: AdmissionQueue[Plain] = AdmissionQueue(tight, clock=lambda: 0.0)
    budget.offer(Plain(source_tokens=12))
    assert budget.can_admit(0) and budget.can_admit(1)  # 1 + 13 <= 14
    assert not budget.can_admit(2) and budget.admit(2) == []  # 2 + 13 > 14


def test_cache_rows_join_leave_and_trim() -> None:
    cache = BatchKVCache(num_layers=1, num_heads=2, head_dim=4, dtype=np.float32)
    cross = [np.ones((2, 2, 3, 4), np.float32)] * 2
    cache.add_rows(cross, np.array([[1, 1, 1], [1, 1, 0]]))
    for _ in range(3):  # three steps for both rows
        mask = cache.step_mask()
        cache.append([np.zeros((2, 2, cache.length + 1, 4), np.float32)] * 2, mask)
    cache.add_rows([np.ones((1, 2, 5, 4), np.float32)] * 2, np.ones((1, 5), np.int64))
    assert cache.rows == 3 and cache.cross_mask.shape == (3, 5)
    assert cache.self_mask.tolist()[2] == [0, 0, 0]  # the newcomer's past is all holes
    mask = cache.step_mask()
    cache.append([np.zeros((3, 2, cache.length + 1, 4), np.float32)] * 2, mask)
    assert cache.tokens == 4 + 4 + 1
    cache.keep_rows(np.array([2]))  # the two long rows leave: their columns are trimmed
    assert cache.length == 1 and cache.tokens == 1 and cache.cross_mask.shape == (1, 5)
    cache.keep_rows(np.zeros(0, dtype=np.int64))
    assert cache.rows == 0 and cache.tokens == 0


# --- the engine on real graphs ------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator_backend(tiny_repository: Path):
    entry = tiny_repository / "translator"
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES}
    return OnnxRuntimeBackend(resolve_version(entry), files), read_model_config(entry)


@pytest.fixture(params=["growing", "inplace"])
def runner_and_config(request: pytest.FixtureRequest, translator_backend):
    backend, config = translator_backend
    return Seq2SeqRunner(backend, config.decoder), config, request.param


def inplace_cache(backend: OnnxRuntimeBackend, config, rows: int, decoder=InPlaceDecoder):
    sessions = {graph: backend.session(graph) for graph in INPLACE_GRAPH_FILES}
    device = decoder(sessions, config.decoder, rows, 20, config.limits.max_source_length)
    return InPlaceKVCache(device, config.decoder.pad_id)


def make_engine(runner_and_config, **batching) -> InFlightEngine:
    runner, config, kind = runner_and_config
    settings = dataclasses.replace(config.batching, **batching)
    rows = settings.max_active_sequences
    cache = inplace_cache(runner.backend, config, rows) if kind == "inplace" else None
    return InFlightEngine("translator", runner, config.decoder, 20, settings, cache=cache)


def source(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(8, 150, size=3 + seed % 5).astype(np.int64)


async def collect(engine: InFlightEngine, request: GenerationRequest, delay: float = 0.0):
    await asyncio.sleep(delay)
    events = [event async for event in engine.generate(request)]
    return events


def run(coro):
    return asyncio.run(coro)


OPTION_MIX = [
    DecodingOptions(max_new_tokens=12),
    DecodingOptions(max_new_tokens=9, beam_size=3, num_alternatives=1),
    DecodingOptions(max_new_tokens=15, temperature=0.8, top_k=20, seed=11),
    DecodingOptions(max_new_tokens=7, min_new_tokens=7),
]


def test_output_is_the_same_alone_and_in_flight(runner_and_config) -> None:
    requests = [(source(i), OPTION_MIX[i % len(OPTION_MIX)]) for i in range(12)]

    async def alone():
        engine = make_engine(runner_and_config)
        engine.start()
        try:
            out = []
            for ids, options in requests:
                events = await collect(engine, GenerationRequest(options=options, source_ids=ids))
                out.append(events[-1])
            return out, engine.steps
        finally:
            engine.stop()

    async def together():
        engine = make_engine(runner_and_config)
        engine.start()
        try:
            jobs = [
                collect(
                    engine, GenerationRequest(options=o, source_ids=ids), delay=0.003 * (i // 2)
                )
                for i, (ids, o) in enumerate(requests)
            ]  # in pairs, staggered: they join mid-decode, and a pair's two share steps
            # however fast the machine (one request at a time, a fast CI run shared none)
            return [events[-1] for events in await asyncio.gather(*jobs)], engine.steps
        finally:
            engine.stop()

    solo, solo_steps = run(alone())
    mixed, mixed_steps = run(together())
    assert all(isinstance(e, FinishEvent) for e in solo + mixed)
    assert [e.tokens for e in mixed] == [e.tokens for e in solo]
    assert [e.reason for e in mixed] == [e.reason for e in solo]
    assert mixed_steps < solo_steps  # sequences really shared decoder steps


def test_streamed_tokens_match_the_final_answer(runner_and_config) -> None:
    async def go():
        engine = make_engine(runner_and_config)
        engine.start()
        try:
            return await collect(
                engine,
                GenerationRequest(
                    options=DecodingOptions(max_new_tokens=10, min_new_tokens=10),
                    source_ids=source(3),
                ),
            )
        finally:
            engine.stop()

    events = run(go())
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [e.index for e in tokens] == list(range(10))
    assert [e.token_id for e in tokens] == events[-1].tokens and events[-1].reason == "length"


def test_cancel_frees_rows_and_expired_requests_fail(runner_and_config) -> None:
    async def go():
        engine = make_engine(runner_and_config)
        engine.start()
        try:
            long = GenerationRequest(
                options=DecodingOptions(max_new_tokens=20, min_new_tokens=20), source_ids=source(1)
            )
            stream = engine.generate(long)
            await stream.__anext__()
            await stream.aclose()  # the caller goes away
            for _ in range(200):
                if engine.active_rows == 0:
                    break
                await asyncio.sleep(0.005)
            assert engine.active_rows == 0 and engine.cache.tokens == 0
            import time

            expired = GenerationRequest(
                options=DecodingOptions(max_new_tokens=20),
                source_ids=source(2),
                deadline=time.monotonic() - 1,
            )
            return await collect(engine, expired)
        finally:
            engine.stop()

    events = run(go())
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, DeadlineExceeded)


def test_full_queue_is_refused_at_once(runner_and_config) -> None:
    async def go():
        engine = make_engine(runner_and_config, max_queue_size=1)  # not started: nothing drains
        first = engine.generate(GenerationRequest(options=DecodingOptions(), source_ids=source(0)))
        task = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhausted, match="max_queue_size"):
            await engine.generate(
                GenerationRequest(options=DecodingOptions(), source_ids=source(1))
            ).__anext__()
        task.cancel()

    run(go())


def test_a_backend_fault_fails_only_its_batch(runner_and_config) -> None:
    runner, config, kind = runner_and_config

    class Flaky:
        """Fails the first decoder call, then behaves."""

        def __init__(self, inner) -> None:
            self.inner, self.failed = inner, False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def run(self, graph, feeds):
            if graph == "decoder" and not self.failed:
                self.failed = True
                raise BackendError("decoder graph failed: injected fault")
            return self.inner.run(graph, feeds)

    class FlakyInPlace(InPlaceDecoder):
        """Fails the first in-place decoder step, then behaves."""

        failed = False

        @staticmethod
        def fail_once() -> None:
            if not FlakyInPlace.failed:
                FlakyInPlace.failed = True
                raise BackendError("decoder_inplace graph failed: injected fault")

        def step(self, *args):
            self.fail_once()
            return super().step(*args)

        def step_greedy(self, *args, **kwargs):  # greedy steps on a device come through here
            self.fail_once()
            return super().step_greedy(*args, **kwargs)

    flaky = Seq2SeqRunner(Flaky(runner.backend), config.decoder)
    rows = config.batching.max_active_sequences
    cache = inplace_cache(runner.backend, config, rows, FlakyInPlace) if kind == "inplace" else None

    async def go():
        engine = InFlightEngine(
            "translator", flaky, config.decoder, 20, config.batching, cache=cache
        )
        engine.start()
        try:
            first = await collect(
                engine,
                GenerationRequest(options=DecodingOptions(max_new_tokens=5), source_ids=source(4)),
            )
            second = await collect(
                engine,
                GenerationRequest(options=DecodingOptions(max_new_tokens=5), source_ids=source(4)),
            )
            for _ in range(100):  # the final event goes out just before the rows are dropped
                if engine.active_rows == 0:
                    break
                await asyncio.sleep(0.01)
            return first, second, engine.active_rows
        finally:
            engine.stop()

    first, second, rows = run(go())
    assert isinstance(first[-1], ErrorEvent) and isinstance(first[-1].error, Internal)
    assert "injected fault" in str(first[-1].error)
    assert isinstance(second[-1], FinishEvent) and rows == 0


def test_token_metrics_count_every_row_of_every_step(runner_and_config) -> None:
    """Requests decoding in flight together: one time to first token each, one time per output
    token for every later token (observed per step for the rows that share a last token time),
    and every token counted as generated."""
    from serving.metrics import ServingMetrics

    lengths = [12, 5, 9, 16, 3, 7]
    metrics = ServingMetrics()

    async def go() -> None:
        engine = make_engine(runner_and_config)
        engine.metrics = metrics
        engine.start()
        try:
            jobs = [
                collect(
                    engine,
                    GenerationRequest(
                        options=DecodingOptions(max_new_tokens=n, min_new_tokens=n),
                        source_ids=source(i),
                    ),
                    delay=0.002 * i,
                )
                for i, n in enumerate(lengths)
            ]
            await asyncio.gather(*jobs)
        finally:
            engine.stop()

    run(go())
    text = metrics.render().decode()

    def value(name: str) -> float:
        return next(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name and s.labels.get("model") == "translator"
        )

    assert value("attnserve_time_to_first_token_seconds_count") == len(lengths)
    assert value("attnserve_time_per_output_token_seconds_count") == sum(lengths) - len(lengths)
    assert value("attnserve_time_per_output_token_seconds_sum") > 0
    assert value("attnserve_generated_tokens_total") == sum(lengths)


def test_queue_time_ends_where_the_encoder_pass_starts(runner_and_config) -> None:
    """A lone request's wait is not its encoder pass (made 0.2 s slow here): the queue time
    (metric and the finish event's ``queue_seconds``) stays short, the encoder's compute time
    per request holds the pass."""
    from serving.metrics import ServingMetrics

    runner = runner_and_config[0]
    encode = runner.encode

    def slow_encode(*args, **kwargs):  # the real encoder, after 0.2 s
        time.sleep(0.2)
        return encode(*args, **kwargs)

    runner.encode = slow_encode
    metrics = ServingMetrics()

    async def go() -> list:
        engine = make_engine(runner_and_config)
        engine.metrics = metrics
        engine.start()
        try:
            request = GenerationRequest(
                options=DecodingOptions(max_new_tokens=2), source_ids=source(1)
            )
            return await collect(engine, request)
        finally:
            engine.stop()

    try:
        events = run(go())
    finally:
        runner.encode = encode
    final = events[-1]
    assert isinstance(final, FinishEvent)
    assert final.queue_seconds < 0.1
    samples = {
        (s.name, s.labels.get("stage")): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.labels.get("model") == "translator"
    }
    assert samples[("attnserve_queue_duration_seconds_count", None)] == 1
    assert samples[("attnserve_queue_duration_seconds_sum", None)] < 0.1
    assert samples[("attnserve_request_compute_seconds_total", "generation")] >= 0.2


def test_cancelled_while_waiting(runner_and_config) -> None:
    async def go():
        engine = make_engine(runner_and_config)
        request = GenerationRequest(options=DecodingOptions(), source_ids=source(5))
        request.cancel()
        engine.start()
        try:
            return await collect(engine, request)
        finally:
            engine.stop()

    events = run(go())
    assert isinstance(events[-1], ErrorEvent) and isinstance(events[-1].error, Cancelled)
