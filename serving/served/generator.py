"""A served encoder-decoder model (translator, captioner): inputs, the in-flight engine, results.

Plain Python types in and out (no protobuf): both gRPC services call this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from contract.graphs import DECODER_INPLACE, INPLACE_GRAPH_FILES, OPTIONAL_INPLACE_GRAPH_FILES
from contract.model_config import (
    DynamicBatching,
    GeneratorConfig,
    level_timeout_ms,
    priority_level,
)
from contract.text import load_text_tokenizer
from serving import tracing
from serving.backends.base import Backend
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.onnxruntime_io import InPlaceDecoder
from serving.batching.dynamic import DynamicBatcher
from serving.batching.handle import Batcher
from serving.engine.gauges import GaugeBoard
from serving.engine.inflight import InFlightEngine
from serving.engine.inplace_cache import InPlaceKVCache
from serving.engine.pool import EnginePool
from serving.engine.requests import (
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from serving.engine.slots import power_of_two_buckets
from serving.errors import FailedPrecondition, InvalidArgument, TooLarge
from serving.generation.detokenizer import IncrementalDetokenizer
from serving.generation.options import DecodingOptions
from serving.generation.stop import StopMatcher
from serving.generation.top_tokens import NONE as NO_TOKENS
from serving.generation.top_tokens import TopTokens
from serving.metrics import ServingMetrics
from serving.scoring import ScoreItem, Scorer, ScoringGraphs
from serving.seq2seq import Seq2SeqRunner
from serving.served.entry import ServedEntry
from serving.served.inputs import BadWords, ImageSource, ScoreTarget, TargetPrefix, TextSource
from serving.served.scores import Scored, score_all

log = logging.getLogger(__name__)


@dataclass
class Alternative:
    """An output besides the best one: a beam search runner-up, or a further sample."""

    text: str
    token_ids: list[int]
    score: float
    finish_reason: str  # stop | length | stop_sequence
    token_log_probs: list[float] | None = None  # ``return_log_probs``: one per token id
    top_log_probs: list[TopTokens] | None = None  # ``top_log_probs``: one per token id

    @classmethod
    def of(cls, generated: Generated) -> Alternative:
        """A further sample's output as an alternative of the first."""
        return cls(
            generated.text,
            generated.token_ids,
            generated.score or 0.0,
            generated.finish_reason,
            generated.token_log_probs,
            generated.top_log_probs,
        )


@dataclass
class Generated:
    """A finished generation, decoded."""

    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length | stop_sequence
    score: float | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    token_log_probs: list[float] | None = None  # ``return_log_probs``: one per token id
    top_log_probs: list[TopTokens] | None = None  # ``top_log_probs``: one per token id
    input_tokens: int = 0
    queue_seconds: float = 0.0
    total_seconds: float = 0.0
    first_token_seconds: float | None = None


@dataclass
class StreamDelta:
    """A piece of streamed text: the new characters and the tokens that produced them."""

    delta: str
    token_ids: list[int]
    index: int
    log_probs: list[float] | None = None  # one per token id (``return_log_probs``)
    top: list[TopTokens] | None = None  # one per token id (``top_log_probs``)


def _alternatives(final: FinishEvent, decode: Callable[[list[int]], str]) -> list[Alternative]:
    """A beam search's runner-ups, decoded (with their tokens' log-probabilities where the
    request asked for them)."""
    scored: list[list[float] | None] = [None] * len(final.alternatives)
    if final.alternative_log_probs is not None:
        scored = list(final.alternative_log_probs)
    topped: list[list[TopTokens] | None] = [None] * len(final.alternatives)
    if final.alternative_top_log_probs is not None:
        topped = list(final.alternative_top_log_probs)
    return [
        Alternative(decode(ids), list(ids), score, "stop" if ended else "length", values, tops)
        for (ids, score, ended), values, tops in zip(
            final.alternatives, scored, topped, strict=True
        )
    ]


