"""The model repository on disk: entry and version folders, model names, config and manifest.

Layout of a repository entry (docs/architecture.md, "The model repository"):

    REPOSITORY/NAME/config.yaml                       what the model is, limits, batching
    REPOSITORY/NAME/VERSION/encoder.onnx, decoder.onnx   (seq2seq)
    REPOSITORY/NAME/VERSION/model.onnx, labels.txt       (classifier)
    REPOSITORY/NAME/VERSION/tokenizer.json, manifest.json, *.plan (TensorRT, when built)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from contract.model_config import ModelConfig, model_config_from_mapping, served_versions
from contract.schema import SchemaError, dump_yaml, read_yaml

# The version of what an export writes: 2 added the in-place decoder and its cache graphs.
REPOSITORY_FORMAT = 2
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
LABELS_FILE = "labels.txt"

# A model name is a plain folder name: it can never be a path, hidden, empty or absurdly long.
MAX_MODEL_NAME_LENGTH = 128
MODEL_NAME_RULE = (
    f"1-{MAX_MODEL_NAME_LENGTH} characters of ASCII letters, digits, '.', '_' and '-', "
    "starting with a letter or digit"
)
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_valid_model_name(name: str) -> bool:
    """Whether ``name`` follows ``MODEL_NAME_RULE`` (so it cannot escape the repository)."""
    return len(name) <= MAX_MODEL_NAME_LENGTH and _MODEL_NAME.fullmatch(name) is not None


def read_model_config(entry: str | Path) -> ModelConfig:
    """Read REPOSITORY/NAME/config.yaml.

    Raises:
        SchemaError: missing file or bad field, named.
    """
    return read_yaml(Path(entry) / CONFIG_FILE, model_config_from_mapping)


def write_model_config(config: ModelConfig, entry: str | Path) -> Path:
    """Write REPOSITORY/NAME/config.yaml and return its path."""
    path = Path(entry) / CONFIG_FILE
    dump_yaml(config, path)
    return path


def version_dirs(entry: str | Path) -> list[int]:
    """The numeric version folders of an entry, ascending."""
    return sorted(
        int(p.name)
        for p in Path(entry).iterdir()
        if p.is_dir() and p.name.isascii() and p.name.isdigit()
    )


def resolve_version(entry: str | Path, version: int | None = None) -> Path:
    """The folder of ``version`` (default: the newest).

    Raises:
        SchemaError: when the entry has no such version.
    """
    versions = version_dirs(entry)
    if not versions:
        raise SchemaError(f"{entry} has no version folders (1/, 2/, ...); export a model into it")
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise SchemaError(f"{entry} has no version {chosen}; available: {versions}")
    return Path(entry) / str(chosen)


def served_version_dirs(entry: str | Path, config: ModelConfig) -> list[Path]:
    """The version folders the entry's ``version_policy`` serves (default: the newest),
    ascending.

    Raises:
        SchemaError: the entry has no version folders, or the policy names one it lacks.
    """
    available = version_dirs(entry)
    if not available:
        raise SchemaError(f"{entry} has no version folders (1/, 2/, ...); export a model into it")
    try:
        chosen = served_versions(config.version_policy, available)
    except ValueError as err:
        raise SchemaError(str(err)) from err
    return [Path(entry) / str(v) for v in chosen]


# what a folder's files looked like: each file's path, size, modification time and inode
Fingerprint = tuple[tuple[str, int, int, int], ...]


def fingerprint(folder: str | Path, skip: tuple[str, ...] = ()) -> Fingerprint:
    """Each file's path (relative to ``folder``), size, modification time and inode, of every
    file under ``folder`` but the top-level names in ``skip`` (a file replaced by a rename has a
    new inode even with the old time)."""
    files = []
    for place, dirs, names in os.walk(folder):
        if place == str(folder):
            dirs[:] = [d for d in dirs if d not in skip]
            names = [n for n in names if n not in skip]
        for name in names:
            path = os.path.join(place, name)
            with contextlib.suppress(OSError):  # removed while we look
                info = os.stat(path)
                files.append(
                    (os.path.relpath(path, folder), info.st_size, info.st_mtime_ns, info.st_ino)
                )
    return tuple(sorted(files))


def read_manifest(version_dir: str | Path) -> dict[str, Any]:
    """VERSION/manifest.json (provenance, parity figures, graph facts); {} when absent.

    Raises:
        SchemaError: the file exists but is not a JSON object.
    """
    path = Path(version_dir) / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise SchemaError(f"{path}: invalid JSON ({err})") from err
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_manifest(version_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Write VERSION/manifest.json and return its path."""
    path = Path(version_dir) / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path
