"""Load a model repository into served models (one backend and scheduler per entry)."""

from __future__ import annotations

import logging
from pathlib import Path

from serving.backends.base import Backend, BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.errors import InvalidArgument, NotFound
from serving.metrics import ServingMetrics
from serving.model_config import (
    CLASSIFIER_FILE,
    CONFIG_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    MODEL_NAME_RULE,
    ModelConfig,
    is_valid_model_name,
    read_model_config,
    resolve_version,
)
from serving.runtime import ServedModel
from serving.schema import SchemaError

log = logging.getLogger(__name__)


class RepositoryError(ValueError):
    """The repository (or a model in it) cannot be served; the message names the entry."""


def graph_files(config: ModelConfig) -> dict[str, str]:
    """The graphs a model kind needs."""
    if config.kind == "seq2seq":
        return {"encoder": ENCODER_FILE, "decoder": DECODER_FILE}
    return {"model": CLASSIFIER_FILE}


def make_backend(config: ModelConfig, version_dir: Path) -> Backend:
    """The configured backend for a version folder.

    Raises:
        BackendError: the backend is not available here or the graphs do not load.
    """
    if config.backend == "tensorrt":
        from serving.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(version_dir, graph_files(config))
    return OnnxRuntimeBackend(version_dir, graph_files(config), config.onnxruntime)


class ModelRepository:
    """The served models of one repository directory, by name."""

    def __init__(self, models: dict[str, ServedModel]) -> None:
        self._models = models

    @classmethod
    def load(
        cls,
        root: str | Path,
        metrics: ServingMetrics | None = None,
        names: tuple[str, ...] = (),
    ) -> ModelRepository:
        """Load every entry (or only ``names``) of the repository at ``root``.

        Raises:
            RepositoryError: a missing repository, a requested name that is not there, an entry
                whose folder name is not a valid model name, or an entry whose config or graphs
                are broken (named, with the cause).
        """
        root = Path(root)
        if not root.is_dir():
            raise RepositoryError(
                f"model repository {root} does not exist; export models into it with "
                "`attnserve export KIND --out REPOSITORY`"
            )
        entries = sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())
        if names:
            missing = sorted(set(names) - {p.name for p in entries})
            if missing:
                raise RepositoryError(f"{root} has no model(s) {', '.join(missing)}")
            entries = [p for p in entries if p.name in names]
        if not entries:
            raise RepositoryError(f"{root} holds no models (no */config.yaml)")
        models = {}
        for entry in entries:
            if not is_valid_model_name(entry.name):
                raise RepositoryError(
                    f"cannot serve {entry}: the folder name {entry.name[:100]!r} is not a valid "
                    f"model name ({MODEL_NAME_RULE}); rename the folder and the `name` in its "
                    "config.yaml"
                )
            try:
                config = read_model_config(entry)
                if config.name != entry.name:
                    raise SchemaError(
                        f"config.yaml names {config.name!r} but sits in {entry.name}/"
                    )
                version_dir = resolve_version(entry)
                models[config.name] = ServedModel(
                    config, version_dir, make_backend(config, version_dir), metrics
                )
            except (SchemaError, BackendError, OSError, ValueError) as err:
                raise RepositoryError(f"cannot serve {entry}: {err}") from err
            log.info("loaded %s version %s (%s)", config.name, version_dir.name, config.task)
        return cls(models)

    def get(self, name: str) -> ServedModel:
        """The served model called ``name``.

        Raises:
            InvalidArgument: ``name`` cannot be a model name (a path, empty, too long, ...).
            NotFound: listing the models this server has.
        """
        if not is_valid_model_name(name):
            raise InvalidArgument(
                f"{name[:100]!r} is not a model name: model names are {MODEL_NAME_RULE}; "
                "ListModels lists the served ones"
            )
        model = self._models.get(name)
        if model is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise NotFound(f"no model named {name[:100]!r}; this server has: {known}")
        return model

    def models(self) -> list[ServedModel]:
        return [self._models[name] for name in sorted(self._models)]

    async def start(self) -> None:
        for model in self._models.values():
            await model.start()

    async def stop(self, grace: float) -> None:
        for model in self._models.values():
            await model.stop(grace)