def _stopped(final: FinishEvent, kept: int) -> FinishEvent:
    """``final`` as a stop string ended it: its first ``kept`` tokens, reason "stop_sequence",
    and with log-probabilities their sum as the score (the engine may have chosen more before it
    heard of the stop, or ended the sequence by itself)."""
    log_probs = None if final.log_probs is None else final.log_probs[:kept]
    score = final.score if log_probs is None else float(sum(log_probs))
    tops = None if final.top_log_probs is None else final.top_log_probs[:kept]
    return replace(
        final,
        reason="stop_sequence",
        tokens=final.tokens[:kept],
        log_probs=log_probs,
        score=score,
        top_log_probs=tops,
    )


async def generate_all(
    run: Callable[[GenerationRequest], Awaitable[Generated]], jobs: list[GenerationRequest]
) -> list[Generated]:
    """``run`` (a generator's ``generate``) on every job concurrently; if one fails (or the call
    is cancelled), the others' work stops too. One job (the common one-text request) is awaited
    without a task: its own cancellation frees its rows (the engine's ``generate_chunks``)."""
    if len(jobs) == 1:
        return [await run(jobs[0])]
    tasks = [asyncio.ensure_future(run(job)) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task, job in zip(tasks, jobs, strict=True):
            task.cancel()
            job.cancel()
        raise


def samples(request: GenerationRequest) -> list[GenerationRequest]:
    """A sampled request's further samples (``options.num_alternatives`` of them): the same
    input, prefix, deadline and priority, the i-th with seed ``seed + i`` (mod 2**64; a fresh
    random one for a request without a seed), so that it gives what a request of that seed
    gives."""
    options = request.options
    seed = options.seed
    return [
        GenerationRequest(
            options=replace(
                options, num_alternatives=0, seed=None if seed is None else (seed + i) % 2**64
            ),
            source_ids=request.source_ids,
            pixels=request.pixels,
            deadline=request.deadline,
            arrival=request.arrival,
            priority=request.priority,
            prefix=request.prefix,
            bad_words=request.bad_words,
        )
        for i in range(1, options.num_alternatives + 1)
    ]


def inplace_cache(backend: Backend, config: GeneratorConfig) -> InPlaceKVCache | None:
    """The fixed-capacity cache written in place, when the backend loaded the in-place graphs.

    Rows: the decode batch's capacity; positions: the most tokens a sequence feeds the decoder
    (``limits.max_new_tokens``, bounded by the position table); source positions:
    ``limits.max_source_length``.
    """
    if not isinstance(backend, OnnxRuntimeBackend) or DECODER_INPLACE not in backend.graphs():
        return None
    limits, rows = config.limits, config.batching.decode_rows
    decoder = InPlaceDecoder(
        {graph: backend.session(graph) for graph in inplace_graphs(backend)},
        config.decoder,
        rows=rows,
        capacity=min(limits.max_new_tokens, config.decoder.max_positions - 1),
        source_capacity=limits.max_source_length,
    )
    if config.onnxruntime.captures_cuda_graphs and decoder.captured is None:
        log.warning(
            "%s: onnxruntime.cuda_graph applies to the in-place decoder on CUDA only; its "
            "session runs on %s, decoding without CUDA graphs",
            config.name,
            decoder.device.kind,
        )
    # CUDA graphs: one per step shape, so steps run at power-of-two batch sizes
    buckets = power_of_two_buckets(rows) if decoder.captured is not None else ()
    return InPlaceKVCache(decoder, config.decoder.pad_id, buckets)


def inplace_graphs(backend: OnnxRuntimeBackend) -> list[str]:
    """The in-place decoder's graphs the backend loaded: all of ``INPLACE_GRAPH_FILES``, and
    the optional ones the export wrote (``greedy_pick``)."""
    loaded = backend.graphs()
    return [*INPLACE_GRAPH_FILES, *(g for g in OPTIONAL_INPLACE_GRAPH_FILES if g in loaded)]


def local_engine(
    config: GeneratorConfig,
    backend: Backend,
    metrics: ServingMetrics | None,
    instance: int = 0,
    gauge_board: GaugeBoard | None = None,
    version: str = "",
) -> InFlightEngine:
    """The in-process engine over ``backend`` (in-place KV cache when the graphs allow);
    ``instance`` and ``gauge_board`` for one of several instances of the model."""
    cache = inplace_cache(backend, config)
    overlap = config.batching.overlap_steps
    if overlap and cache is None:
        log.warning(
            "%s: batching.overlap_steps needs the in-place KV cache (onnxruntime.kv_cache: "
            "inplace, an ONNX Runtime export with its graphs); steps run one after the other",
            config.name,
        )
    return InFlightEngine(
        config.name,
        Seq2SeqRunner(backend, config.decoder),
        config.decoder,
        config.limits.max_new_tokens,
        config.batching,
        metrics,
        cache=cache,
        instance=instance,
        gauge_board=gauge_board,
        overlap=overlap and cache is not None,
        block=_runs_blocks(cache, config),
        version=version,
    )


def _runs_blocks(cache: InPlaceKVCache | None, config: GeneratorConfig) -> bool:
    """Whether the engine decodes in blocks (``batching.decode_block``): where asked for and
    the cache has a block graph; warns where it was set true and the cache has none."""
    has = cache is not None and cache.block_steps > 0
    if config.batching.decode_block is True and not has:
        log.warning(
            "%s: batching.decode_block needs the in-place KV cache and a decoder_block graph "
            "(attnserve export --decode-block K); decoding one step per run",
            config.name,
        )
    return has and config.decodes_in_blocks


def local_engines(
    config: GeneratorConfig,
    backends: Sequence[Backend],
    metrics: ServingMetrics | None,
    version: str = "",
) -> InFlightEngine | EnginePool:
    """One engine per backend: the engine itself for one, else a pool summing their gauges
    (``version``: the model's, a metrics label)."""
    if len(backends) == 1:
        return local_engine(config, backends[0], metrics, version=version)
    board = GaugeBoard(len(backends))
    return EnginePool(
        [local_engine(config, b, metrics, i, board, version) for i, b in enumerate(backends)]
    )


def scoring_batching(config: GeneratorConfig) -> DynamicBatching:
    """The dynamic batching of a generator's ``Score`` pairs: up to ``limits.max_batch_size``
    pairs a pass, whatever is queued when a pass starts (no delay), with the queue limits,
    deadlines and priority levels of its generations."""
    b = config.batching
    return DynamicBatching(
        max_batch_size=config.limits.max_batch_size,
        max_queue_size=b.max_queue_size,
        timeout_ms=b.timeout_ms,
        priority_levels=b.priority_levels,
        default_priority_level=b.default_priority_level,
        priority_queue_policy=b.priority_queue_policy,
    )


def local_scorer(
    config: GeneratorConfig, version_dir: Path, backend: Backend, metrics: ServingMetrics | None
) -> DynamicBatcher[ScoreItem, np.ndarray]:
    """The in-process batcher of ``Score`` pairs over the model's first backend."""
    scorer = Scorer(ScoringGraphs(backend, version_dir, config.onnxruntime), config.decoder)
    return DynamicBatcher(
        config.name,
        scorer.score_batch,
        scoring_batching(config),
        metrics=metrics,
        stage="scoring",
        version=version_dir.name,
        reports_depth=False,  # attnserve_queue_depth is the engine's waiting generations
    )


class GenerationEngine(Protocol):
    """What a served generator needs from its engine: the in-process ``InFlightEngine``, or a
    frontend's handle on the engine process (``serving.multiprocess.remote.RemoteEngine``)."""

    @property
    def running(self) -> bool: ...

    @property
    def max_rows(self) -> int: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Event]: ...

    def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[Event]]: ...


