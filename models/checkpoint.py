"""Checkpoint directories: safetensors weights, config JSON, tokenizer, training metrics.

Layout of a checkpoint directory:
    model.safetensors   weights (never pickle)
    config.json         the model config, with "kind": translator | vit | captioner
    tokenizer.json      subword tokenizer (translator, captioner)
    metrics.json        training and held-out metrics
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from contract.tokenizer import SubwordTokenizer, TokenizerError
from models.captioner import Captioner, CaptionerConfig
from models.config import (
    MODEL_KINDS,
    ConfigError,
    config_from_dict,
    config_to_dict,
    read_config_json,
)
from models.translator import Translator, TranslatorConfig
from models.vit import ViT, ViTConfig

# Shipped checkpoints store fp16 weights (half the size; the repository budget is 30 MB). Models
# compute in fp32: weights are cast on load, and trainers evaluate the rounded weights.
STORAGE_DTYPE = torch.float16
WEIGHTS_FILE = "model.safetensors"
METRICS_FILE = "metrics.json"
SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"

_CONFIGS: dict[str, type] = {
    "translator": TranslatorConfig,
    "vit": ViTConfig,
    "captioner": CaptionerConfig,
}
_MODELS: dict[str, type[nn.Module]] = {
    "translator": Translator,
    "vit": ViT,
    "captioner": Captioner,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says what is wrong and what to do."""


def check_kind(kind: str) -> str:
    """Return ``kind`` if it is a known model kind.

    Raises:
        CheckpointError: naming the supported kinds.
    """
    if kind not in MODEL_KINDS:
        raise CheckpointError(f"unknown model kind {kind!r}; supported: {', '.join(MODEL_KINDS)}")
    return kind


def build_model(kind: str, config: Any) -> nn.Module:
    """A freshly initialised model of ``kind`` for ``config``."""
    return _MODELS[check_kind(kind)](config)


def shipped_checkpoint(kind: str) -> Path:
    """The directory of the checkpoint shipped in the repository for ``kind``."""
    return SHIPPED_DIR / check_kind(kind)


@dataclass
class Checkpoint:
    """A loaded checkpoint."""

    kind: str
    model: nn.Module
    config: Any
    tokenizer: SubwordTokenizer | None
    metrics: dict[str, Any]
    directory: Path


def round_to_storage(model: nn.Module) -> nn.Module:
    """Round the weights in place to what the checkpoint stores (evaluate what ships)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(STORAGE_DTYPE).to(tensor.dtype))
    return model


def save_checkpoint(
    directory: str | Path,
    kind: str,
    model: nn.Module,
    tokenizer: SubwordTokenizer | None = None,
    metrics: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory (created if needed) and return its path.

    Weights are stored as fp16 (``STORAGE_DTYPE``); loading casts them back to fp32.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(copy.deepcopy(model).to(STORAGE_DTYPE), str(directory / WEIGHTS_FILE))
    config = config_to_dict(model.config, check_kind(kind))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(directory)
    if metrics is not None:
        (directory / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    return directory


def load_config(directory: str | Path, expected_kind: str | None = None) -> tuple[str, Any]:
    """Read and validate DIR/config.json; return (kind, config).

    Raises:
        CheckpointError: missing directory, wrong or unknown kind, corrupt config.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(
            f"checkpoint directory {directory} does not exist; pass a directory written by "
            "`attnserve train`, or omit --checkpoint to use the shipped one"
        )
    try:
        data = read_config_json(directory)
        kind = data.get("kind")
        if not isinstance(kind, str):
            raise ConfigError(f'{directory}/config.json has no "kind" field')
        check_kind(kind)
        if expected_kind is not None and kind != expected_kind:
            raise CheckpointError(
                f"{directory} holds a {kind} checkpoint, not a {expected_kind}; "
                f"use `attnserve eval {kind}` or point at a {expected_kind} checkpoint"
            )
        return kind, config_from_dict(_CONFIGS[kind], data, source=f"{directory}/config.json")
    except ConfigError as err:
        raise CheckpointError(str(err)) from err


def load_checkpoint(directory: str | Path, expected_kind: str | None = None) -> Checkpoint:
    """Load a checkpoint directory written by ``save_checkpoint``.

    Raises:
        CheckpointError: with a message that names the missing or corrupt file.
    """
    directory = Path(directory)
    kind, config = load_config(directory, expected_kind)
    model = build_model(kind, config)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {directory}; re-run `attnserve train {kind}`")
    try:
        load_model(model, str(weights), strict=True)
    except (SafetensorError, RuntimeError, OSError) as err:
        raise CheckpointError(
            f"{weights} does not match config.json ({str(err).splitlines()[0]}); "
            "the weights and config come from different runs"
        ) from err
    model.eval()
    tokenizer = None
    if kind != "vit":
        try:
            tokenizer = SubwordTokenizer.load(directory)
        except TokenizerError as err:
            raise CheckpointError(str(err)) from err
    metrics_path = directory / METRICS_FILE
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    return Checkpoint(kind, model, config, tokenizer, metrics, directory)
