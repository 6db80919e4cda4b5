"""A served classifier (the ViT): image checks, the dynamic batcher, top-k labels.

Plain Python types in and out (no protobuf): both gRPC services call this.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from contract.graphs import CLASSIFIER, IMAGE_INPUT, LOGITS
from contract.model_config import ClassifierConfig
from serving.backends.base import Backend
from serving.batching.dynamic import DynamicBatcher
from serving.errors import InvalidArgument
from serving.metrics import ServingMetrics
from serving.served.entry import ServedEntry
from serving.served.inputs import ImageSource

DEFAULT_TOP_K = 5


class Batcher(Protocol):
    """What a served classifier needs from its batcher: the in-process ``DynamicBatcher`` or a
    frontend's handle on the engine process (``serving.multiprocess.remote.RemoteBatcher``)."""

    @property
    def running(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True) -> None: ...

    async def submit(self, item: np.ndarray, *, timeout_s: float | None = None) -> np.ndarray: ...


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
        batcher: Batcher | None = None,
        more_backends: Sequence[Backend] = (),
    ) -> None:
        """Args: the entry's config.yaml, its version folder, the graph (None with ``batcher``),
        where the batcher records, a batcher that runs elsewhere (a frontend process's handle
        on the engine process), and the graphs of further instances (``batching.instances``:
        each concurrent batch takes a free one; instances of one thread share one)."""
        super().__init__(config, version_dir, backend)
        self.config = config
        self._free: queue.SimpleQueue[Backend] = queue.SimpleQueue()  # idle instances' graphs
        for instance in (backend, *more_backends) if backend is not None else ():
            self._free.put(instance)
        self.images = ImageSource(
            self.name, config.image, config.limits.max_image_bytes, self.float_dtype
        )
        self.batcher: Batcher = batcher or DynamicBatcher(
            config.name, self._classify_batch, config.batching, metrics=metrics, stage="classifier"
        )

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.batcher.start()

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
        self, pixels: np.ndarray, top_k: int, timeout_s: float | None = None
    ) -> list[LabelScore]:
        """Top-k labels with probabilities for one image (3, H, W); 0 means 5.

        Raises:
            InvalidArgument: top_k < 0.
            ResourceExhausted / DeadlineExceeded / Unavailable: from the batcher.
        """
        if top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 means {DEFAULT_TOP_K}), got {top_k}")
        probabilities = await self.batcher.submit(pixels, timeout_s=timeout_s)
        k = min(top_k or DEFAULT_TOP_K, len(probabilities))
        order = np.argsort(-probabilities, kind="stable")[:k]
        labels = self.config.labels
        return [
            LabelScore(labels[i] if i < len(labels) else str(i), int(i), float(probabilities[i]))
            for i in order
        ]

    def _classify_batch(self, items: list[np.ndarray]) -> list[np.ndarray]:
        backend = self._free.get()  # the batcher runs at most one batch per instance
        try:
            logits = backend.run(CLASSIFIER, {IMAGE_INPUT: np.stack(items)})[LOGITS]
        finally:
            self._free.put(backend)
        logits = logits.astype(np.float64)
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        return list((exp / exp.sum(-1, keepdims=True)).astype(np.float32))
