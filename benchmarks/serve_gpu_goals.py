"""The GPU serving goals of `attnserve bench serve --device cuda` (runs on CUDA only).

- ``translator_served_vs_offline_c128[SETUP]``: 128 concurrent translation streams on a CUDA
  repository reach >= 60% of the engine's offline batch-128 new tokens/s (same run);
- ``translator_served_vs_offline_c128[best_workers]``: the best of ``batching``,
  ``two_frontends`` and ``instances`` reaches >= 70% of it;
- ``vit_images_per_s_c256[SETUP]``: the ViT served one image per request at 256 concurrent
  clients, >= 10,000 images/s; ``[best_workers]``: the best of the same three setups.

At these loads one client event loop would be the ceiling, so the run spreads its clients over
``client_processes`` processes (``loadgen_processes``).
"""

from __future__ import annotations

from typing import Any

from benchmarks.serve_goals import WORKER_SETUPS, find_point, goal_record
from benchmarks.serve_settings import GPU_STREAMS, GPU_VIT_CLIENTS, SETUPS

GPU_SERVED_OF_OFFLINE = 0.60  # 128 streams >= 60% of the offline batch-128 rate, each setup
GPU_BEST_WORKERS_OF_OFFLINE = 0.70  # ... and >= 70% with the best worker setup
GPU_VIT_IMAGES_PER_S = 10_000.0  # the ViT at 256 clients, one image per request


def gpu_goals(
    points: list[dict[str, Any]], offline: dict[str, Any], device: str
) -> list[dict[str, Any]]:
    """The GPU goals of a run on ``device`` (none unless it is cuda)."""
    if device != "cuda":
        return []
    goals: list[dict[str, Any]] = []
    translator = offline.get("translator")
    if translator is not None:
        goals += _streams_goals(points, translator["tokens_per_s"].get(str(GPU_STREAMS)))
    if offline.get("vit") is not None:
        goals += _vit_goals(points)
    return goals


def _closed(points: list[dict[str, Any]], model: str, method: str, setup: str, c: int) -> Any:
    return find_point(
        points, model=model, variant=setup, method=method, loop="closed", concurrency=c
    )


def _best(goals: list[dict[str, Any]]) -> tuple[str | None, float | None]:
    """(setup, measured) of the best measured goal among the worker setups."""
    measured = {
        g["variant"]: g["measured"]
        for g in goals
        if g["variant"] in WORKER_SETUPS and g["measured"] is not None
    }
    if not measured:
        return None, None
    setup = max(measured, key=measured.__getitem__)
    return setup, measured[setup]


def _streams_goals(points: list[dict[str, Any]], offline_rate: float | None) -> list[dict]:
    name = f"translator_served_vs_offline_c{GPU_STREAMS}"
    goals = []
    for setup in SETUPS:
        served = _closed(points, "translator", "translate_stream", setup, GPU_STREAMS)
        if served is None and setup != "batching":
            continue
        rate = served.get("tokens_per_s") if served else None
        goals.append(
            goal_record(
                f"{name}[{setup}]",
                f"{GPU_STREAMS} concurrent translation streams on CUDA: served new tokens/s "
                f">= {GPU_SERVED_OF_OFFLINE:.0%} of the engine's offline batch-{GPU_STREAMS} "
                "rate (same run)",
                rate / offline_rate if rate and offline_rate else None,
                GPU_SERVED_OF_OFFLINE,
                True,
                "fraction",
                variant=setup,
                served_tokens_per_s=rate,
                offline_tokens_per_s=offline_rate,
            )
        )
    setup, best = _best(goals)
    goals.append(
        goal_record(
            f"{name}[best_workers]",
            f"{GPU_STREAMS} concurrent translation streams on CUDA with the best workers (1 or "
            "2 frontend processes, or 2 engine instances): served new tokens/s >= "
            f"{GPU_BEST_WORKERS_OF_OFFLINE:.0%} of the engine's offline batch-{GPU_STREAMS} rate",
            best,
            GPU_BEST_WORKERS_OF_OFFLINE,
            True,
            "fraction",
            variant=setup,
        )
    )
    return goals


def _vit_goals(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    name = f"vit_images_per_s_c{GPU_VIT_CLIENTS}"
    goals = []
    for setup in SETUPS:
        served = _closed(points, "vit", "classify", setup, GPU_VIT_CLIENTS)
        if served is None and setup != "batching":
            continue
        goals.append(
            goal_record(
                f"{name}[{setup}]",
                f"the ViT on CUDA at {GPU_VIT_CLIENTS} concurrent clients, one image per "
                f"request: >= {GPU_VIT_IMAGES_PER_S:,.0f} images/s served",
                served["throughput_rps"] if served else None,
                GPU_VIT_IMAGES_PER_S,
                True,
                "images/s",
                variant=setup,
                client_processes=served.get("client_processes") if served else None,
            )
        )
    setup, best = _best(goals)
    goals.append(
        goal_record(
            f"{name}[best_workers]",
            f"the ViT on CUDA at {GPU_VIT_CLIENTS} concurrent clients with the best workers "
            f"(1 or 2 frontend processes, or 2 instances): >= {GPU_VIT_IMAGES_PER_S:,.0f} "
            "images/s served",
            best,
            GPU_VIT_IMAGES_PER_S,
            True,
            "images/s",
            variant=setup,
        )
    )
    return goals
