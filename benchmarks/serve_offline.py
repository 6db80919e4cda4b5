"""Offline references for `attnserve bench serve`: the engines alone, no server, same settings.

Measured in the benchmark's own process with the server's ONNX Runtime settings, before and
after the load (``merge_offline`` averages the two): the translator's fixed-length greedy
tokens/s per batch size and its minimal request's engine time (encode + one decoder step), and
the ViT's onnxruntime images/s at batch 1 and 32 (on CUDA also 256). The goals compare served
figures against them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attnserve_runner import fixed_greedy
from benchmarks.serve_settings import GOAL_CONCURRENCY, GPU_VIT_CLIENTS, ServeSettings
from benchmarks.serve_setups import BATCHING_EDITS, device_batching, with_server_onnxruntime


def measure_offline(
    repository: Path,
    models: tuple[str, ...],
    settings: ServeSettings,
    language: str,
    image: bytes,
) -> dict[str, Any]:
    """The offline figures of the ``models`` in ``repository`` (translator, vit)."""
    figures: dict[str, Any] = {}
    if "translator" in models:
        figures["translator"] = offline_translator(repository / "translator", settings, language)
    if "vit" in models:
        figures["vit"] = offline_vit(repository / "vit", settings, image)
    return figures


def served_config(entry: Path, threads: int, device: str) -> Any:
    """``entry``'s config as the setups' servers run it: their ONNX Runtime threads and providers
    and, on CUDA, their GPU batching (cache rows for the largest offline batch)."""
    from contract.repository import read_model_config

    config = with_server_onnxruntime(read_model_config(entry), threads, device)
    edits = device_batching(entry.name, device)
    return replace(config, batching=replace(config.batching, **edits))


def served_model(entry: Path, threads: int, device: str) -> Any:
    """The served model of ``entry`` with the server's ONNX Runtime settings (not started)."""
    from contract.repository import resolve_version
    from serving.repository import make_backend
    from serving.served import serve

    config = served_config(entry, threads, device)
    version_dir = resolve_version(entry)
    return serve(config, version_dir, make_backend(config, version_dir))


def offline_translator(entry: Path, settings: ServeSettings, language: str) -> dict[str, Any]:
    """Fixed-length greedy tokens/s per batch (``offline_batches``) and the minimal request's
    engine time (also per engine thread count of the measured setups:
    ``minimal_request_ms_by_threads``)."""
    model = served_model(entry, settings.threads, settings.device)
    ids = model.source_ids(settings.text, language)[None, :]
    decode = partial(_decode_with, model)
    result: dict[str, Any] = {
        "source_tokens": int(ids.shape[1]),
        "new_tokens": settings.new_tokens,
        "tokens_per_s": {},
        "runs_s": {},
    }
    for batch in offline_batches(settings):
        batch_ids = np.repeat(ids, batch, axis=0)
        rate, times = _median_rate(
            partial(decode, batch_ids, settings.new_tokens),
            batch * settings.new_tokens,
            settings.offline_repetitions,
        )
        result["tokens_per_s"][str(batch)] = round(rate, 2)
        result["runs_s"][str(batch)] = [round(t, 5) for t in times]
    result["threads"] = settings.threads
    result["minimal_request_ms"] = _minimal_request(partial(decode, ids, 1), settings, model)
    by_threads = {str(settings.threads): result["minimal_request_ms"]}
    for threads in sorted(setup_engine_threads(settings) - {settings.threads}):
        one = served_model(entry, threads, settings.device)  # an engine instance's own threads
        by_threads[str(threads)] = _minimal_request(
            partial(_decode_with, one, ids, 1), settings, one
        )
    result["minimal_request_ms_by_threads"] = by_threads
    return result


def offline_batches(settings: ServeSettings) -> list[int]:
    """The translator's offline batch sizes: 1, the goal's and the measured concurrencies up
    to 64 (on CUDA up to 256, which covers the GPU goal's 128 streams)."""
    limit = GPU_VIT_CLIENTS if settings.device == "cuda" else 64
    return sorted({1, GOAL_CONCURRENCY, *[c for c in settings.concurrency if c <= limit]})


