"""The model-repository entry: config.yaml, version folder, tokenizer / labels, manifest.json."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

from export.errors import DestinationError
from export.sources import LoadedSource
from serving.model_config import (
    MODEL_NAME_RULE,
    Batching,
    DecoderSpec,
    ImageSpec,
    Limits,
    ModelConfig,
    OnnxRuntimeOptions,
    is_valid_model_name,
    write_model_config,
)

TASKS = {"translator": "translation", "captioner": "captioning", "vit": "classification"}


def prepare_version_dir(repository: Path, name: str, version: int, force: bool) -> Path:
    """Create REPOSITORY/NAME/VERSION (empty), refusing to overwrite without ``force``.

    Raises:
        DestinationError: the version exists without --force, or the place is not writable.
    """
    if version < 1:
        raise DestinationError(f"--version must be >= 1, got {version}")
    if not is_valid_model_name(name):
        raise DestinationError(f"model name {name[:100]!r} is not valid: use {MODEL_NAME_RULE}")
    version_dir = repository / name / str(version)
    if version_dir.exists():
        if not force:
            raise DestinationError(
                f"{version_dir} already exists; pass --force to overwrite it or choose "
                "another --version"
            )
        shutil.rmtree(version_dir)
    try:
        version_dir.mkdir(parents=True)
    except OSError as err:
        raise DestinationError(f"cannot create {version_dir}: {err.strerror}") from err
    if not os.access(version_dir, os.W_OK):
        raise DestinationError(f"{version_dir} is not writable")
    return version_dir


def model_config_for(
    source: LoadedSource, name: str, precision: str, batching: Batching | None = None
) -> ModelConfig:
    """The config.yaml for an exported model: kind, limits, batching, decoder facts."""
    config = source.model.config
    kind = source.kind
    batching = batching or Batching()
    if kind == "vit":
        return ModelConfig(
            name=name,
            kind="classifier",
            task="classification",
            input="image",
            precision=precision,  # type: ignore[arg-type]
            limits=Limits(
                max_batch_size=batching.max_batch_size, max_source_length=1, max_new_tokens=1
            ),
            batching=Batching(**{**_fields(batching), "in_flight": False}),
            image=ImageSpec(config.image_size, tuple(config.image_mean), tuple(config.image_std)),
            labels=tuple(config.labels) or tuple(str(i) for i in range(config.num_classes)),
            onnxruntime=OnnxRuntimeOptions(),
        )
    decoder = DecoderSpec(
        num_layers=config.decoder_layers,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        pad_id=config.pad_id,
        eos_id=config.eos_id,
        decoder_start_id=config.decoder_start_id,
        max_positions=config.max_positions,
    )
    if kind == "translator":
        languages = tuple((source.extra or {}).get("languages", ())) or _languages(source)
        return ModelConfig(
            name=name,
            kind="seq2seq",
            task="translation",
            input="text",
            precision=precision,  # type: ignore[arg-type]
            limits=Limits(
                max_batch_size=batching.max_active_sequences,
                max_source_length=min(config.max_source_length, config.max_positions),
                max_new_tokens=min(config.max_target_length, config.max_positions - 1),
            ),
            batching=batching,
            decoder=decoder,
            languages=languages,
        )
    return ModelConfig(
        name=name,
        kind="seq2seq",
        task="captioning",
        input="image",
        precision=precision,  # type: ignore[arg-type]
        limits=Limits(
            max_batch_size=batching.max_active_sequences,
            max_source_length=config.num_patches + 1,
            max_new_tokens=min(config.max_target_length, config.max_positions - 1),
        ),
        batching=batching,
        decoder=decoder,
        image=ImageSpec(config.image_size, tuple(config.image_mean), tuple(config.image_std)),
    )


def _languages(source: LoadedSource) -> tuple[str, ...]:
    """Target languages from the tokenizer's "<2xx>" tags."""
    tokenizer = source.tokenizer
    if tokenizer is None:
        return ()
    tags = (tokenizer.id_to_token(i) for i in sorted(tokenizer.special_ids))
    return tuple(t[2:-1] for t in tags if t.startswith("<2") and t.endswith(">"))


def _fields(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def write_entry_files(
    source: LoadedSource, entry: Path, version_dir: Path, config: ModelConfig
) -> list[str]:
    """config.yaml (entry level) and tokenizer / labels (version level); returns file names."""
    write_model_config(config, entry)
    written = []
    if source.tokenizer is not None:
        written.append(source.tokenizer.save(version_dir).name)
    if config.labels:
        (version_dir / "labels.txt").write_text("\n".join(config.labels) + "\n")
        written.append("labels.txt")
    return written


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shaped the graphs."""
    import onnx
    import onnxruntime
    import torch

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except ImportError:  # pragma: no cover - onnxscript ships with the export extra
        pass
    return versions


def write_manifest(version_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write VERSION/manifest.json."""
    path = version_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path
