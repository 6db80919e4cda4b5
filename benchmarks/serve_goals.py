"""The serving goals of `attnserve bench serve`, each with its measured figure and pass / fail.

A goal's target is a figure with its source, measured in the same run: the engines' offline
rates of ``serve_offline`` here, the Triton peer and the load generator in ``serve_peer_goals``.
Goal ids (``name``) are stable: `attnserve bench report` reads older results.

- ``translator_served_vs_offline_c32[SETUP]``: 32 concurrent translation streams reach >= 85%
  of the engine's offline batch-32 new tokens/s;
- ``translator_served_vs_offline_c32[best_frontend_workers]`` (runs that measured the
  ``two_frontends`` setup): the better of 1 and 2 frontend processes reaches >= 60% of it;
  ``[best_workers]`` (runs that also measured ``instances``): the best of those, of two engine
  instances behind one frontend and, where measured, of 4 and 8 frontend processes;
- ``overhead_p50_ms[translate]`` (``[translate,two_frontends]``, ``[translate,instances]``) and
  ``overhead_p50_ms[classify,SETUP]``: per-request gRPC + scheduling overhead <= 1 ms p50 at
  concurrency 1;
- ``vit_c32_vs_ort_b32[SETUP]``: the ViT at concurrency 32 >= 90% of onnxruntime's own
  batch-32 images/s;
- on CUDA, the GPU goals of ``serve_gpu_goals`` (128 streams, the ViT at 256 clients);
- the same-run Triton and perf_analyzer goals of ``serve_peer_goals``.

Retired: ``vit_c1_images_per_s[SETUP]`` (results before 2026-11-23), a target copied from a
Triton run of another day; the same-run ``vit_vs_triton_c1[kserve]`` replaces it.
"""

from __future__ import annotations

from typing import Any

from benchmarks.serve_settings import (
    BASE_WORKER_SETUPS,
    FRONTEND_WORKERS,
    GOAL_CONCURRENCY,
    INSTANCES,
    OVERHEAD_SETUPS,
    SETUPS,
    WIDE_FRONTENDS,
)
from benchmarks.serve_setups import BATCHING_EDITS

RETIRED_GOALS = ("vit_c1_images_per_s[batching]", "vit_c1_images_per_s[no_batching]")
VIT_C32_OF_ORT = 0.90  # goal: >= 90% of onnxruntime's batch-32 rate at concurrency 32
SERVED_OF_OFFLINE = 0.85  # goal: 32 streams >= 85% of the engine's offline batch-32 rate
BEST_WORKERS_OF_OFFLINE = 0.60  # goal: the same with the better frontend_workers (1 or 2)
# setup -> (frontend_workers, the translator's engine instances)
WORKER_SETUPS = {
    setup: (FRONTEND_WORKERS.get(setup, 1), INSTANCES.get(setup, 1))
    for setup in (*BASE_WORKER_SETUPS, *WIDE_FRONTENDS)
}
WORKERS_TEXT = (
    "1, 2 (or, measured on larger machines, 4 or 8) frontend processes, or 2 engine instances"
)
# goal id suffix -> (the setups it needs measured, those it also takes when measured, how the
# goal names them)
BEST_OF = {
    "best_frontend_workers": (
        ("batching", "two_frontends"),
        (),
        "the better frontend_workers (1 or 2)",
    ),
    "best_workers": (
        BASE_WORKER_SETUPS,
        tuple(WIDE_FRONTENDS),
        f"the best workers ({WORKERS_TEXT})",
    ),
}
OVERHEAD_MS = 1.0  # goal: per-request gRPC + scheduling overhead <= 1 ms p50


