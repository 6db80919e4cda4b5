"""The model-repository entry: config.yaml, version folder, tokenizer / labels, manifest.json."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.model_config import (
    ClassifierConfig,
    DecoderSpec,
    GeneratorConfig,
    GeneratorLimits,
    ImageSpec,
    InFlightBatching,
    ModelConfig,
)
from contract.repository import (
    CONFIG_FILE,
    LABELS_FILE,
    MODEL_NAME_RULE,
    is_valid_model_name,
    read_model_config,
    write_model_config,
)
from contract.schema import SchemaError
from export.errors import DestinationError
from export.sources import EntryExtras, LoadedSource
from models.captioner import Captioner
from models.translator import Translator
from models.vit import ViT


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


def model_config_for(source: LoadedSource, name: str, precision: str) -> ModelConfig:
    """The config.yaml for an exported model: kind, limits, batching, decoder facts, the
    tokenizer and the image preprocessing."""
    model = source.model
    if source.kind == "vit":
        assert isinstance(model, ViT)  # what a vit source loads
        labels, classes = model.config.labels, model.config.num_classes
        return ClassifierConfig(
            name=name,
            precision=precision,  # type: ignore[arg-type]
            image=image_spec(source),
            labels=tuple(labels) or tuple(str(i) for i in range(classes)),
        )
    batching = InFlightBatching()
    if source.kind == "translator":
        assert isinstance(model, Translator)  # what a translator source loads
        max_source = min(model.config.max_source_length, model.config.max_positions)
    else:
        assert isinstance(model, Captioner)  # the other encoder-decoder kind
        max_source = model.config.num_patches + 1
    config = model.config
    limits = GeneratorLimits(
        max_batch_size=batching.max_active_sequences,
        max_source_length=max_source,
        max_new_tokens=min(config.max_target_length, config.max_positions - 1),
    )
    entry = source.entry
    if source.kind == "translator":
        languages = tuple((source.extra or {}).get("languages", ())) or _languages(source)
        return GeneratorConfig(
            name=name,
            task="translation",
            input="text",
            precision=precision,  # type: ignore[arg-type]
            limits=limits,
            batching=batching,
            decoder=decoder_spec(config, entry),
            languages=languages if entry.languages is None else entry.languages,
            tokenizer=entry.tokenizer,
        )
    return GeneratorConfig(
        name=name,
        task="captioning",
        input="image",
        precision=precision,  # type: ignore[arg-type]
        limits=limits,
        batching=batching,
        decoder=decoder_spec(config, entry),
        image=image_spec(source),
        tokenizer=replace(entry.tokenizer, language_tag=""),
    )


def decoder_spec(config: Any, entry: EntryExtras | None = None) -> DecoderSpec:
    """What serving's decode loop needs to know about an encoder-decoder model's graphs (and,
    given the source's ``entry`` extras, its generation rules)."""
    entry = entry or EntryExtras()
    return DecoderSpec(
        num_layers=config.decoder_layers,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        pad_id=config.pad_id,
        eos_id=config.eos_id,
        decoder_start_id=config.decoder_start_id,
        max_positions=config.max_positions,
        suppress_ids=entry.suppress_ids,
        forced_eos=entry.forced_eos,
        bad_words=entry.bad_words,
    )


def image_spec(source: LoadedSource) -> ImageSpec:
    """The image preprocessing of an image model: size, mean, std and resize filter."""
    model = source.model
    assert isinstance(model, ViT | Captioner)  # the image models
    config = model.config
    return ImageSpec(
        config.image_size,
        tuple(config.image_mean),
        tuple(config.image_std),
        source.entry.resample,  # type: ignore[arg-type]
    )


def _languages(source: LoadedSource) -> tuple[str, ...]:
    """Target languages from the tokenizer's "<2xx>" tags."""
    tokenizer = source.tokenizer
    if tokenizer is None:
        return ()
    tags = (tokenizer.id_to_token(i) for i in sorted(tokenizer.special_ids))
    return tuple(t[2:-1] for t in tags if t.startswith("<2") and t.endswith(">"))


def write_entry_files(
    source: LoadedSource, entry: Path, version_dir: Path, config: ModelConfig
) -> list[str]:
    """config.yaml (entry level) and tokenizer / labels (version level); returns file names.

    The entry's ``version_policy`` stays as it was: a new version exported into an entry that
    serves several keeps serving them."""
    if (entry / CONFIG_FILE).is_file():
        with contextlib.suppress(SchemaError):  # a broken config.yaml is replaced whole
            config = replace(config, version_policy=read_model_config(entry).version_policy)
    write_model_config(config, entry)
    written = []
    if source.tokenizer is not None:
        written.append(source.tokenizer.save(version_dir).name)
    for file_name, content in source.entry.tokenizer_files:
        (version_dir / file_name).write_bytes(content)
        written.append(file_name)
    if isinstance(config, ClassifierConfig) and config.labels:
        (version_dir / LABELS_FILE).write_text("\n".join(config.labels) + "\n")
        written.append(LABELS_FILE)
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
