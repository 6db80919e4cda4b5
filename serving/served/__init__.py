"""Served models: one type per model kind, what both gRPC services call (no protobuf here).

- ``ServedGenerator`` (seq2seq: translator, captioner): tokenizer, input checks, in-flight engine.
- ``ServedClassifier`` (the ViT): image checks, dynamic batcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contract.model_config import ClassifierConfig, ModelConfig
from serving.backends.base import Backend
from serving.metrics import ServingMetrics
from serving.served.classifier import LabelScore, ServedClassifier
from serving.served.generator import Generated, ServedGenerator, StreamDelta

ServedModel = ServedGenerator | ServedClassifier

__all__ = [
    "Generated",
    "LabelScore",
    "ServedClassifier",
    "ServedGenerator",
    "ServedModel",
    "StreamDelta",
    "serve",
]


def serve(
    config: ModelConfig,
    version_dir: Path,
    backend: Backend,
    metrics: ServingMetrics | None = None,
    more_backends: Sequence[Backend] = (),
) -> ServedModel:
    """The served model of a repository entry's kind (not started yet); ``more_backends``: the
    graphs of its further instances (``batching.instances``)."""
    if isinstance(config, ClassifierConfig):
        return ServedClassifier(config, version_dir, backend, metrics, more_backends=more_backends)
    return ServedGenerator(config, version_dir, backend, metrics, more_backends=more_backends)
