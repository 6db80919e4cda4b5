"""`attnserve export-all PLAN.yaml`: export many models in one run, in parallel processes.

A plan names a model repository, defaults for the export options and a list of models::

    repository: model_repository        # relative to the plan file's folder, or absolute
    jobs: 2                             # optional default parallelism
    defaults: {opset: 23, precision: fp32, force: false, parity_examples: 128}
    models:
      - source: translator              # kind, checkpoint dir (relative to the plan) or HF dir
        name: translator                # optional (default: the model kind)
        version: 1                      # optional (default 1)
        precision: int8                 # optional overrides of defaults

Each model is exported by ``export.exporter.export`` in a worker process ("spawn": torch is not
fork-safe). One model's failure is reported and does not stop the others. At the end a summary
table is printed, written to REPOSITORY/export-summary.json, and the exit code is 1 if any model
failed. Models that share an entry name never run at the same time: they write the same
REPOSITORY/NAME/config.yaml.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    BrokenExecutor,
    CancelledError,
    Future,
    ProcessPoolExecutor,
    wait,
)
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract.graphs import DEFAULT_BLOCK_STEPS
from contract.schema import SchemaError, load_yaml
from export.errors import DestinationError, ExportError, SourceError

DEFAULT_JOBS = 2
SUMMARY_FILE = "export-summary.json"
MIN_PARITY_EXAMPLES = 100  # the end-to-end parity rule of `attnserve export`

Precision = Literal["fp32", "fp16", "int8"]
KvCacheDtype = Literal["float", "int8"]
DecodeAttention = Literal["fused", "matmul"]


# --------------------------------------------------------------------------- plan schema


@dataclass(frozen=True)
class PlanDefaults:
    """Export options applied to every model of the plan unless the model overrides them."""

    opset: int = 23  # ONNX opset; >= 23 gives the fused Attention op
    precision: Precision = "fp32"  # fp32 | fp16 | int8
    kv_cache_dtype: KvCacheDtype = "float"  # float | int8 (with precision int8)
    # fused | matmul (the decoder's attention over a float cache; unset: matmul for int8)
    decode_attention: DecodeAttention | None = None
    decode_block: int = DEFAULT_BLOCK_STEPS  # steps per decode block graph (2-16; 0: none)
    force: bool = False  # overwrite existing versions
    parity_examples: int = 128  # held-out examples checked end to end (>= 100)
    tensorrt: bool = False  # also build TensorRT engines (needs TensorRT and a GPU)

    def __post_init__(self) -> None:
        _check_parity_examples(self.parity_examples)


@dataclass(frozen=True)
class PlanModel:
    """One model to export; unset options come from the plan's defaults."""

    source: str  # model kind, checkpoint directory (relative to the plan) or HF directory
    name: str | None = None  # entry name (default: the model kind)
    version: int = 1  # version folder
    opset: int | None = None
    precision: Precision | None = None
    kv_cache_dtype: KvCacheDtype | None = None
    decode_attention: DecodeAttention | None = None
    decode_block: int | None = None
    force: bool | None = None
    parity_examples: int | None = None
    tensorrt: bool | None = None

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("source must not be empty")
        if self.version < 1:
            raise ValueError(f"version must be >= 1, got {self.version}")
        if self.parity_examples is not None:
            _check_parity_examples(self.parity_examples)


@dataclass(frozen=True)
class ExportPlan:
    """The contents of a PLAN.yaml."""

    models: list[PlanModel]  # the models to export, at least one
    repository: str = "model_repository"  # relative to the plan file's folder, or absolute
    jobs: int | None = None  # parallel processes (`--jobs` overrides; default 2)
    defaults: PlanDefaults = field(default_factory=PlanDefaults)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("models must list at least one model")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")


def _check_parity_examples(value: int) -> None:
    if value < MIN_PARITY_EXAMPLES:
        raise ValueError(
            f"parity_examples must be >= {MIN_PARITY_EXAMPLES} (the end-to-end parity rule), "
            f"got {value}"
        )


@dataclass(frozen=True)
class ExportTask:
    """One resolved plan entry: plain data a worker process can take."""

    index: int  # position in the plan's models list
    source: str  # a model kind or an absolute directory
    name: str | None  # entry name, None when only loading the source can tell
    options: dict[str, Any]  # ExportOptions fields

    @property
    def label(self) -> str:
        """The name shown in progress and summary (the source when the name is unknown)."""
        return self.name or Path(self.source).name


# --------------------------------------------------------------------------- loading a plan


def load_plan(plan_path: str | Path) -> tuple[ExportPlan, Path, list[ExportTask]]:
    """Read, validate and resolve PLAN.yaml.

    Args:
        plan_path: the plan file.

    Returns:
        The plan, the absolute repository directory, and one task per model (in plan order).

    Raises:
        SchemaError: missing file, invalid YAML, a bad field (named), or two models exporting
            the same name and version.
    """
    plan_path = Path(plan_path)
    plan = load_yaml(ExportPlan, plan_path)
    base = plan_path.resolve().parent
    repository = _resolve_path(plan.repository, base)
    tasks = [_task(i, model, plan.defaults, base) for i, model in enumerate(plan.models)]
    _check_duplicates(tasks, plan_path)
    return plan, repository, tasks


