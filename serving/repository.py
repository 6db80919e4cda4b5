"""Load a model repository into served models (one backend and scheduler per served version)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from contract.graphs import (
    DECODER,
    DECODER_BLOCK,
    ENCODER,
    INPLACE_GRAPH_FILES,
    OPTIONAL_INPLACE_GRAPH_FILES,
    graph_files,
)
from contract.model_config import GeneratorConfig, ModelConfig
from contract.repository import (
    CONFIG_FILE,
    MODEL_NAME_RULE,
    Fingerprint,
    fingerprint,
    is_valid_model_name,
    read_model_config,
    served_version_dirs,
    version_dirs,
)
from contract.schema import SchemaError
from serving.backends.base import Backend, BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.errors import FailedPrecondition, InvalidArgument, NotFound
from serving.metrics import ServingMetrics
from serving.served import ServedModel, serve

log = logging.getLogger(__name__)


ModelFactory = Callable[[ModelConfig, Path], ServedModel]
NOT_LOADED = "not loaded: the server serves only the models its `models` setting names"
UNLOADED = "unloaded (RepositoryModelUnload)"
REMOVED = "unloaded: its entry left the repository folder"
EXPLICIT_HINT = (
    "RepositoryModelLoad loads it on a server started with --model-control-mode explicit"
)


# a longer version string is no served version (and int() refuses thousands of digits)
MAX_VERSION_DIGITS = 18


class RepositoryError(ValueError):
    """The repository (or a model in it) cannot be served; the message names the entry."""


def make_backend(config: ModelConfig, version_dir: Path) -> Backend:
    """The configured backend for a version folder.

    Raises:
        BackendError: the backend is not available here or the graphs do not load.
    """
    if config.backend == "tensorrt":
        from serving.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(version_dir, graph_files(config.kind))
    files = graph_files(config.kind)
    inplace = {ENCODER: files.get(ENCODER, ""), **INPLACE_GRAPH_FILES}
    wanted = isinstance(config, GeneratorConfig) and config.onnxruntime.kv_cache == "inplace"
    if wanted and all((version_dir / name).is_file() for name in inplace.values()):
        optional = OPTIONAL_INPLACE_GRAPH_FILES.items()  # absent from older exports
        inplace |= {graph: name for graph, name in optional if (version_dir / name).is_file()}
        if not getattr(config, "decodes_in_blocks", False):  # a session, its own weights
            inplace.pop(DECODER_BLOCK, None)
        try:
            return _inplace_backend(version_dir, inplace, config)
        except BackendError as err:  # e.g. an ONNX Runtime without opset 24
            log.warning(
                "%s: cannot load the in-place decoder (%s); serving %s with the growing cache",
                config.name,
                err,
                files.get(DECODER),
            )
    return OnnxRuntimeBackend(version_dir, files, config.onnxruntime)


def _inplace_backend(
    version_dir: Path, graphs: dict[str, str], config: ModelConfig
) -> OnnxRuntimeBackend:
    """The in-place graphs' backend; where the decode block will not load, without it (and a
    warning: the decoder then runs one step per run)."""
    try:
        return OnnxRuntimeBackend(version_dir, graphs, config.onnxruntime)
    except BackendError as err:
        if DECODER_BLOCK not in graphs:
            raise
        log.warning("%s: cannot load the decode block (%s); decoding without it", config.name, err)
    return OnnxRuntimeBackend(
        version_dir, {g: f for g, f in graphs.items() if g != DECODER_BLOCK}, config.onnxruntime
    )


def make_backends(config: ModelConfig, version_dir: Path) -> list[Backend]:
    """One backend per instance (``batching.instances``: in-flight engines of a generator,
    concurrent batches of a classifier).

    With several instances and ``onnxruntime.intra_op_threads`` 0, each instance's sessions get
    the usable cores divided among the instances (at least 1). Instances of one thread share one
    backend: ONNX Runtime runs concurrent calls of a session each on its caller's thread, so the
    weights (and the kernels' pre-packed copies of them) are held once, as CTranslate2's workers
    share one model; instances of several threads get their own sessions and thread pools, and
    so do instances whose decode steps replay CUDA graphs (``onnxruntime.cuda_graph`` with the
    CUDA provider: a captured graph belongs to its session and is replayed one run at a time).

    Raises:
        BackendError: the backend is not available here or the graphs do not load.
    """
    if config.batching.instances == 1:
        return [make_backend(config, version_dir)]
    instances = config.batching.instances
    if config.onnxruntime.intra_op_threads == 0:
        threads = max(1, len(os.sched_getaffinity(0)) // instances)
        config = replace(config, onnxruntime=replace(config.onnxruntime, intra_op_threads=threads))
    if config.onnxruntime.intra_op_threads == 1 and not config.onnxruntime.captures_cuda_graphs:
        return [make_backend(config, version_dir)] * instances
    return [make_backend(config, version_dir) for _ in range(instances)]


class ModelRepository:
    """The served models of one repository directory, by name and version.

    An entry serves the version folders its ``version_policy`` names (default: the newest),
    each a model of its own (sessions, engine or batcher); a request names a version or takes
    the newest served. Models may be loaded, reloaded and unloaded while the server runs
    (``load_model``, ``withdraw``; Triton's model control, README: Model control), each entry
    with all its served versions; the other entries of the directory are listed by
    ``unserved`` with the reason they are not served.

    Args:
        models: the served models (every served version of each entry).
        root: the repository directory they were loaded from.
        not_loaded: the names of the directory's other entries (left out by ``--models``).
        metrics: where models loaded later record.
        factory: how models loaded later are built (see ``load``).
    """

    def __init__(
        self,
        models: Iterable[ServedModel],
        root: Path | None = None,
        not_loaded: tuple[str, ...] = (),
        metrics: ServingMetrics | None = None,
        factory: ModelFactory | None = None,
    ) -> None:
        # name -> version -> model, versions ascending
        self._models: dict[str, dict[int, ServedModel]] = {}
        for model in sorted(models, key=lambda m: (m.name, m.version)):
            self._models.setdefault(model.name, {})[model.version] = model
        self.root = root
        self.metrics = metrics
        self.factory = factory
        # why an entry of the directory is not served (absent: never asked for, NOT_LOADED)
        self._reasons: dict[str, str] = dict.fromkeys(not_loaded, NOT_LOADED)
        # held by whoever loads or unloads (one at a time; ``serving.model_control``)
        self.control = asyncio.Lock()
        # how a model that is not served gets served (NOT_FOUND says it), and why an entry of the
        # folder no one asked for is not served (RepositoryIndex); both set by model polling
        self.load_hint = EXPLICIT_HINT
        self.unserved_reason = NOT_LOADED

    @classmethod
    def load(
        cls,
        root: str | Path,
        metrics: ServingMetrics | None = None,
        names: tuple[str, ...] = (),
        factory: ModelFactory | None = None,
    ) -> ModelRepository:
        """Load every entry (or only ``names``) of the repository at ``root``.

        ``factory`` builds each served model from its config and version folder; by default it
        loads the graphs here (``serve`` over ``make_backends``). A frontend process passes one
        that serves the model through the engine process instead.

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
        entries = model_entries(root)
        not_loaded: tuple[str, ...] = ()
        if names:
            missing = sorted(set(names) - {p.name for p in entries})
            if missing:
                raise RepositoryError(f"{root} has no model(s) {', '.join(missing)}")
            not_loaded = tuple(p.name for p in entries if p.name not in names)
            entries = [p for p in entries if p.name in names]
        if not entries:
            raise RepositoryError(f"{root} holds no models (no */config.yaml)")
        models = [model for entry in entries for model in build_models(entry, metrics, factory)]
        return cls(models, root, not_loaded, metrics, factory)

    def get(self, name: str, version: str = "") -> ServedModel:
        """The served model called ``name``: its ``version`` (digits), or with none the newest
        served.

        Raises:
            InvalidArgument: ``name`` cannot be a model name (a path, empty, too long, ...).
            NotFound: listing the models this server has (and, for an entry of the repository
                that is not served, why and how to load it), or the versions it serves.
        """
        check_model_name(name)
        versions = self._models.get(name)
        if versions is None:
            known = ", ".join(sorted(self._models)) or "none"
            reason = self._reasons.get(name)
            if reason is not None:
                raise NotFound(
                    f"model {name!r} is not served ({reason}); {self.load_hint}; served: {known}"
                )
            raise NotFound(f"no model named {name[:100]!r}; this server has: {known}")
        if not version:
            return versions[next(reversed(versions))]
        number = version.isascii() and version.isdigit() and len(version) <= MAX_VERSION_DIGITS
        model = versions.get(int(version)) if number else None
        if model is None:
            served = ", ".join(map(str, versions))
            raise NotFound(
                f"model {name!r} has no version {version[:40]!r}; it serves version"
                + (f" {served}: send that" if len(versions) == 1 else f"s {served}: send one")
                + " or leave the version empty (the newest)"
            )
        return model

    def versions(self, name: str) -> list[int]:
        """The versions of ``name`` served, ascending (NotFound as ``get``)."""
        self.get(name)
        return list(self._models[name])

    def models(self) -> list[ServedModel]:
        """Every served model, each version apart, by name and version."""
        return [model for name in sorted(self._models) for model in self._models[name].values()]

    def names(self) -> list[str]:
        """The served models' names."""
        return sorted(self._models)

    def unserved(self) -> dict[str, str]:
        """The entries of the repository directory that are not served, with the reason."""
        try:
            names = [p.name for p in model_entries(self.root)] if self.root is not None else []
        except OSError:  # the directory went away
            names = []
        return {
            name: self._reasons.get(name, self.unserved_reason)
            for name in [*names, *self._reasons]
            if name not in self._models
        }

    async def start(self) -> None:
        for model in self.models():
            await model.start()

    async def stop(self, grace: float) -> None:
        for model in self.models():
            await model.stop(grace)

    # --- model control --------------------------------------------------------------------------
    async def load_model(self, name: str) -> list[ServedModel]:
        """Load (or reload) the entry ``name`` from the repository directory and serve it, every
        version its policy names (the caller holds ``control``).

        The new models are built off the event loop and started before they replace the ones
        they reload, so requests never find the name unserved; requests already running keep
        the old ones, which are returned for the caller to stop (none where none was served;
        a version the policy no longer names among them). Where the entry changed, its
        unchanged versions stay as they are (``build_models``).

        Raises:
            InvalidArgument: ``name`` cannot be a model name.
            NotFound: the repository has no entry ``name``.
            FailedPrecondition: the entry cannot be served (its config or graphs; the message
                names the cause); what was served under the name stays served.
        """
        check_model_name(name)
        entry = self._entry(name)
        served = self._models.get(name, {})
        try:
            models, config = await asyncio.to_thread(
                rebuild_models, entry, self.metrics, self.factory, served
            )
        except RepositoryError as err:
            raise self._failed(name, err) from err
        kept = [m for m in models if served.get(m.version) is m]
        new = [m for m in models if served.get(m.version) is not m]
        started: list[ServedModel] = []
        try:
            for model in new:
                await model.start()
                started.append(model)
        except Exception as err:  # e.g. a classifier's warm-up call failing
            for model in [*started, new[len(started)]]:
                await model.stop(0)
            raise self._failed(name, RepositoryError(f"cannot start {entry}: {err}")) from err
        for model in kept:  # the same model: its config but for the edited policy
            model.config = replace(model.config, version_policy=config.version_policy)
        self._models[name] = {model.version: model for model in models}
        self._reasons.pop(name, None)
        return [m for m in served.values() if m not in kept]

    def _failed(self, name: str, err: RepositoryError) -> FailedPrecondition:
        if name not in self._models:
            self._reasons[name] = f"load failed: {err}"
        served = len(self._models.get(name, ()))
        kept = {0: "", 1: " (the version loaded before stays served)"}.get(
            served, " (the versions loaded before stay served)"
        )
        return FailedPrecondition(f"{err}; fix the entry and load it again{kept}")

    def withdraw(self, name: str, reason: str = UNLOADED) -> list[ServedModel]:
        """Stop serving ``name`` (every version) to new requests (NOT_FOUND, saying why:
        ``reason``; the caller holds ``control``); returns the models for the caller to stop
        (requests already running finish on them).

        Raises:
            InvalidArgument: ``name`` cannot be a model name.
            NotFound: no model ``name`` is served.
        """
        self.get(name)  # raises, saying why it is not served
        versions = self._models.pop(name)
        self._reasons[name] = reason
        return list(versions.values())

    def _entry(self, name: str) -> Path:
        entry = None if self.root is None else self.root / name
        if entry is None or not (entry / CONFIG_FILE).is_file():
            where = self.root if self.root is not None else "this server's repository"
            raise NotFound(
                f"{where} has no entry {name!r} (no {name}/{CONFIG_FILE}); export it with "
                "`attnserve export KIND --out REPOSITORY --name NAME`"
            )
        return entry


def model_entries(root: Path) -> list[Path]:
    """The model entries of a repository directory (folders with a config.yaml), by name."""
    return sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())


def check_model_name(name: str) -> None:
    """Raises InvalidArgument where ``name`` cannot be a model name (a path, empty, long)."""
    if not is_valid_model_name(name):
        raise InvalidArgument(
            f"{name[:100]!r} is not a model name: model names are {MODEL_NAME_RULE}; "
            "ListModels lists the served ones"
        )


def build_models(
    entry: Path, metrics: ServingMetrics | None, factory: ModelFactory | None
) -> list[ServedModel]:
    """The served models of one repository entry (not started), one per version its
    ``version_policy`` names: their graphs loaded here, or ``factory``'s models.

    Raises:
        RepositoryError: as ``rebuild_models``.
    """
    return rebuild_models(entry, metrics, factory, {})[0]


def rebuild_models(
    entry: Path,
    metrics: ServingMetrics | None,
    factory: ModelFactory | None,
    served: dict[int, ServedModel],
) -> tuple[list[ServedModel], ModelConfig]:
    """``build_models``, and the entry's config, for an entry whose ``served`` models are
    served now (a reload; {} at the start).

    Where the entry changed (a version added, removed or re-exported, or the policy edited),
    the versions whose files and config (but for the policy) are unchanged are these same
    models, as Triton keeps them; where nothing changed, every version is built again (an
    explicit reload).

    Raises:
        RepositoryError: the folder name is not a valid model name, or the entry's config or
            graphs are broken (named, with the cause).
    """
    if not is_valid_model_name(entry.name):
        raise RepositoryError(
            f"cannot serve {entry}: the folder name {entry.name[:100]!r} is not a valid "
            f"model name ({MODEL_NAME_RULE}); rename the folder and the `name` in its "
            "config.yaml"
        )
    models: list[ServedModel] = []
    try:
        config = read_model_config(entry)
        if config.name != entry.name:
            raise SchemaError(f"config.yaml names {config.name!r} but sits in {entry.name}/")
        dirs = served_version_dirs(entry, config)
        files = _files(entry, dirs)
        kept = _unchanged(served, config, files)
        for version_dir in dirs:
            version = int(version_dir.name)
            if version in kept:
                models.append(kept[version])
                log.info("kept %s version %s (unchanged)", config.name, version)
                continue
            if factory is None:
                first, *more = make_backends(config, version_dir)
                model = serve(config, version_dir, first, metrics, more)
            else:
                model = factory(config, version_dir)
            model.files = files[version]
            models.append(model)
            log.info("loaded %s version %s (%s)", config.name, version, config.task)
    except (SchemaError, BackendError, OSError, ValueError) as err:
        raise RepositoryError(f"cannot serve {entry}: {err}") from err
    return models, config


def _files(entry: Path, dirs: list[Path]) -> dict[int, tuple[Fingerprint, Fingerprint]]:
    """Each version's files: the entry's own (but its version folders and config.yaml, whose
    fields are compared instead) and the version folder's."""
    versions = tuple(map(str, version_dirs(entry)))
    shared = fingerprint(entry, skip=(*versions, CONFIG_FILE))
    return {int(d.name): (shared, fingerprint(d)) for d in dirs}


def _unchanged(
    served: dict[int, ServedModel],
    config: ModelConfig,
    files: dict[int, tuple[Fingerprint, Fingerprint]],
) -> dict[int, ServedModel]:
    """The served models a reload keeps: those of an unchanged version with an unchanged
    config (the policy aside), where the entry changed; none where nothing did."""
    policy_aside = replace(config, version_policy=None)
    kept = {
        version: model
        for version, model in served.items()
        if version in files
        and model.files == files[version]
        and replace(model.config, version_policy=None) == policy_aside
    }
    nothing_changed = set(kept) == set(served) == set(files)
    return {} if nothing_changed else kept
