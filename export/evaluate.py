"""`attnserve eval KIND --repository REPOSITORY/NAME`: held-out metrics through ONNX Runtime.

Same data, metrics and JSON as the checkpoint evaluation in ``models.evaluate``, but every
forward pass runs the exported graphs (so fp16 / int8 variants can be compared with fp32).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from contract.images import pixel_values
from contract.model_config import ClassifierConfig, GeneratorConfig
from contract.repository import read_model_config, resolve_version
from contract.tokenizer import SubwordTokenizer
from export.serving_runner import (
    Backend,
    Encoded,
    Seq2SeqRunner,
    decode_caches,
    greedy,
    held_out_source_capacity,
    make_backend,
    padded_sources,
)
from models.data import digits, shapes
from models.data.translation import generate_pairs
from models.evaluate import EVAL_SEED, text_metrics, translation_report

EVAL_BATCH = 128  # held-out examples decoded together
Decode = Callable[[Encoded], list[list[int]]]  # greedy tokens of an encoded batch
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
    backend = make_backend(config, version_dir)  # the graphs the server would use
    if isinstance(config, ClassifierConfig):
        return {**result, **_classifier_metrics(backend, config)}
    runner = Seq2SeqRunner(backend, config.decoder)
    sources = held_out_source_capacity(config)
    caches = decode_caches(backend, config, rows=EVAL_BATCH, source_capacity=sources)
    result["kv_cache"] = "inplace" if "inplace" in caches else "growing"
    cache = caches[result["kv_cache"]]
    decoder = getattr(cache, "decoder", None)  # the in-place cache's buffers: float or int8
    result["kv_dtype"] = str(np.dtype(decoder.kv_dtype if decoder else runner.kv_dtype))

    def decode(encoded: Encoded) -> list[list[int]]:
        return greedy(cache, encoded, config.decoder, config.limits.max_new_tokens)

    tokenizer = SubwordTokenizer.load(version_dir)
    if kind == "translator":
        return {**result, **_translator_metrics(runner, decode, tokenizer, examples or 1500)}
    return {**result, **_captioner_metrics(runner, decode, tokenizer, config, examples or 1000)}


def _translator_metrics(
    runner: Seq2SeqRunner,
    decode: Decode,
    tokenizer: SubwordTokenizer,
    examples: int,
    batch: int = EVAL_BATCH,
) -> dict[str, Any]:
    pairs = generate_pairs(examples, seed=EVAL_SEED, split="test")
    hypotheses: list[str] = []
    for first in range(0, len(pairs), batch):
        chunk = pairs[first : first + batch]
        sources = tokenizer.encode_batch([p.tagged_source() for p in chunk])
        ids, mask = padded_sources([np.asarray(s) for s in sources], runner.spec.pad_id)
        encoded = runner.encode({"input_ids": ids, "attention_mask": mask})
        hypotheses += tokenizer.decode_batch(decode(encoded))
    return translation_report(pairs, hypotheses)


def _captioner_metrics(
    runner: Seq2SeqRunner,
    decode: Decode,
    tokenizer: SubwordTokenizer,
    config: GeneratorConfig,
    examples: int,
    batch: int = EVAL_BATCH,
) -> dict[str, Any]:
    assert config.image is not None  # GeneratorConfig requires it for image input
    data = shapes.generate(examples, seed=EVAL_SEED, split="test")
    hypotheses: list[str] = []
    for first in range(0, len(data), batch):
        images = np.stack([image for image, _ in data[first : first + batch]])
        pixels = pixel_values(images, config.image.mean, config.image.std).astype(runner.kv_dtype)
        encoded = runner.encode({"pixel_values": pixels})
        hypotheses += tokenizer.decode_batch(decode(encoded))
    scores = text_metrics(hypotheses, [text for _, text in data])
    return {"examples": len(data), "exact_match": scores["exact_match"], "bleu": scores["bleu"]}


def _classifier_metrics(backend: Backend, config: ClassifierConfig) -> dict[str, Any]:
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