def _resolve_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def _task(index: int, model: PlanModel, defaults: PlanDefaults, base: Path) -> ExportTask:
    from models.checkpoint import MODEL_KINDS

    is_kind = model.source in MODEL_KINDS
    source = model.source if is_kind else str(_resolve_path(model.source, base))
    name = model.name or (model.source if is_kind else _source_kind(Path(source)))
    options = {"name": model.name, "version": model.version}
    for option, default in asdict(defaults).items():
        override = getattr(model, option)
        options[option] = default if override is None else override
    return ExportTask(index, source, name, options)


def _source_kind(directory: Path) -> str | None:
    """The model kind a source directory holds, from its config.json alone (no weights loaded).

    Args:
        directory: a checkpoint directory from `attnserve train` or a Hugging Face directory.

    Returns:
        "translator" | "vit" | "captioner"; None for a missing, unreadable or unsupported
        config.json (the worker then reports the problem).
    """
    from models.checkpoint import MODEL_KINDS

    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if "architectures" in data or "model_type" in data:  # Hugging Face, as in export.sources
        from export.hf import hf_kind

        try:
            return hf_kind(data)
        except SourceError:
            return None
    kind = data.get("kind")
    return kind if kind in MODEL_KINDS else None


def _check_duplicates(tasks: list[ExportTask], plan_path: Path) -> None:
    seen: dict[tuple[str, int], ExportTask] = {}
    for task in tasks:
        if task.name is None:
            continue
        key = (task.name, task.options["version"])
        if key in seen:
            raise SchemaError(
                f"{plan_path}: models[{seen[key].index}] and models[{task.index}] both export "
                f"{task.name!r} version {key[1]}; give one of them another name or version"
            )
        seen[key] = task


# --------------------------------------------------------------------------- worker process


def init_worker(threads: int) -> None:
    """Process-pool initializer: cap torch's (and OpenMP's) threads for this worker.

    Args:
        threads: intra-op threads for this worker (see ``worker_threads``).
    """
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    import torch

    torch.set_num_threads(threads)


def export_worker(source: str, repository: str, options: dict[str, Any]) -> dict[str, Any]:
    """Export one model; runs in a worker process and never raises.

    Args:
        source: a model kind or a source directory.
        repository: the model repository directory.
        options: ``ExportOptions`` fields.

    Returns:
        A plain dict: status ("ok" | "failed"), seconds, and for successes the entry name,
        version folder and parity agreement; for failures the error message.
    """
    started = time.perf_counter()
    try:
        outcome = _export_one(source, repository, options)
    except (ExportError, SourceError, DestinationError, ValueError) as err:
        outcome = {"status": "failed", "error": str(err)}  # the message says what to do
    except Exception as err:
        # Broad on purpose, the one place it is right: one bad model must never stop the run,
        # and no exception may cross the process boundary (an unpicklable one breaks the pool).
        # An unexpected error is reported with its type name.
        outcome = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    outcome["seconds"] = round(time.perf_counter() - started, 1)
    return outcome


def _export_one(source: str, repository: str, options: dict[str, Any]) -> dict[str, Any]:
    from export.exporter import ExportOptions, export

    result = export(source, repository, ExportOptions(**options))
    manifest = result.manifest
    agreement_kind, agreement = _agreement(manifest["parity"])
    return {
        "status": "ok",
        "name": manifest["name"],
        "entry": str(result.version_dir),
        "agreement_kind": agreement_kind,
        "agreement": agreement,
        "error": None,
    }


def _agreement(parity: dict[str, Any]) -> tuple[str | None, float | None]:
    """("greedy", rate) for seq2seq models, ("top-1", rate) for classifiers."""
    if parity.get("greedy_agreement") is not None:
        return "greedy", parity["greedy_agreement"]
    if parity.get("top1_examples"):
        return "top-1", round(parity["top1_identical"] / parity["top1_examples"], 4)
    return None, None


# --------------------------------------------------------------------------- scheduling


def run_plan(
    plan_path: str | Path, jobs: int | None = None, repository: str | Path | None = None
) -> int:
    """Export every model of PLAN.yaml; print a summary table and write export-summary.json.

    Args:
        plan_path: the plan file.
        jobs: parallel processes (default: the plan's ``jobs``, else 2).
        repository: export here instead of the plan's repository (`serve` uses it).

    Returns:
        The exit code: 1 if any model failed, 0 otherwise.

    Raises:
        SchemaError: the plan is invalid (nothing is exported).
        ValueError: ``jobs`` < 1.
    """
    plan, planned, tasks = load_plan(plan_path)
    repository = Path(repository).resolve() if repository is not None else planned
    jobs = jobs or plan.jobs or DEFAULT_JOBS
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    jobs = min(jobs, len(tasks))
    started = time.perf_counter()
    rows = [_row(task, None) for task in tasks]
    for task, outcome in _run_tasks(tasks, repository, jobs):
        rows[task.index] = _row(task, outcome)
    total = round(time.perf_counter() - started, 1)
    print(format_table(rows))
    write_summary(repository, Path(plan_path), jobs, total, rows)
    return 1 if any(row["status"] != "ok" for row in rows) else 0


