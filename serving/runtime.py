"""Served models: what both gRPC services call, in plain Python types (no protobuf here).

A ``ServedModel`` bundles one repository entry's config, backend, tokenizer or labels, and its
scheduler: an ``InFlightEngine`` for seq2seq models, a ``DynamicBatcher`` for classifiers. Input
validation lives here, so both APIs reject bad input with the same status and message.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.data.images import ImageDecodeError, decode_image, pixel_values
from models.tokenizer import SubwordTokenizer
from serving.backends.base import Backend
from serving.batching.dynamic import DynamicBatcher
from serving.engine.inflight import (
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    InFlightEngine,
    TokenEvent,
)
from serving.errors import InvalidArgument, ResourceExhausted
from serving.generation.options import DecodingOptions
from serving.metrics import ServingMetrics
from serving.model_config import ModelConfig
from serving.seq2seq import Seq2SeqRunner


@dataclass
class Generated:
    """A finished generation, decoded."""

    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length
    score: float | None = None
    alternatives: list[tuple[str, list[int], float]] = field(default_factory=list)
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


@dataclass
class LabelScore:
    label: str
    index: int
    score: float


class IncrementalDetokenizer:
    """Text deltas of a growing token sequence, decoding only a short window each time.

    A token may end inside a character or word piece; its text is held back until a later token
    settles it (the prefix/read offsets of text-generation-inference's streaming decoder).
    """

    def __init__(self, tokenizer: SubwordTokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = 0  # tokens before this are already in the emitted text
        self.text = ""  # everything emitted

    def add(self, ids: list[int]) -> str:
        """Append ``ids``; the newly settled text."""
        self.tokens.extend(ids)
        prefix = self.tokenizer.decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.tokens[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd") or not full.startswith(prefix):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.tokens)
        delta = full[len(prefix) :]
        self.text += delta
        return delta

    def rest(self, final_text: str) -> str:
        """What the deltas so far lack of ``final_text`` (text held back at the end)."""
        return final_text[len(self.text) :] if final_text.startswith(self.text) else ""


class ServedModel:
    """One loaded repository entry and its scheduler."""

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        backend: Backend,
        metrics: ServingMetrics | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.version = int(version_dir.name)
        self.version_dir = version_dir
        self.backend = backend
        self.metrics = metrics
        manifest = version_dir / "manifest.json"
        self.manifest: dict[str, Any] = (
            json.loads(manifest.read_text()) if manifest.is_file() else {}
        )
        self.tokenizer: SubwordTokenizer | None = None
        self.engine: InFlightEngine | None = None
        self.batcher: DynamicBatcher[np.ndarray, np.ndarray] | None = None
        if config.kind == "seq2seq":
            assert config.decoder is not None
            self.tokenizer = SubwordTokenizer.load(version_dir)
            runner = Seq2SeqRunner(backend, config.decoder)
            self.engine = InFlightEngine(
                config.name,
                runner,
                config.decoder,
                config.limits.max_new_tokens,
                config.batching,
                metrics,
            )
        else:
            self.batcher = DynamicBatcher(
                config.name,
                self._classify_batch,
                config.batching,
                metrics=metrics,
                stage="classifier",
            )
        self.float_dtype = np.float16 if config.precision == "fp16" else np.float32

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.engine is not None:
            self.engine.start()
        if self.batcher is not None:
            await self.batcher.start()

    async def stop(self, grace: float = 10.0) -> None:
        if self.engine is not None:
            import asyncio

            await asyncio.to_thread(self.engine.stop, grace)
        if self.batcher is not None:
            await self.batcher.stop(drain=True)

    @property
    def ready(self) -> bool:
        """The model's scheduler is running (what readiness probes report)."""
        scheduler = self.engine if self.engine is not None else self.batcher
        return scheduler is not None and scheduler.running

    # --- input validation -----------------------------------------------------------------------
    @functools.cached_property
    def max_source_chars(self) -> int:
        """Texts longer than this cannot fit ``max_source_length`` tokens, so they are refused
        before tokenizing (megabytes of text would hold the event loop for seconds): no token
        covers more characters than the longest vocabulary entry, and NFC normalisation shortens
        a text at most about 3x (4x here, for margin)."""
        assert self.tokenizer is not None
        longest = max(
            (len(self.tokenizer.id_to_token(i)) for i in range(self.tokenizer.vocab_size)),
            default=1,
        )
        return 4 * max(1, longest) * self.config.limits.max_source_length

    def source_ids(self, text: str, language: str) -> np.ndarray:
        """Token ids of a tagged source text.

        Raises:
            InvalidArgument: empty text, unknown target language.
            ResourceExhausted: the text is longer than the model's source limit.
        """
        if self.config.task != "translation":
            raise InvalidArgument(f"model {self.name!r} does {self.config.task}, not translation")
        if not text or not text.strip():
            raise InvalidArgument("text is empty; send the text to translate")
        languages = self.config.languages
        if languages and language not in languages:
            raise InvalidArgument(
                f"target_language {language[:40]!r} is not supported by {self.name!r}; "
                f"choose one of: {', '.join(languages)}"
            )
        assert self.tokenizer is not None
        if len(text) > self.max_source_chars:  # surely too long: refuse without tokenizing
            raise ResourceExhausted(
                f"the text is {len(text)} characters long; model {self.name!r} accepts at most "
                f"{self.config.limits.max_source_length} source tokens: split it into shorter texts"
            )
        tagged = f"<2{language}> {text}" if languages else text
        ids = self.tokenizer.encode(tagged)
        limit = self.config.limits.max_source_length
        if len(ids) > limit:
            raise ResourceExhausted(
                f"the text is {len(ids)} tokens long; model {self.name!r} accepts at most "
                f"{limit} source tokens: split it into shorter texts"
            )
        return np.asarray(ids, dtype=np.int64)

    def image_pixels(self, data: bytes) -> np.ndarray:
        """Decoded, resized and normalised pixels (3, H, W) of an encoded image.

        Raises:
            InvalidArgument: empty or undecodable image data.
            ResourceExhausted: the encoded image exceeds ``limits.max_image_bytes``.
        """
        if self.config.image is None:
            raise InvalidArgument(f"model {self.name!r} takes text, not images")
        if not data:
            raise InvalidArgument("image is empty; send PNG or JPEG bytes")
        limit = self.config.limits.max_image_bytes
        if len(data) > limit:
            raise ResourceExhausted(
                f"the image is {len(data)} bytes; model {self.name!r} accepts at most {limit}"
            )
        try:
            image = decode_image(data, self.config.image.size)
        except ImageDecodeError as err:
            raise InvalidArgument(str(err)) from err
        return self.normalise(image)

    def normalise(self, image: np.ndarray) -> np.ndarray:
        """uint8 (H, W, 3) at the model's size -> (3, H, W) in the graph's float type."""
        assert self.config.image is not None
        pixels = pixel_values(image, self.config.image.mean, self.config.image.std)[0]
        return pixels.astype(self.float_dtype)

    def options(self, options: DecodingOptions) -> DecodingOptions:
        """Validate decoding options against this model's limits.

        Raises:
            InvalidArgument: a bad option.
            ResourceExhausted: more beams than the decode batch has rows (such a request could
                never be admitted: it would wait until its deadline).
        """
        if self.engine is None:
            raise InvalidArgument(f"model {self.name!r} does not generate text")
        checked = options.validate(self.config.limits.max_new_tokens)
        rows = self.engine.queue.limits.max_rows
        if checked.beam_size > rows:
            raise ResourceExhausted(
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
    ) -> GenerationRequest:
        """A generation request with its deadline (the model's default timeout when none)."""
        now = time.monotonic()
        default = self.config.batching.timeout_ms / 1000 or None  # 0 = no deadline (Triton)
        timeout = timeout_s if timeout_s is not None else default
        return GenerationRequest(
            options=self.options(options),
            source_ids=source_ids,
            pixels=pixels,
            deadline=None if timeout is None else now + timeout,
            arrival=now,
        )

    async def events(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """The engine's events for ``request``; an ErrorEvent is raised as its error."""
        assert self.engine is not None
        async for event in self.engine.generate(request):
            if isinstance(event, ErrorEvent):
                raise event.error
            yield event

    async def generate(self, request: GenerationRequest) -> Generated:
        """Run a request to the end and decode it."""
        first_token: float | None = None
        final: FinishEvent | None = None
        async for event in self.events(request):
            if isinstance(event, TokenEvent) and first_token is None:
                first_token = time.monotonic() - request.arrival
            elif isinstance(event, FinishEvent):
                final = event
        assert final is not None
        return self._generated(final, request, first_token)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta | Generated]:
        """Text deltas as tokens arrive, then the final ``Generated``.

        Tokens that arrived together (the caller fell behind the decode loop) go out as one
        delta, so a slow stream costs fewer messages instead of falling further behind.
        """
        assert self.engine is not None and self.tokenizer is not None
        text = IncrementalDetokenizer(self.tokenizer)
        first_token: float | None = None
        async for chunk in self.engine.generate_chunks(request):
            tokens = [e for e in chunk if isinstance(e, TokenEvent)]
            if tokens:
                if first_token is None:
                    first_token = time.monotonic() - request.arrival
                ids = [e.token_id for e in tokens]
                yield StreamDelta(text.add(ids), ids, tokens[0].index)
            final = chunk[-1]
            if isinstance(final, ErrorEvent):
                raise final.error
            if isinstance(final, FinishEvent):
                result = self._generated(final, request, first_token)
                if rest := text.rest(result.text):
                    yield StreamDelta(rest, [], len(final.tokens))
                yield result

    def _generated(
        self, final: FinishEvent, request: GenerationRequest, first_token: float | None
    ) -> Generated:
        assert self.tokenizer is not None
        return Generated(
            text=self.tokenizer.decode(final.tokens),
            token_ids=list(final.tokens),
            finish_reason=final.reason,
            score=final.score,
            alternatives=[
                (self.tokenizer.decode(ids), list(ids), score) for ids, score in final.alternatives
            ],
            input_tokens=final.input_tokens,
            queue_seconds=final.queue_seconds,
            total_seconds=time.monotonic() - request.arrival,
            first_token_seconds=first_token,
        )

    # --- classification -------------------------------------------------------------------------
    async def classify(
        self, pixels: np.ndarray, top_k: int, timeout_s: float | None = None
    ) -> list[LabelScore]:
        """Top-k labels with probabilities for one image (3, H, W).

        Raises:
            InvalidArgument: top_k < 0 or this model is not a classifier.
        """
        if self.batcher is None:
            raise InvalidArgument(
                f"model {self.name!r} does {self.config.task}, not classification"
            )
        if top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 means 5), got {top_k}")
        probabilities = await self.batcher.submit(pixels, timeout_s=timeout_s)
        k = min(top_k or 5, len(probabilities))
        order = np.argsort(-probabilities, kind="stable")[:k]
        labels = self.config.labels
        return [
            LabelScore(labels[i] if i < len(labels) else str(i), int(i), float(probabilities[i]))
            for i in order
        ]

    def _classify_batch(self, items: list[np.ndarray]) -> list[np.ndarray]:
        logits = self.backend.run("model", {"pixel_values": np.stack(items)})["logits"]
        logits = logits.astype(np.float64)
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        return list((exp / exp.sum(-1, keepdims=True)).astype(np.float32))
