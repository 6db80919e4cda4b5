"""A served classifier (the ViT): image checks, the dynamic batcher, top-k labels.

Plain Python types in and out (no protobuf): both gRPC services call this.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract.graphs import CLASSIFIER, IMAGE_INPUT, LOGITS
from contract.model_config import ClassifierConfig
from serving import tracing
from serving.backends.base import Backend
from serving.batching.dynamic import DynamicBatcher
from serving.batching.handle import Batcher
from serving.errors import InvalidArgument
from serving.metrics import ServingMetrics
from serving.served.entry import ServedEntry
from serving.served.inputs import ImageSource

DEFAULT_TOP_K = 5


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a padded batch takes: powers of two below ``max_batch``, then it."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch)


def pads_batches(config: ClassifierConfig) -> bool:
    """``batching.batch_buckets`` resolved: "auto" pads on a GPU provider or TensorRT."""
    setting = config.batching.batch_buckets
    if setting != "auto":
        return setting == "on"
    providers = config.onnxruntime.execution_providers
    return config.backend == "tensorrt" or (
        bool(providers) and providers[0] != "CPUExecutionProvider"
    )


@dataclass
class LabelScore:
    label: str
    index: int
    score: float


class ServedClassifier(ServedEntry):
    """One loaded classifier entry: its image checks and dynamic batcher."""

    def __init__(
        self,
        config: ClassifierConfig,
        version_dir: Path,
        backend: Backend | None,
        metrics: ServingMetrics | None = None,
        *,
        batcher: Batcher[np.ndarray, np.ndarray] | None = None,
        more_backends: Sequence[Backend] = (),
    ) -> None:
        """Args: the entry's config.yaml, its version folder, the graph (None with ``batcher``),
        where the batcher records, a batcher that runs elsewhere (a frontend process's handle
        on the engine process), and the graphs of further instances (``batching.instances``:
        each concurrent batch takes a free one; instances of one thread share one)."""
        super().__init__(config, version_dir, backend)
        self.config = config
        self._free: queue.SimpleQueue[Backend] = queue.SimpleQueue()  # idle instances' graphs
        self._instances = [backend, *more_backends] if backend is not None else []
        for instance in self._instances:
            self._free.put(instance)
        # batch sizes a batch is padded up to (batching.batch_buckets); () = as it comes
        padded = pads_batches(config) and backend is not None
        self.buckets = batch_buckets(config.batching.max_batch_size) if padded else ()
        self.images = ImageSource(
            self.name, config.image, config.limits.max_image_bytes, self.float_dtype
        )
        self.batcher: Batcher[np.ndarray, np.ndarray] = batcher or DynamicBatcher(
            config.name,
            self._classify_batch,
            config.batching,
            metrics=metrics,
            stage="classifier",
            version=str(self.version),
        )

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.buckets:
            await asyncio.to_thread(self.warm_up)
        await self.batcher.start()

    def warm_up(self) -> None:
        """Run every bucket's batch size once on every instance (zero images), before any
        request: what a new input shape costs the provider the first time is paid at load."""
        size = self.config.image.size
        for instance in {id(i): i for i in self._instances}.values():  # shared ones once
            for rows in self.buckets:
                images: np.ndarray = np.zeros((rows, 3, size, size), self.float_dtype)
                instance.run(CLASSIFIER, {IMAGE_INPUT: images})

    async def stop(self, grace: float = 10.0) -> None:
        await self.batcher.stop(drain=True)

    @property
    def ready(self) -> bool:
        """The batcher runs (what readiness probes report)."""
        return self.batcher.running

    # --- classification -------------------------------------------------------------------------
    def image_pixels(self, data: bytes) -> np.ndarray:
        """Pixels (3, H, W) of an encoded image (see ``ImageSource.pixels``).

        Raises:
            InvalidArgument: empty or undecodable data.
            ResourceExhausted: the encoded image exceeds ``limits.max_image_bytes``.
        """
        return self.images.pixels(data)

    async def classify(
        self,
        pixels: np.ndarray,
        top_k: int,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> list[LabelScore]:
        """Top-k labels with probabilities for one image (3, H, W); 0 means 5. ``priority``: the
        client's (1 highest, 0 = the model's default level; see ``batching.priority_levels``).

        Raises:
            InvalidArgument: top_k < 0.
            ResourceExhausted / DeadlineExceeded / Unavailable: from the batcher.
        """
        if top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 means {DEFAULT_TOP_K}), got {top_k}")
        trace = tracing.current.get()
        times: list[float] | None = None if trace is None else []
        probabilities = await self.batcher.submit(
            pixels, timeout_s=timeout_s, priority=priority, times=times
        )
        if trace is not None and times:
            trace.span(*times)
        k = min(top_k or DEFAULT_TOP_K, len(probabilities))
        order = np.argsort(-probabilities, kind="stable")[:k]
        labels = self.config.labels
        return [
            LabelScore(labels[i] if i < len(labels) else str(i), int(i), float(probabilities[i]))
            for i in order
        ]

    def _classify_batch(self, items: list[np.ndarray]) -> list[np.ndarray]:
        count = len(items)
        # with buckets, zero images up to the bucket's size (their rows are dropped below)
        rows = next(b for b in self.buckets if b >= count) if self.buckets else count
        images = np.empty((rows, *items[0].shape), items[0].dtype)
        np.stack(items, out=images[:count])  # the one copy of the batch
        images[count:] = 0
        backend = self._free.get()  # the batcher runs at most one batch per instance
        try:
            logits = backend.run(CLASSIFIER, {IMAGE_INPUT: images})[LOGITS][:count]
        finally:
            self._free.put(backend)
        logits = logits.astype(np.float64)
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        return list((exp / exp.sum(-1, keepdims=True)).astype(np.float32))
