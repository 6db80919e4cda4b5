"""`attnserve eval KIND --repository REPOSITORY/NAME`: held-out metrics through ONNX Runtime.

Same data, metrics and JSON as the checkpoint evaluation in ``models.evaluate``, but every
forward pass runs the exported graphs (so fp16 / int8 variants can be compared with fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from models.data import digits, shapes
from models.data.images import pixel_values
from models.data.translation import generate_pairs
from models.evaluate import EVAL_SEED, text_metrics, translation_report
from models.tokenizer import SubwordTokenizer
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.model_config import (
    CLASSIFIER_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    ModelConfig,
    read_model_config,
    resolve_version,
)
from serving.seq2seq import Seq2SeqRunner

TASK_OF_KIND = {"translator": "translation", "captioner": "captioning", "vit": "classification"}


def evaluate_repository(
    kind: str, entry: str | Path, examples: int | None = None, version: int | None = None
) -> dict[str, Any]:
    """Evaluate an exported entry; returns the same keys as the checkpoint evaluation.

    Raises:
        ValueError: when the entry is of another task than ``kind``.
        SchemaError / BackendError: a broken entry (named).
    """
    entry = Path(entry)
    config = read_model_config(entry)
    if config.task != TASK_OF_KIND[kind]:
        raise ValueError(
            f"{entry} serves {config.task}, not {TASK_OF_KIND[kind]}; "
            f"use `attnserve eval` with the matching kind"
        )
    version_dir = resolve_version(entry, version)
    result: dict[str, Any] = {"precision": config.precision, "version": int(version_dir.name)}
    if kind == "vit":
        backend = OnnxRuntimeBackend(version_dir, {"model": CLASSIFIER_FILE}, config.onnxruntime)
        return {**result, **_classifier_metrics(backend, config)}
    backend = OnnxRuntimeBackend(
        version_dir, {"encoder": ENCODER_FILE, "decoder": DECODER_FILE}, config.onnxruntime
    )
    assert config.decoder is not None
    runner = Seq2SeqRunner(backend, config.decoder)
    tokenizer = SubwordTokenizer.load(version_dir)
    if kind == "translator":
        return {**result, **_translator_metrics(runner, tokenizer, config, examples or 1500)}
    return {**result, **_captioner_metrics(runner, tokenizer, config, examples or 1000)}


def _pad(ids: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    length = max(len(s) for s in ids)
    out = np.full((len(ids), length), pad, dtype=np.int64)
    mask = np.zeros((len(ids), length), dtype=np.int64)
    for row, seq in enumerate(ids):
        out[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return out, mask


def _translator_metrics(
    runner: Seq2SeqRunner,
    tokenizer: SubwordTokenizer,
    config: ModelConfig,
    examples: int,
    batch: int = 128,
) -> dict[str, Any]:
    assert config.decoder is not None
    pairs = generate_pairs(examples, seed=EVAL_SEED, split="test")
    hypotheses: list[str] = []
    for first in range(0, len(pairs), batch):
        chunk = pairs[first : first + batch]
        ids, mask = _pad(
            tokenizer.encode_batch([p.tagged_source() for p in chunk]), config.decoder.pad_id
        )
        encoded = runner.encode({"input_ids": ids, "attention_mask": mask})
        hypotheses += tokenizer.decode_batch(runner.greedy(encoded, config.limits.max_new_tokens))
    return translation_report(pairs, hypotheses)


def _captioner_metrics(
    runner: Seq2SeqRunner,
    tokenizer: SubwordTokenizer,
    config: ModelConfig,
    examples: int,
    batch: int = 128,
) -> dict[str, Any]:
    assert config.image is not None
    data = shapes.generate(examples, seed=EVAL_SEED, split="test")
    hypotheses: list[str] = []
    for first in range(0, len(data), batch):
        images = np.stack([image for image, _ in data[first : first + batch]])
        pixels = pixel_values(images, config.image.mean, config.image.std).astype(runner.kv_dtype)
        encoded = runner.encode({"pixel_values": pixels})
        hypotheses += tokenizer.decode_batch(runner.greedy(encoded, config.limits.max_new_tokens))
    scores = text_metrics(hypotheses, [text for _, text in data])
    return {"examples": len(data), "exact_match": scores["exact_match"], "bleu": scores["bleu"]}


def _classifier_metrics(backend: OnnxRuntimeBackend, config: ModelConfig) -> dict[str, Any]:
    assert config.image is not None
    images, labels = digits.load_digits_split("test")
    dtype = np.float16 if config.precision == "fp16" else np.float32
    pixels = pixel_values(images, config.image.mean, config.image.std).astype(dtype)
    logits = np.concatenate(
        [
            backend.run("model", {"pixel_values": chunk})["logits"]
            for chunk in np.split(pixels, range(256, len(pixels), 256))
        ]
    )
    accuracy = float((logits.argmax(-1) == labels).mean())
    return {"examples": len(labels), "accuracy": round(accuracy, 4)}
