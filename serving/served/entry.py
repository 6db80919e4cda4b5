"""What every served model holds of its repository entry, whatever its kind."""

from __future__ import annotations

from pathlib import Path

from contract.model_config import ModelConfig
from contract.repository import Fingerprint, read_manifest
from serving.backends.base import Backend
from serving.served.inputs import float_dtype


class ServedEntry:
    """A loaded repository entry: its config, version, manifest and the graphs' float type.

    Args:
        config: the entry's config.yaml.
        version_dir: REPOSITORY/NAME/VERSION.
        backend: the graphs (None where the model runs in another process).
    """

    def __init__(self, config: ModelConfig, version_dir: Path, backend: Backend | None) -> None:
        self.name = config.name
        self.version = int(version_dir.name)
        self.version_dir = version_dir
        self.backend = backend
        self.manifest = read_manifest(version_dir)
        self.float_dtype = float_dtype(config.precision)
        # the entry's files and the version folder's as they were when it was built (set by
        # ``serving.repository.rebuild_models``): a reload keeps a version whose files are
        # unchanged
        self.files: tuple[Fingerprint, Fingerprint] = ((), ())
