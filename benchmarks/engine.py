"""`attnserve bench engine`: fixed-length greedy decoding of one random Marian model, every engine.

The model (``benchmarks.marian``: Marian-base shape, random weights, Hugging Face format) is built
once into the cache; every engine loads those weights:

- attnserve: our ONNX export of it (``export.exporter.export`` of ``load_hf_directory``), fp32 and
  int8, driven by ``Seq2SeqRunner.encode`` / ``step`` with EOS suppressed (``fixed_greedy``);
- CTranslate2 fp32 and int8, converted from the same directory, at each inter x intra thread
  split that uses the thread budget (the best split is what ratios compare against);
- Hugging Face ``generate`` with and without the KV cache.

Every engine decodes the same (batch, source) token ids into exactly ``new_tokens`` tokens. Per
batch size: one warm-up run per engine, then ``repetitions`` rounds in which every engine runs once
(interleaved, the starting engine rotating), so machine noise hits all engines alike. Medians of
the rounds give new tokens/s, ms per decode step (whole batch, encoder time amortised), achieved
GFLOP/s and the fraction of the fp32 matmul peak measured in the same run.

The pieces: ``engine_settings`` (what a run measures), ``runners`` (what to run, each engine in
its own process), ``attnserve_runner`` and ``peers`` (the engines), ``engine_timing`` (warm-ups,
interleaved rounds, the noise check), ``engine_figures`` (rates, ratios, summary), ``machine``
(machine facts, CPU noise gauge), ``output`` (log lines, the JSON file). This module runs them.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine_figures import derive, summary
from benchmarks.engine_goals import engine_goals
from benchmarks.engine_settings import EngineSettings
from benchmarks.engine_timing import bench_batch
from benchmarks.machine import cpu_snapshot, foreign_cpu_share, load_average, machine_metadata
from benchmarks.marian import build_marian, default_cache, source_ids
from benchmarks.output import log, timestamp, write_result
from benchmarks.peers import Runner, ctranslate2_available
from benchmarks.runners import build_runners
from benchmarks.schema import ENGINE_SCHEMA_ID, BenchError


def run_engine_bench(settings: EngineSettings, cache: Path | None = None) -> dict[str, Any]:
    """Run the engine benchmark and return its result document (not yet written)."""
    from benchmarks import roofline

    settings.check()
    cache = Path(cache) if cache is not None else default_cache()
    started = time.perf_counter()
    snapshot = cpu_snapshot()
    machine = machine_metadata(settings.device)
    if settings.device == "cuda":
        _require_some_cuda()
    log(f"building the random Marian model ({settings.shape.key()}) in {cache}")
    marian_dir = build_marian(cache, settings.shape)
    runners, skipped = build_runners(settings, marian_dir, cache)
    if not runners:
        raise BenchError(
            "no engine can run here: " + "; ".join(f"{s['engine']}: {s['reason']}" for s in skipped)
        )
    log("measuring the fp32 matmul peak and memory bandwidth")
    peak_before = roofline.measure(settings.threads, settings.device, settings.tiny)
    rows, failed = time_batches(settings, runners)
    peak_after = roofline.measure(settings.threads, settings.device, settings.tiny)
    for runner in runners:
        runner.close()
    peak = max(peak_before["matmul"]["gflops"], peak_after["matmul"]["gflops"])
    derive(rows, settings, peak)
    machine["load_average_end"] = load_average()
    machine["foreign_cpu_share"] = foreign_cpu_share(snapshot)
    document = {
        "schema": ENGINE_SCHEMA_ID,
        "kind": "engine",
        "run_id": timestamp(),
        "machine": machine,
        "settings": _settings_record(settings),
        "model": _model_record(settings, marian_dir),
        "roofline": {"matmul_peak_gflops": peak, "before": peak_before, "after": peak_after},
        "engines": [_engine_record(runner, failed) for runner in runners],
        "skipped": skipped,
        "results": rows,
        "summary": summary(rows, settings),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    document["goals"] = engine_goals(document)
    return document


def time_batches(
    settings: EngineSettings, runners: list[Runner]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every batch size's result rows, and the engines that failed (name -> error)."""
    rng = np.random.default_rng(settings.seed)
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for batch in settings.batches:
        ids = source_ids(rng, batch, settings.source_length, settings.shape)
        rows += bench_batch(settings, runners, ids, failed)
    return rows, failed


def _require_some_cuda() -> None:
    """Raise BenchError unless torch, onnxruntime or CTranslate2 can use CUDA here."""
    reasons = []
    try:
        import torch

        if torch.cuda.is_available():
            return
        reasons.append("torch.cuda.is_available() is False")
    except ImportError:
        reasons.append("torch is not installed")
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return
    reasons.append("onnxruntime has no CUDAExecutionProvider")
    reason = ctranslate2_available("cuda")
    if reason is None:
        return
    reasons.append(reason)
    raise BenchError(
        "--device cuda: CUDA is not available on this machine (" + "; ".join(reasons) + ")"
    )


def _settings_record(settings: EngineSettings) -> dict[str, Any]:
    record = asdict(settings)
    record.pop("shape")
    record["batches"] = list(settings.batches)
    record["engines"] = list(settings.engines)
    record["precisions"] = list(settings.precisions)
    return record


def _model_record(settings: EngineSettings, marian_dir: Path) -> dict[str, Any]:
    shape = settings.shape
    return {
        "hf_directory": str(marian_dir),
        "shape": asdict(shape),
        "shape_key": shape.key(),
        "flops_per_sequence": shape.flops_per_sequence(settings.source_length, settings.new_tokens),
        "decoder_flops_per_token": shape.decoder_flops_per_token(),
        "decoder_weight_bytes_fp32": shape.weight_bytes_fp32(),
    }


def _engine_record(runner: Runner, failed: dict[str, str]) -> dict[str, Any]:
    return {
        "name": runner.name,
        "family": runner.family,
        "precision": runner.precision,
        "label": runner.label,
        "config": runner.config,
        "error": failed.get(runner.name),
    }


# --- entry point used by the CLI ----------------------------------------------------------------


def main(settings: EngineSettings, out_dir: Path, cache: Path | None, plots: bool = True) -> Path:
    """Run, validate, write the JSON (and PNGs); return the JSON path."""
    result = run_engine_bench(settings, cache)
    if plots:
        from benchmarks.plots import engine_plots

        result["plots"] = [p.name for p in engine_plots(result, out_dir)]
    path = write_result(result, out_dir, "engine")
    log(f"wrote {path}")
    return path
