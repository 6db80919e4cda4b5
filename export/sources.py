"""Resolve an export SOURCE: a shipped model kind, a checkpoint directory or a HF directory."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from contract.model_config import TokenizerSpec
from contract.normalize import NormalizerError, read_normalizer
from contract.tokenizer import SubwordTokenizer
from export.errors import SourceError
from models.checkpoint import (
    MODEL_KINDS,
    CheckpointError,
    load_checkpoint,
    shipped_checkpoint,
)


@dataclass(frozen=True)
class EntryExtras:
    """What serving needs besides the graphs and our own tokenizer: the source's tokenizer files
    and preprocessing, its generation rules. Hugging Face imports read them from the directory;
    checkpoints of ours carry a normaliser at most."""

    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)  # config.yaml `tokenizer`
    tokenizer_files: tuple[tuple[str, bytes], ...] = ()  # (name, content) for the version folder
    languages: tuple[str, ...] | None = None  # target languages; None: our tokenizer's tags
    suppress_ids: tuple[int, ...] = ()  # never generated (bad_words_ids of one token)
    bad_words: tuple[tuple[int, ...], ...] = ()  # bad_words_ids of several tokens
    forced_eos: bool = False  # the last position is EOS (forced_eos_token_id)
    resample: str = "bilinear"  # image resize filter
    notes: dict[str, Any] = field(default_factory=dict)  # for manifest.json: what was read


@dataclass
class LoadedSource:
    """A model ready to export, with what the repository entry needs besides the graphs."""

    kind: str  # translator | captioner | vit
    model: nn.Module
    tokenizer: SubwordTokenizer | None
    origin: str  # what the user passed
    checksum: str  # sha256 over the source's weight files
    hf_tokenizer_dir: Path | None = None  # HF imports: the directory the tokenizer came from
    extra: dict[str, Any] | None = None
    entry: EntryExtras = field(default_factory=EntryExtras)


def directory_checksum(directory: Path, suffixes: tuple[str, ...]) -> str:
    """sha256 over the files of ``directory`` with these suffixes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.suffix in suffixes):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def load_source(source: str) -> LoadedSource:
    """Load SOURCE.

    Raises:
        SourceError: when SOURCE is none of a kind name, a checkpoint, a HF directory.
    """
    directory = shipped_checkpoint(source) if source in MODEL_KINDS else Path(source)
    if not directory.is_dir():
        raise SourceError(
            f"export source {source!r} is not a model kind ({', '.join(MODEL_KINDS)}) nor an "
            "existing directory; pass a kind, a checkpoint directory from `attnserve train`, or "
            "a Hugging Face save_pretrained directory"
        )
    if (directory / "config.json").is_file() and _is_hf_directory(directory):
        from export.hf import load_hf_directory

        return load_hf_directory(directory)
    try:
        checkpoint = load_checkpoint(directory)
        normalizer = read_normalizer(directory)
    except (CheckpointError, NormalizerError) as err:
        raise SourceError(str(err)) from err
    return LoadedSource(
        kind=checkpoint.kind,
        model=checkpoint.model,
        tokenizer=checkpoint.tokenizer,
        origin=str(source),
        checksum=directory_checksum(directory, (".safetensors", ".json")),
        entry=EntryExtras(tokenizer=TokenizerSpec(normalizer=normalizer)),
    )


def _is_hf_directory(directory: Path) -> bool:
    """HF save_pretrained directories carry "model_type" or "architectures" in config.json."""
    import json

    try:
        data = json.loads((directory / "config.json").read_text())
    except (ValueError, OSError):
        return False
    return isinstance(data, dict) and ("architectures" in data or "model_type" in data)