def evaluate_goals(
    points: list[dict[str, Any]],
    offline: dict[str, Any],
    sections: dict[str, Any] | None = None,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """The serving goals, each with the measured figure, the target and pass / fail.

    Args:
        points: the run's load points.
        offline: its offline references.
        sections: its ``triton`` and ``perf_analyzer`` sections (older results have none).
        device: the run's device; on cuda the GPU goals of ``serve_gpu_goals`` come too.

    Returns:
        One record per goal (see ``goal_record``).
    """
    from benchmarks.serve_gpu_goals import gpu_goals
    from benchmarks.serve_peer_goals import peer_goals

    goals = []
    translator = offline.get("translator")
    if translator is not None:
        goals += translator_goals(points, translator)
    vit = offline.get("vit")
    if vit is not None:
        goals += vit_goals(points, vit)
    return goals + gpu_goals(points, offline, device) + peer_goals(points, sections)


def find_point(points: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The first load point whose fields equal ``match``."""
    for p in points:
        if all(p.get(k) == v for k, v in match.items()):
            return p
    return None


def goal_record(
    name: str,
    goal: str,
    measured: float | None,
    target: float,
    at_least: bool,
    unit: str,
    **details: Any,
) -> dict[str, Any]:
    """A goal's result entry: passed when ``measured`` >= ``target`` (``at_least``) or <=."""
    if measured is None:
        return {
            "name": name,
            "goal": goal,
            "measured": None,
            "target": target,
            "unit": unit,
            "passed": None,
            "gap": None,
            "margin": None,
            "note": "not measured in this run",
            **details,
        }
    margin = measured - target if at_least else target - measured
    return {
        "name": name,
        "goal": goal,
        "measured": round(measured, 4),
        "target": round(target, 4),
        "unit": unit,
        "passed": margin >= 0,
        "margin": round(margin, 4),
        "gap": round(max(0.0, -margin), 4),
        **details,
    }


# --- the translator -----------------------------------------------------------------------------


def translator_goals(
    points: list[dict[str, Any]], translator: dict[str, Any]
) -> list[dict[str, Any]]:
    """Served vs offline throughput per setup, then the unary request's overhead."""
    offline_rate = translator["tokens_per_s"].get(str(GOAL_CONCURRENCY))
    goals = []
    for setup in SETUPS:
        served = find_point(
            points,
            model="translator",
            variant=setup,
            method="translate_stream",
            loop="closed",
            concurrency=GOAL_CONCURRENCY,
        )
        if served is None and setup != "batching":
            continue
        goals.append(served_vs_offline_goal(setup, served, offline_rate))
    for name in BEST_OF:
        best = best_workers_goal(goals, name)
        if best is not None:
            goals.append(best)
    for setup in OVERHEAD_SETUPS:
        minimal = find_point(points, model="translator", workload="minimal", variant=setup)
        if minimal is None and setup != "batching":
            continue
        goals.append(translate_overhead_goal(minimal, setup_engine_ms(translator, setup), setup))
    return goals


def setup_engine_ms(translator: dict[str, Any], setup: str) -> float:
    """The minimal request's engine time with the intra-op threads one engine of ``setup`` has
    (results before ``minimal_request_ms_by_threads`` have only the full thread count's)."""
    instances = BATCHING_EDITS[setup]["translator"].get("instances", 1)
    by_threads = translator.get("minimal_request_ms_by_threads", {})
    threads = max(1, translator.get("threads", 0) // instances)
    return by_threads.get(str(threads), translator["minimal_request_ms"])["p50"]


def served_vs_offline_goal(
    setup: str,
    served: dict[str, Any] | None,
    offline_rate: float | None,
    streams: int = GOAL_CONCURRENCY,
    target: float = SERVED_OF_OFFLINE,
    where: str = "",
) -> dict[str, Any]:
    """``streams`` concurrent streams' served new tokens/s as a share of the offline rate at that
    batch (``where``: e.g. " on CUDA")."""
    served_rate = served.get("tokens_per_s") if served else None
    return goal_record(
        f"translator_served_vs_offline_c{streams}[{setup}]",
        f"{streams} concurrent translation streams{where}: served new tokens/s "
        f">= {target:.0%} of the engine's offline batch-{streams} rate",
        served_rate / offline_rate if served_rate and offline_rate else None,
        target,
        True,
        "fraction",
        variant=setup,
        served_tokens_per_s=served_rate,
        offline_tokens_per_s=offline_rate,
    )


def best_workers_goal(served_goals: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """Goal ``[name]`` of ``BEST_OF``: the best of its setups' served / offline fractions; None
    when the run did not measure all of the setups it needs."""
    needed, optional, which = BEST_OF[name]
    if not set(needed) <= {g["variant"] for g in served_goals}:
        return None
    by_setup = {g["variant"]: g for g in served_goals if g["variant"] in (*needed, *optional)}
    measured = {s: g["measured"] for s, g in by_setup.items() if g["measured"] is not None}
    setup = max(measured, key=measured.__getitem__) if measured else None
    workers, instances = WORKER_SETUPS[setup] if setup else (None, None)
    return goal_record(
        f"translator_served_vs_offline_c{GOAL_CONCURRENCY}[{name}]",
        f"{GOAL_CONCURRENCY} concurrent translation streams with {which}: served new tokens/s "
        f">= {BEST_WORKERS_OF_OFFLINE:.0%} of the engine's offline batch-{GOAL_CONCURRENCY} rate",
        measured[setup] if setup else None,
        BEST_WORKERS_OF_OFFLINE,
        True,
        "fraction",
        variant=setup,
        frontend_workers=workers,
        instances=instances,
    )


def translate_overhead_goal(
    minimal: dict[str, Any] | None, engine_ms: float, setup: str = "batching"
) -> dict[str, Any]:
    """Client latency of a 1-token Translate minus the engine's own time for it."""
    client_ms = minimal["latency_ms"]["p50"] if minimal else None
    server_ms = (minimal.get("server_total_ms") or {}).get("p50") if minimal else None
    return goal_record(
        "overhead_p50_ms[translate]"
        if setup == "batching"
        else f"overhead_p50_ms[translate,{setup}]",
        f"per-request gRPC + scheduling overhead <= {OVERHEAD_MS:g} ms p50: unary "
        "Translate of one text with 1 new token at concurrency 1, client latency minus "
        "the engine's own time for it (encode + one decoder step)",
        client_ms - engine_ms if client_ms is not None else None,
        OVERHEAD_MS,
        False,
        "ms",
        variant=setup,
        client_p50_ms=client_ms,
        engine_p50_ms=engine_ms,
        server_total_p50_ms=server_ms,
        grpc_p50_ms=round(client_ms - server_ms, 4) if client_ms and server_ms else None,
        scheduling_p50_ms=round(server_ms - engine_ms, 4) if server_ms else None,
    )


# --- the ViT ------------------------------------------------------------------------------------


def vit_goals(points: list[dict[str, Any]], vit: dict[str, Any]) -> list[dict[str, Any]]:
    """Per setup with dynamic batching on / off: overhead and concurrency 32 throughput."""
    goals = []
    for setup in (s for s in SETUPS if "vit" in BATCHING_EDITS[s]):
        closed = {"model": "vit", "variant": setup, "method": "classify", "loop": "closed"}
        c1 = find_point(points, **closed, concurrency=1)
        c32 = find_point(points, **closed, concurrency=GOAL_CONCURRENCY)
        if c1 is None and c32 is None and setup != "batching":
            continue
        goals += [
            classify_overhead_goal(setup, c1, vit["batch1_ms"]["p50"]),
            vit_c32_goal(setup, c32, vit["images_per_s"].get(str(GOAL_CONCURRENCY))),
        ]
    return goals


def classify_overhead_goal(
    setup: str, c1: dict[str, Any] | None, batch1_ms: float
) -> dict[str, Any]:
    client_ms = c1["latency_ms"]["p50"] if c1 else None
    return goal_record(
        f"overhead_p50_ms[classify,{setup}]",
        f"per-request overhead <= {OVERHEAD_MS:g} ms p50: Classify at concurrency 1, "
        "client latency minus onnxruntime's batch-1 call (includes image decoding "
        "and, with dynamic batching, the queue delay)",
        client_ms - batch1_ms if client_ms is not None else None,
        OVERHEAD_MS,
        False,
        "ms",
        variant=setup,
        client_p50_ms=client_ms,
        engine_p50_ms=batch1_ms,
    )


def vit_c32_goal(setup: str, c32: dict[str, Any] | None, ort32: float | None) -> dict[str, Any]:
    return goal_record(
        f"vit_c{GOAL_CONCURRENCY}_vs_ort_b{GOAL_CONCURRENCY}[{setup}]",
        f"ViT at concurrency {GOAL_CONCURRENCY} >= {VIT_C32_OF_ORT:.0%} of "
        f"onnxruntime's own batch-{GOAL_CONCURRENCY} images/s (same run)",
        c32["throughput_rps"] / ort32 if c32 and ort32 else None,
        VIT_C32_OF_ORT,
        True,
        "fraction",
        variant=setup,
        served_images_per_s=c32["throughput_rps"] if c32 else None,
        ort_images_per_s=ort32,
    )