class ServedGenerator(ServedEntry):
    """One loaded seq2seq entry: its tokenizer, input checks and in-flight engine.

    Args:
        config: the entry's config.yaml.
        version_dir: REPOSITORY/NAME/VERSION.
        backend: the graphs; the engine is built on them (None with ``engine``).
        metrics: where the engine records.
        engine: an engine that runs elsewhere (a frontend process's handle on the engine).
        more_backends: the graphs of further engine instances (``batching.instances``).
        scorer: with ``engine``: the batcher of ``Score`` pairs that runs beside it.
    """

    def __init__(
        self,
        config: GeneratorConfig,
        version_dir: Path,
        backend: Backend | None,
        metrics: ServingMetrics | None = None,
        *,
        engine: GenerationEngine | None = None,
        more_backends: Sequence[Backend] = (),
        scorer: Batcher[ScoreItem, np.ndarray] | None = None,
    ) -> None:
        super().__init__(config, version_dir, backend)
        self.config = config
        self.tokenizer = load_text_tokenizer(version_dir, config.tokenizer)
        limits = config.limits
        self.text = (
            TextSource(
                self.name,
                self.tokenizer,
                config.languages,
                limits.max_source_length,
                config.tokenizer,
            )
            if config.input == "text"
            else None
        )
        # the position table bounds an output too (a config may raise max_new_tokens above it)
        longest = min(limits.max_new_tokens, config.decoder.max_positions - 1)
        self.prefixes = TargetPrefix(self.name, self.tokenizer, longest)
        self.targets = ScoreTarget(self.name, self.tokenizer, longest)
        self.bad_words = BadWords(self.name, self.tokenizer)
        self.images = (
            ImageSource(self.name, config.image, limits.max_image_bytes, self.float_dtype)
            if config.image is not None and config.input == "image"
            else None
        )
        if engine is None:
            if backend is None:
                raise ValueError(f"model {config.name!r}: a local engine needs the backend")
            engine = local_engines(config, [backend, *more_backends], metrics, str(self.version))
            scorer = local_scorer(config, version_dir, backend, metrics)
        self.engine: GenerationEngine = engine
        self.scorer = scorer
        first = engine.engines[0] if isinstance(engine, EnginePool) else engine
        local = isinstance(first, InFlightEngine)
        inplace = local and isinstance(first.cache, InPlaceKVCache)  # type: ignore[attr-defined]
        self.kv_cache = ("inplace" if inplace else "growing") if local else "remote"

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.engine.start()
        if self.scorer is not None:
            await self.scorer.start()

    async def stop(self, grace: float = 10.0) -> None:
        if self.scorer is not None:
            await self.scorer.stop(drain=True)
        await asyncio.to_thread(self.engine.stop, grace)

    @property
    def ready(self) -> bool:
        """The decode loop runs (what readiness probes report)."""
        return self.engine.running

    # --- inputs ---------------------------------------------------------------------------------
    def source_ids(self, text: str, language: str) -> np.ndarray:
        """Token ids of a tagged source text (see ``TextSource.ids``).

        Raises:
            InvalidArgument: not a text model, empty text, unknown target language.
            TooLarge: the text is longer than the model's source limit.
        """
        if self.text is None:
            raise InvalidArgument(f"model {self.name!r} does {self.config.task}, not translation")
        return self.text.ids(text, language)

    def image_pixels(self, data: bytes) -> np.ndarray:
        """Pixels (3, H, W) of an encoded image (see ``ImageSource.pixels``).

        Raises:
            InvalidArgument: not an image model; empty or undecodable data.
            TooLarge: the encoded image exceeds ``limits.max_image_bytes``.
        """
        if self.images is None:
            raise InvalidArgument(f"model {self.name!r} takes text, not images")
        return self.images.pixels(data)

    def prefix_ids(self, text: str) -> tuple[int, ...]:
        """The token ids of a target prefix (``TargetPrefix.ids``); () for none."""
        return self.prefixes.ids(text)

    # --- scoring --------------------------------------------------------------------------------
    def target_ids(self, text: str) -> np.ndarray:
        """The token ids (int64) of a target to score (``ScoreTarget.ids``); none for ""."""
        return np.asarray(self.targets.ids(text), dtype=np.int64)

    async def score(
        self, items: Sequence[ScoreItem], timeout_s: float | None = None, priority: int = 0
    ) -> list[Scored]:
        """Each pair's target token log-probabilities and EOS's (``serving.scoring``), its pairs
        batched with other calls' (``priority``, ``timeout_s``: as a generation's).

        Raises:
            FailedPrecondition: a model served by TensorRT (its engines decode one position).
            ResourceExhausted / DeadlineExceeded / Unavailable: from the scoring batcher.
        """
        if self.scorer is None:  # an engine elsewhere, given no scorer beside it
            raise FailedPrecondition(f"model {self.name!r} has no scorer in this process")
        if self.config.backend != "onnxruntime":
            raise FailedPrecondition(
                f"model {self.name!r} is served by {self.config.backend}; scoring runs on "
                "ONNX Runtime: serve an ONNX Runtime export of it to score"
            )
        return await score_all(self.scorer, items, timeout_s, priority)

    def options(self, options: DecodingOptions, prefix_tokens: int = 0) -> DecodingOptions:
        """Validate decoding options against this model's limits (and the tokens of the
        request's target prefix, which count toward ``limits.max_new_tokens``).

        Raises:
            InvalidArgument: a bad option.
            TooLarge: more beams than the decode batch has rows (such a request could
                never be admitted: it would wait until its deadline).
        """
        checked = options.validate(self.config.limits.max_new_tokens, prefix_tokens)
        rows = self.engine.max_rows
        if checked.beam_size > rows:
            raise TooLarge(
                f"beam_size {checked.beam_size} needs {checked.beam_size} decode rows; model "
                f"{self.name!r} runs at most {rows} (batching.max_active_sequences): ask for "
                f"beam_size 1..{rows}"
            )
        return checked

    # --- generation -----------------------------------------------------------------------------
    def request(
        self,
        options: DecodingOptions,
        *,
        source_ids: np.ndarray | None = None,
        pixels: np.ndarray | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
        prefix: tuple[int, ...] = (),
    ) -> GenerationRequest:
        """A generation request with its deadline (the model's default timeout when none), its
        queue level (``priority``: the client's, 1 highest, 0 = the model's default; see
        ``batching.priority_levels``), its target prefix (``prefix_ids``) and its bad words'
        tokens (``BadWords``)."""
        now = time.monotonic()
        level = priority_level(priority, self.config.batching)
        # the level's default deadline; 0 = none (Triton)
        default = level_timeout_ms(level, self.config.batching) / 1000 or None
        timeout = timeout_s if timeout_s is not None else default
        checked = self.options(options, len(prefix))
        return GenerationRequest(
            options=checked,
            source_ids=source_ids,
            pixels=pixels,
            deadline=None if timeout is None else now + timeout,
            arrival=now,
            priority=level,
            prefix=prefix,
            bad_words=self.bad_words.ids(checked.bad_words),
        )

    async def events(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """The engine's events for ``request``; an ErrorEvent is raised as its error."""
        async for event in self.engine.generate(request):
            if isinstance(event, ErrorEvent):
                raise event.error
            yield event

    async def generate(self, request: GenerationRequest) -> Generated:
        """Run a request to the end and decode it; a sampled request with ``num_alternatives``
        also runs that many further samples of it (``samples``) and returns them as its
        alternatives."""
        if request.options.sampling and request.options.num_alternatives:
            return await self._with_samples(request)
        return await self._generate(request)

    async def _with_samples(self, request: GenerationRequest) -> Generated:
        """The request and its further samples decoded side by side (they share decode steps);
        one failing, or the call cancelled, stops all of them."""
        first, *more = await generate_all(self._generate, [request, *samples(request)])
        first.alternatives = [Alternative.of(r) for r in more]
        return first

    async def _generate(self, request: GenerationRequest) -> Generated:
        first_token: float | None = None
        final: FinishEvent | None = None
        stop = self._stop_matcher(request)
        async for event in self.events(request):
            if isinstance(event, TokenEvent):
                if first_token is None:
                    first_token = time.monotonic() - request.arrival
                if stop is not None and not stop.stopped:
                    stop.add((event.token_id,))
                    if stop.kept is not None:  # a stop string: the engine ends it there
                        request.finish_at(stop.kept)
            elif isinstance(event, FinishEvent):
                final = event
        assert final is not None  # the engine always ends a request with Finish or Error
        return self._generated(final, request, first_token, stop)

    def _stop_matcher(self, request: GenerationRequest) -> StopMatcher | None:
        """The request's stop strings' matcher; None without any."""
        if not request.options.stop:
            return None
        return StopMatcher(self.tokenizer, request.options.stop, len(request.prefix))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta | Generated]:
        """Text deltas as tokens arrive, then the final ``Generated``.

        Tokens that arrived together (the caller fell behind the decode loop) go out as one
        delta, so a slow stream costs fewer messages instead of falling further behind.
        """
        text = IncrementalDetokenizer(self.tokenizer)
        stop = self._stop_matcher(request)
        first_token: float | None = None
        async for chunk in self.engine.generate_chunks(request):
            tokens = [e for e in chunk if isinstance(e, TokenEvent)]
            if stop is not None:  # none past a stop string; text that may be one held back
                tokens = tokens[: stop.add([e.token_id for e in tokens])]
            if tokens:
                if first_token is None:
                    first_token = time.monotonic() - request.arrival
                ids = [e.token_id for e in tokens]
                log_probs = tops = None
                if request.options.return_log_probs:
                    log_probs = [e.log_prob or 0.0 for e in tokens]
                if request.options.top_log_probs:
                    tops = [e.top or NO_TOKENS for e in tokens]
                delta = text.add(ids) if stop is None else stop.release()
                if stop is not None and stop.kept is not None:
                    request.finish_at(stop.kept)  # the engine ends it there, while this is sent
                yield StreamDelta(delta, ids, tokens[0].index, log_probs, tops)
            final = chunk[-1]
            if isinstance(final, ErrorEvent):
                raise final.error
            if isinstance(final, FinishEvent):
                result = self._generated(final, request, first_token, stop)
                rest = text.rest(result.text) if stop is None else stop.rest(result.text)
                if rest:
                    yield StreamDelta(rest, [], len(result.token_ids))
                yield result

    def _generated(
        self,
        final: FinishEvent,
        request: GenerationRequest,
        first_token: float | None,
        stop: StopMatcher | None = None,
    ) -> Generated:
        if (trace := tracing.current.get()) is not None:
            queued = request.arrival
            started = queued + final.queue_seconds
            trace.span(queued, started, started + final.compute_seconds)
        decode = self.tokenizer.decode
        if stop is not None and stop.kept is not None:
            final = _stopped(final, stop.kept)
        text = decode(final.tokens)
        return Generated(
            text=text if stop is None else stop.final_text(text),
            token_ids=list(final.tokens),
            finish_reason=final.reason,
            score=final.score,
            alternatives=_alternatives(final, decode),
            token_log_probs=final.log_probs,
            top_log_probs=final.top_log_probs,
            input_tokens=final.input_tokens,
            queue_seconds=final.queue_seconds,
            total_seconds=time.monotonic() - request.arrival,
            first_token_seconds=first_token,
        )