def setup_engine_threads(settings: ServeSettings) -> set[int]:
    """The intra-op threads of one translator engine in each measured setup (the threads are
    divided among a setup's engine instances)."""
    return {
        max(1, settings.threads // BATCHING_EDITS[setup]["translator"].get("instances", 1))
        for setup in settings.setups
        if "translator" in BATCHING_EDITS[setup]
    }


def _decode_with(model: Any, batch_ids: np.ndarray, new_tokens: int) -> None:
    runner, cache, spec = model.engine.runner, model.engine.cache, model.config.decoder
    encoded = runner.encode({"input_ids": batch_ids, "attention_mask": np.ones_like(batch_ids)})
    fixed_greedy(cache, encoded, spec, new_tokens, [spec.eos_id])


def _minimal_request(minimal: Callable[[], None], settings: ServeSettings, model: Any) -> dict:
    samples = _minimal_request_times(minimal, settings.overhead_s)
    return {
        "p50": round(float(np.percentile(samples, 50)) * 1000, 4),
        "mean": round(float(np.mean(samples)) * 1000, 4),
        "samples": len(samples),
        "what": "encode + one decoder step at batch 1 (the served KV cache, server's ORT options)",
        "kv_cache": model.kv_cache,
    }


def _median_rate(
    fn: Callable[[], None], work: float, repetitions: int
) -> tuple[float, list[float]]:
    """(``work`` per second of the median timed call, the call times) after one warm-up."""
    fn()  # warm-up
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return work / statistics.median(times), times


def _minimal_request_times(minimal: Callable[[], None], overhead_s: float) -> list[float]:
    """Seconds per call of ``minimal`` over half of ``overhead_s`` (>= 0.5 s, >= 20 calls)."""
    minimal()  # warm-up
    samples: list[float] = []
    stop = time.perf_counter() + max(0.5, overhead_s / 2)
    while time.perf_counter() < stop or len(samples) < 20:
        t0 = time.perf_counter()
        minimal()
        samples.append(time.perf_counter() - t0)
    return samples


def offline_vit(entry: Path, settings: ServeSettings, image: bytes) -> dict[str, Any]:
    """onnxruntime images/s at batch 1 and 32 (on CUDA also 256) on the server's preprocessed
    pixels."""
    model = served_model(entry, settings.threads, settings.device)
    pixels = model.image_pixels(image)
    result: dict[str, Any] = {"images_per_s": {}, "runs_s": {}}
    batches = (1, GOAL_CONCURRENCY, *((GPU_VIT_CLIENTS,) if settings.device == "cuda" else ()))
    for batch in batches:
        batch_pixels = np.repeat(pixels[None], batch, axis=0)

        def call(batch_pixels: np.ndarray = batch_pixels) -> None:
            model.backend.run("model", {"pixel_values": batch_pixels})

        times = _call_times(call, 0.3 if settings.tiny else 2.0)
        result["images_per_s"][str(batch)] = round(batch / statistics.median(times), 2)
        result["runs_s"][str(batch)] = len(times)
        if batch == 1:
            result["batch1_ms"] = {
                "p50": round(float(np.percentile(times, 50)) * 1000, 4),
                "mean": round(float(np.mean(times)) * 1000, 4),
            }
    return result


def _call_times(call: Callable[[], None], seconds: float) -> list[float]:
    """Seconds per call of ``call`` for ``seconds`` (at least 5 calls) after one warm-up."""
    call()
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < 5:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def merge_offline(first: dict[str, Any], second: dict[str, Any], key: str) -> dict[str, Any]:
    """Offline figures measured before and after the load: the mean of the two medians."""
    merged = dict(first)
    merged[key] = {
        b: round((first[key][b] + second[key][b]) / 2, 2) for b in first[key] if b in second[key]
    }
    merged["before"] = first[key]
    merged["after"] = second[key]
    for name in ("minimal_request_ms", "batch1_ms"):
        if name in first and name in second:
            merged[name] = _merged_p50(first[name], second[name])
    by_threads = "minimal_request_ms_by_threads"
    if by_threads in first and by_threads in second:
        merged[by_threads] = {
            t: _merged_p50(first[by_threads][t], second[by_threads][t])
            for t in first[by_threads]
            if t in second[by_threads]
        }
    return merged


def _merged_p50(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    merged = dict(first)
    merged["p50"] = round((first["p50"] + second["p50"]) / 2, 4)
    merged["before_p50"] = first["p50"]
    merged["after_p50"] = second["p50"]
    return merged
