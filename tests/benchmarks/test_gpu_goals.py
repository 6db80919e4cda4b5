"""`bench serve --device cuda`: its GPU goals, loads and offline batches (evaluated on CPU-made
figures: the goals are arithmetic over a run's points, whatever device measured them)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.serve_goals import evaluate_goals
from benchmarks.serve_gpu_goals import GPU_VIT_IMAGES_PER_S
from benchmarks.serve_offline import offline_batches
from benchmarks.serve_settings import (
    CUDA_CONCURRENCY,
    CUDA_SETUPS,
    DEFAULT_CONCURRENCY,
    SETUPS,
    ServeSettings,
    default_client_processes,
    gpu_goal_loads,
    machine_setups,
)


def _closed(model: str, setup: str, method: str, concurrency: int, **fields: Any) -> dict:
    return {
        "model": model,
        "variant": setup,
        "method": method,
        "workload": "fixed",
        "loop": "closed",
        "concurrency": concurrency,
        **fields,
    }


def cuda_run() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """128-stream and 256-client points of three setups, and the offline batch-128 rate."""
    points = []
    for setup, tokens, images in (
        ("batching", 40_000.0, 6_000.0),
        ("two_frontends", 52_000.0, 11_000.0),
        ("instances", 45_000.0, 7_500.0),
    ):
        points.append(_closed("translator", setup, "translate_stream", 128, tokens_per_s=tokens))
        points.append(
            _closed("vit", setup, "classify", 256, throughput_rps=images, client_processes=4)
        )
    offline = {
        "translator": {
            "tokens_per_s": {"32": 20_000.0, "128": 64_000.0},
            "minimal_request_ms": {"p50": 1.5},
        },
        "vit": {
            "images_per_s": {"1": 1_000.0, "32": 30_000.0, "256": 100_000.0},
            "batch1_ms": {"p50": 1.0},
        },
    }
    return points, offline


def _gpu_goals(points: list[dict], offline: dict, device: str = "cuda") -> dict[str, dict]:
    return {
        g["name"]: g
        for g in evaluate_goals(points, offline, device=device)
        if "c128" in g["name"] or "c256" in g["name"]
    }


def test_the_streams_goal_is_the_served_share_of_the_offline_batch_128_rate() -> None:
    goals = _gpu_goals(*cuda_run())
    batching = goals["translator_served_vs_offline_c128[batching]"]
    assert batching["measured"] == pytest.approx(40_000 / 64_000, abs=1e-4)
    assert batching["target"] == 0.6 and batching["passed"] is True
    best = goals["translator_served_vs_offline_c128[best_workers]"]
    assert best["variant"] == "two_frontends" and best["target"] == 0.7
    assert best["measured"] == pytest.approx(52_000 / 64_000, abs=1e-4) and best["passed"]
    instances = goals["translator_served_vs_offline_c128[instances]"]
    assert instances["passed"] is True and instances["offline_tokens_per_s"] == 64_000.0


def test_the_vit_goal_is_absolute_images_per_second_at_256_clients() -> None:
    goals = _gpu_goals(*cuda_run())
    assert goals["vit_images_per_s_c256[batching]"]["passed"] is False
    assert goals["vit_images_per_s_c256[batching]"]["gap"] == GPU_VIT_IMAGES_PER_S - 6_000
    assert goals["vit_images_per_s_c256[batching]"]["client_processes"] == 4
    best = goals["vit_images_per_s_c256[best_workers]"]
    assert best["variant"] == "two_frontends" and best["measured"] == 11_000.0
    assert best["passed"] is True


def test_more_frontends_count_for_the_best_workers_when_measured() -> None:
    points, offline = cuda_run()
    points.append(_closed("vit", "four_frontends", "classify", 256, throughput_rps=14_000.0))
    points.append(
        _closed("translator", "eight_frontends", "translate_stream", 128, tokens_per_s=56_000.0)
    )
    goals = _gpu_goals(points, offline)
    vit = goals["vit_images_per_s_c256[best_workers]"]
    assert (vit["variant"], vit["measured"], vit["passed"]) == ("four_frontends", 14_000.0, True)
    assert goals["vit_images_per_s_c256[four_frontends]"]["measured"] == 14_000.0
    streams = goals["translator_served_vs_offline_c128[best_workers]"]
    assert streams["variant"] == "eight_frontends"
    assert streams["measured"] == pytest.approx(56_000 / 64_000, abs=1e-4)
    assert "4 or 8" in streams["goal"]


def test_wide_frontend_setups_need_two_cpus_per_frontend() -> None:
    base = ("batching", "two_frontends", "instances", "stream_interval")
    assert gpu_goal_loads(2)["setups"] == gpu_goal_loads(7)["setups"] == base
    assert gpu_goal_loads(8)["setups"] == (*base, "four_frontends")
    eight = ("eight_frontends", "eight_frontends_overlap", "eight_frontends_block")
    assert gpu_goal_loads(16)["setups"] == (*base, "four_frontends", *eight)
    wide = ("four_frontends", *eight)
    assert machine_setups(SETUPS, 2) == tuple(s for s in SETUPS if s not in (*wide, *CUDA_SETUPS))
    assert machine_setups(SETUPS, 2, "cuda") == tuple(s for s in SETUPS if s not in wide)
    assert machine_setups(SETUPS, 64, "cuda") == SETUPS
    assert ServeSettings().setups == machine_setups(SETUPS)


def test_a_cpu_run_has_no_gpu_goals() -> None:
    assert _gpu_goals(*cuda_run(), device="cpu") == {}


def test_a_cuda_run_without_the_loads_says_they_were_not_measured() -> None:
    points, offline = cuda_run()
    only_c32 = [{**p, "concurrency": 32} for p in points]
    goals = _gpu_goals(only_c32, offline)
    assert set(goals) == {
        "translator_served_vs_offline_c128[batching]",
        "translator_served_vs_offline_c128[best_workers]",
        "vit_images_per_s_c256[batching]",
        "vit_images_per_s_c256[best_workers]",
    }
    assert all(g["measured"] is None and g["passed"] is None for g in goals.values())


def test_cuda_runs_add_the_gpu_loads_and_offline_batches() -> None:
    cuda = ServeSettings(device="cuda")
    assert cuda.concurrency == CUDA_CONCURRENCY and {128, 256} <= set(cuda.concurrency)
    assert ServeSettings().concurrency == DEFAULT_CONCURRENCY
    assert ServeSettings(device="cuda", concurrency=(1, 8)).concurrency == (1, 8)
    assert 128 in offline_batches(cuda) and max(offline_batches(cuda)) == 256
    assert offline_batches(ServeSettings(concurrency=(1, 64, 128))) == [1, 32, 64]  # CPU: <= 64


def test_client_processes_default_to_the_machine_and_are_checked() -> None:
    assert [default_client_processes(n) for n in (1, 2, 7, 8, 16, 64)] == [1, 1, 1, 2, 4, 8]
    assert ServeSettings(client_processes=3).client_processes == 3
    assert ServeSettings().client_processes == default_client_processes()
    with pytest.raises(ValueError, match="client-processes"):
        ServeSettings(client_processes=0).check()
