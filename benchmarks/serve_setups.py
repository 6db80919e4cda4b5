"""The servers `attnserve bench serve` drives: one repository per setup, one server process each.

``shipped_repository`` exports the shipped translator and ViT into the cache (first use only).
``setup_repository`` writes a copy of it whose config.yaml files carry a setup's batching and
the benchmark's ONNX Runtime threads and providers (the version folders are symlinked, not
copied); ``server_process`` starts ``attnserve serve`` on it, on a free loopback port, in a child
process, so the load generator does not share the server's interpreter.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.attnserve_runner import execution_providers, is_current_export
from benchmarks.block_entry import with_decode_block
from benchmarks.output import log
from benchmarks.serve_settings import (
    BLOCK_STEPS,
    FRONTEND_WORKERS,
    GPU_VIT_CLIENTS,
    INSTANCES,
    MODELS,
    ONNXRUNTIME_EDITS,
    STREAM_INTERVAL_MS,
    WIDE_FRONTENDS,
)
from benchmarks.server_process import ServeProcess

# Per setup, the batching fields each model's config.yaml gets (a model missing from a setup is
# not served in it: the ViT has no in-flight batching to turn off).
BATCHING_EDITS: dict[str, dict[str, dict[str, Any]]] = {
    "batching": {"translator": {}, "vit": {}},
    "no_inflight": {"translator": {"in_flight": False}},
    "no_batching": {
        "translator": {"in_flight": False, "max_batch_size": 1, "max_active_sequences": 1},
        "vit": {"max_batch_size": 1, "max_queue_delay_us": 0},
    },
    "two_frontends": {"translator": {}, "vit": {}},  # batching's, served by 2 frontend processes
    # batching's models as two instances (the translator's in-flight engines, the ViT's
    # concurrent batches), the intra-op threads split between them
    "instances": {
        "translator": {"instances": INSTANCES["instances"]},
        "vit": {"instances": INSTANCES["instances"]},
    },
    "spinning": {"translator": {}, "vit": {}},  # batching's, with ONNXRUNTIME_EDITS["spinning"]
    # batching's translator, its streams' tokens sent once per interval
    "stream_interval": {"translator": {"stream_interval_ms": STREAM_INTERVAL_MS}},
    # batching's, served by 4 / 8 frontend processes
    **{setup: {"translator": {}, "vit": {}} for setup in WIDE_FRONTENDS},
    # eight_frontends' translator, each greedy step started before the last one's bookkeeping
    "eight_frontends_overlap": {"translator": {"overlap_steps": True}},
    # batching's translator one step per run; eight_frontends' decoding greedy steps in blocks
    # wherever it runs (its entry given a decoder_block graph of BLOCK_STEPS steps if it has none)
    "single_steps": {"translator": {"decode_block": False}},
    "eight_frontends_block": {"translator": {"decode_block": True}},
    # batching's translator in blocks wherever it runs, waiting requests joining between blocks
    # (with an interval of 1 a request waiting to join stops every block)
    "block_joins": {"translator": {"decode_block": True, "join_interval_steps": BLOCK_STEPS + 1}},
    # CUDA only, with ONNXRUNTIME_EDITS: the translator with and without CUDA graphs, the ViT
    # with cuDNN's heuristic convolution search; and the ViT's batches as they come (on CUDA
    # batching.batch_buckets pads them to powers of two by default)
    "cuda_graphs": {"translator": {}},
    "no_cuda_graphs": {"translator": {}},
    "conv_heuristic": {"vit": {}},
    "no_batch_buckets": {"vit": {"batch_buckets": "off"}},
}
# On CUDA, under every setup's own edits: a GPU deployment's batching, sized for the largest load
# (256 clients): as many cache rows as streams (the shipped config's 64 would cap 128 streams at
# 64 decoding), 64 joins per step, and queues that hold every client four times over.
CUDA_BATCHING_EDITS: dict[str, dict[str, Any]] = {
    "translator": {
        "max_active_sequences": GPU_VIT_CLIENTS,
        "max_batch_size": 64,
        "max_queue_size": 4 * GPU_VIT_CLIENTS,
    },
    "vit": {"max_queue_size": 4 * GPU_VIT_CLIENTS},
}


def shipped_repository(cache: Path) -> Path:
    """The shipped translator and ViT, exported into the cache (fp32, as plans/shipped.yaml)."""
    from contract.repository import CONFIG_FILE, read_manifest

    repository = Path(cache) / "shipped-repository"
    missing = [
        m
        for m in MODELS
        if not (repository / m / CONFIG_FILE).is_file()
        # a model from before today's graphs (is_current_export) is exported again; such
        # exports also have the translator's greedy pick graph and the ViT without Conv
        or not all(
            is_current_export(read_manifest(version.parent))
            for version in (repository / m).glob("*/manifest.json")
        )
    ]
    if missing:
        from export.exporter import ExportOptions, export

        for kind in missing:
            log(f"exporting the shipped {kind} into {repository} (first use)")
            export(kind, repository, ExportOptions(force=True))
    return repository


def with_server_onnxruntime(config: Any, threads: int, device: str) -> Any:
    """``config`` with the benchmark's intra-op threads and execution providers."""
    onnxruntime = replace(
        config.onnxruntime,
        intra_op_threads=threads,
        execution_providers=execution_providers(device),
    )
    return replace(config, onnxruntime=onnxruntime)