def worker_threads(jobs: int, cores: int | None = None) -> int:
    """torch threads per worker so that ``jobs`` workers share the cores without oversubscribing.

    Args:
        jobs: parallel worker processes.
        cores: CPU cores to share (default: those this process may run on).

    Returns:
        ``max(1, cores // jobs)``.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // jobs)


def _run_tasks(
    tasks: list[ExportTask], repository: Path, jobs: int
) -> Iterator[tuple[ExportTask, dict[str, Any]]]:
    """Run the tasks in a spawn process pool; yield (task, outcome) as each one finishes."""
    from tqdm import tqdm

    executor = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=init_worker,
        initargs=(worker_threads(jobs),),
    )
    bar = tqdm(total=len(tasks), desc="export-all", unit="model", file=sys.stderr)
    try:
        for task, outcome in _schedule(executor, tasks, str(repository), jobs):
            bar.set_postfix_str(f"{task.label} {outcome['status']}")
            bar.update(1)
            yield task, outcome
    finally:
        bar.close()
        executor.shutdown(wait=True, cancel_futures=True)


def _schedule(
    executor: ProcessPoolExecutor, tasks: list[ExportTask], repository: str, jobs: int
) -> Iterator[tuple[ExportTask, dict[str, Any]]]:
    """Keep up to ``jobs`` tasks running, never two that may write the same entry."""
    pending = list(tasks)
    running: dict[Future[dict[str, Any]], ExportTask] = {}
    while pending or running:
        for task in _startable(pending, running.values(), jobs - len(running)):
            pending.remove(task)
            try:
                future = executor.submit(export_worker, task.source, repository, task.options)
            except BrokenExecutor as err:  # a worker process died earlier (killed, out of memory)
                yield task, {"status": "failed", "error": f"not run: {err}", "seconds": 0.0}
                continue
            running[future] = task
        if not running:
            continue
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            yield running.pop(future), _outcome(future)


def _startable(
    pending: list[ExportTask], running: Iterable[ExportTask], slots: int
) -> list[ExportTask]:
    """Pending tasks that may start now, in plan order.

    Tasks with the same entry name wait for each other (they share NAME/config.yaml); a task
    whose name is unknown until its source is loaded waits for every other task.
    """
    busy = list(running)
    chosen: list[ExportTask] = []
    for task in pending:
        if len(chosen) >= slots:
            break
        if not any(_conflict(task, other) for other in busy):
            chosen.append(task)
            busy.append(task)
    return chosen


def _conflict(a: ExportTask, b: ExportTask) -> bool:
    return a.name is None or b.name is None or a.name == b.name


def _outcome(future: Future[dict[str, Any]]) -> dict[str, Any]:
    """The worker's dict; a worker process that died (killed, out of memory) becomes a failure."""
    try:
        return future.result()
    except (BrokenExecutor, CancelledError) as err:  # the worker itself never raises
        return {"status": "failed", "error": f"{type(err).__name__}: {err}", "seconds": None}


# --------------------------------------------------------------------------- summary


def _row(task: ExportTask, outcome: dict[str, Any] | None) -> dict[str, Any]:
    """One summary row: what the plan asked for and what happened."""
    outcome = outcome or {"status": "failed", "error": "not run", "seconds": None}
    return {
        "name": outcome.get("name") or task.name,
        "source": task.source,
        "version": task.options["version"],
        "precision": task.options["precision"],
        "status": outcome["status"],
        "seconds": outcome.get("seconds"),
        "agreement_kind": outcome.get("agreement_kind"),
        "agreement": outcome.get("agreement"),
        "entry": outcome.get("entry"),
        "error": outcome.get("error"),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a plain-text table (one line per model, errors on their first line)."""
    header = ("name", "version", "precision", "status", "seconds", "agreement", "error")
    lines = [header] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    widths[-1] = 0  # the error column is not padded
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    seconds = "-" if row["seconds"] is None else f"{row['seconds']:.1f}"
    agreement = (
        f"{row['agreement_kind']} {row['agreement']:.2%}" if row["agreement"] is not None else "-"
    )
    error = (row["error"] or "").strip().splitlines()
    return (
        row["name"] or Path(row["source"]).name,
        str(row["version"]),
        row["precision"],
        "ok" if row["status"] == "ok" else "FAILED",
        seconds,
        agreement,
        error[0] if error else "",
    )


def write_summary(
    repository: Path, plan_path: Path, jobs: int, seconds: float, rows: list[dict[str, Any]]
) -> Path:
    """Write REPOSITORY/export-summary.json and return its path."""
    repository.mkdir(parents=True, exist_ok=True)
    failed = sum(row["status"] != "ok" for row in rows)
    summary = {
        "plan": str(plan_path.resolve()),
        "repository": str(repository),
        "jobs": jobs,
        "seconds": seconds,
        "ok": len(rows) - failed,
        "failed": failed,
        "models": rows,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = repository / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path
