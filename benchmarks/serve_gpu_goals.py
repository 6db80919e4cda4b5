"""The GPU serving goals of `attnserve bench serve --device cuda` (runs on CUDA only).

- ``translator_served_vs_offline_c128[SETUP]``: 128 concurrent translation streams on a CUDA
  repository reach >= 60% of the engine's offline batch-128 new tokens/s (same run);
- ``translator_served_vs_offline_c128[best_workers]``: the best of ``batching``,
  ``two_frontends``, ``instances`` and, where measured, ``four_frontends`` and
  ``eight_frontends`` reaches >= 70% of it;
- ``vit_images_per_s_c256[SETUP]``: the ViT served one image per request at 256 concurrent
  clients, >= 10,000 images/s; ``[best_workers]``: the best of the same three setups.

At these loads one client event loop would be the ceiling, so the run spreads its clients over
``client_processes`` processes (``loadgen_processes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.serve_goals import (
    WORKER_SETUPS,
    WORKERS_TEXT,
    find_point,
    goal_record,
    served_vs_offline_goal,
)
from benchmarks.serve_settings import GPU_STREAMS, GPU_VIT_CLIENTS, SETUPS

GPU_SERVED_OF_OFFLINE = 0.60  # 128 streams >= 60% of the offline batch-128 rate, each setup
GPU_BEST_WORKERS_OF_OFFLINE = 0.70  # ... and >= 70% with the best worker setup
GPU_VIT_IMAGES_PER_S = 10_000.0  # the ViT at 256 clients, one image per request
WHICH = WORKERS_TEXT


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


def _per_setup(
    points: list[dict[str, Any]],
    model: str,
    method: str,
    concurrency: int,
    record: Callable[[str, dict[str, Any] | None], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``record(setup, point)`` for each setup the run measured (``batching`` always: a run
    without its point says so)."""
    goals = []
    for setup in SETUPS:
        served = _closed(points, model, method, setup, concurrency)
        if served is not None or setup == "batching":
            goals.append(record(setup, served))
    return goals


def _and_best(
    goals: list[dict[str, Any]], name: str, goal: str, target: float, unit: str
) -> list[dict[str, Any]]:
    """``goals`` and the ``[best_workers]`` goal: the best of the worker setups' figures."""
    setup, best = _best(goals)
    best_goal = goal_record(f"{name}[best_workers]", goal, best, target, True, unit, variant=setup)
    return [*goals, best_goal]


def _streams_goals(points: list[dict[str, Any]], offline_rate: float | None) -> list[dict]:
    name = f"translator_served_vs_offline_c{GPU_STREAMS}"
    share = f"of the engine's offline batch-{GPU_STREAMS} rate (same run)"

    def record(setup: str, served: dict[str, Any] | None) -> dict[str, Any]:
        return served_vs_offline_goal(
            setup, served, offline_rate, GPU_STREAMS, GPU_SERVED_OF_OFFLINE, " on CUDA"
        )

    goals = _per_setup(points, "translator", "translate_stream", GPU_STREAMS, record)
    return _and_best(
        goals,
        name,
        f"{GPU_STREAMS} concurrent translation streams on CUDA with the best workers ({WHICH}): "
        f"served new tokens/s >= {GPU_BEST_WORKERS_OF_OFFLINE:.0%} {share}",
        GPU_BEST_WORKERS_OF_OFFLINE,
        "fraction",
    )


def _vit_goals(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    name = f"vit_images_per_s_c{GPU_VIT_CLIENTS}"
    target = f">= {GPU_VIT_IMAGES_PER_S:,.0f} images/s served"

    def record(setup: str, served: dict[str, Any] | None) -> dict[str, Any]:
        return goal_record(
            f"{name}[{setup}]",
            f"the ViT on CUDA at {GPU_VIT_CLIENTS} concurrent clients, one image per request: "
            + target,
            served["throughput_rps"] if served else None,
            GPU_VIT_IMAGES_PER_S,
            True,
            "images/s",
            variant=setup,
            client_processes=served.get("client_processes") if served else None,
        )

    goals = _per_setup(points, "vit", "classify", GPU_VIT_CLIENTS, record)
    return _and_best(
        goals,
        name,
        f"the ViT on CUDA at {GPU_VIT_CLIENTS} concurrent clients with the best workers "
        f"({WHICH}): {target}",
        GPU_VIT_IMAGES_PER_S,
        "images/s",
    )