def device_batching(model: str, device: str, edits: dict[str, Any] | None = None) -> dict[str, Any]:
    """The batching fields ``model`` gets on ``device``: a setup's ``edits`` over, on CUDA,
    ``CUDA_BATCHING_EDITS``."""
    base = CUDA_BATCHING_EDITS.get(model, {}) if device == "cuda" else {}
    return {**base, **(edits or {})}


def setup_repository(
    source: Path, setup: str, models: tuple[str, ...], threads: int, device: str, root: Path
) -> tuple[Path, list[dict[str, Any]]]:
    """ROOT/SETUP: the models' entries with edited config.yaml, version folders symlinked.
    ``threads`` are divided among a setup's engine instances.

    Returns:
        The repository and one variant record per model (name, model, batching, onnxruntime,
        the server's frontend_workers).
    """
    target = root / setup
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    variants = []
    for model in models:
        edits = BATCHING_EDITS[setup].get(model)
        if edits is None:
            continue
        edits = device_batching(model, device, edits)
        engine_threads = max(1, threads // edits.get("instances", 1))
        runtime = ONNXRUNTIME_EDITS.get(setup, {})
        config = _write_entry(
            source / model, target / model, edits, engine_threads, device, runtime
        )
        variants.append(
            {
                "name": setup,
                "model": model,
                "batching": asdict(config.batching),
                "onnxruntime": {
                    "intra_op_threads": engine_threads,
                    "execution_providers": list(execution_providers(device)),
                    **runtime,
                },
                "edits": edits,
                "frontend_workers": FRONTEND_WORKERS.get(setup, 1),
            }
        )
    return target, variants


def _write_entry(
    entry: Path,
    target: Path,
    edits: dict[str, Any],
    threads: int,
    device: str,
    runtime: dict[str, Any],
) -> Any:
    """``target``: ``entry``'s config with ``edits`` to its batching and ``runtime`` to its
    onnxruntime section, its versions symlinked."""
    from contract.repository import read_model_config, version_dirs, write_model_config

    config: Any = read_model_config(entry)  # a classifier's or a generator's config
    if edits.get("decode_block"):
        with_decode_block(entry, BLOCK_STEPS)
    config = replace(config, batching=replace(config.batching, **edits))
    config = with_server_onnxruntime(config, threads, device)
    config = replace(config, onnxruntime=replace(config.onnxruntime, **runtime))
    target.mkdir()
    write_model_config(config, target)
    for version in version_dirs(entry):
        os.symlink((entry / str(version)).resolve(), target / str(version))
    return config


def server_process(repository: Path, frontend_workers: int = 1) -> ServeProcess:
    """``attnserve serve`` for the load generator: loopback, no metrics port, warnings only,
    ``frontend_workers`` gRPC frontend processes."""
    return ServeProcess(
        repository,
        "--frontend-workers",
        str(frontend_workers),
        "--host",
        "127.0.0.1",
        "--metrics-port",
        "-1",
        "--log-level",
        "WARNING",
        grace=2,
        keep_lines=200,
    )
