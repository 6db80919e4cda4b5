"""The same-run goals of `attnserve bench serve` (``serve_peers``): attnserve against the Triton
peer on the ViT, and perf_analyzer against the benchmark's own load generator.

Every target is a figure of the same run: the Triton peer's images/s and p99 latency under the
same KServe load (one RGB image per ModelInfer request, closed loop), and the load generator's
requests/s at the same concurrency. Goal ids:

- ``vit_vs_triton_c1[kserve]``: attnserve's ViT images/s at concurrency 1 >= 2.5x the peer's;
- ``vit_vs_triton_c32[kserve]``: >= 1.15x at concurrency 32;
- ``vit_p99_vs_triton_c1[kserve]``, ``vit_p99_vs_triton_c32[kserve]``: attnserve's p99 latency
  below the peer's (the ratio < 1);
- ``perf_analyzer_errors[MODEL]`` (``[vit,triton]`` for the peer): 0 errors in every perf_analyzer
  run on the model;
- ``perf_analyzer_vs_loadgen[MODEL,SERVER,cN]``: perf_analyzer's requests/s within 15% of the
  load generator's at concurrency N (the ViT: the same KServe request; the translator: the load
  generator's attnserve-API TranslateStream, perf_analyzer's KServe ModelStreamInfer). The load
  generator's figure is the mean of its points right before and after the perf_analyzer run
  (``loadgen_rps_around``); results without them take its setup's point at that concurrency.
"""

from __future__ import annotations

from typing import Any

from benchmarks.serve_goals import find_point, goal_record
from benchmarks.serve_settings import GOAL_CONCURRENCY

VS_TRITON = {1: 2.5, GOAL_CONCURRENCY: 1.15}  # concurrency -> attnserve / Triton images/s
PERF_TOLERANCE = 0.15  # perf_analyzer's throughput within +-15% of the load generator's
PEER = (
    "the Triton peer (Triton Inference Server {version} in PyTriton: dynamic batcher, python "
    "backend calling onnxruntime on the same ViT ONNX model; same run, same KServe load: one RGB "
    "image per request)"
)


def peer_goals(points: list[dict[str, Any]], sections: dict[str, Any] | None) -> list[dict]:
    """The Triton and perf_analyzer goals of a run with those sections (older runs: none)."""
    if not sections:
        return []
    goals = []
    triton = sections.get("triton")
    if triton is not None and triton["status"] != "not run":
        goals += triton_goals(points, triton)
    perf = sections.get("perf_analyzer")
    if perf is not None:
        goals += perf_analyzer_goals(points, perf)
    return goals


def _unmeasured(goal: dict[str, Any], reason: str | None) -> dict[str, Any]:
    """``goal`` with the reason it was not measured, when there is one."""
    if goal["measured"] is None and reason:
        goal["note"] = reason
    return goal


def _pair(points: list[dict[str, Any]], concurrency: int) -> tuple[dict | None, dict | None]:
    """attnserve's and the Triton peer's KServe ViT points at ``concurrency``."""
    kserve = {"method": "kserve_infer", "concurrency": concurrency}
    return find_point(points, variant="batching", **kserve), find_point(
        points, variant="triton", **kserve
    )


def triton_goals(points: list[dict[str, Any]], triton: dict[str, Any]) -> list[dict[str, Any]]:
    """Throughput ratios at concurrency 1 and 32, then the p99 latency ratios."""
    peer = PEER.format(version=triton.get("server", {}).get("version", "?"))
    reason = None if triton["status"] == "measured" else f"Triton peer skipped: {triton['reason']}"
    goals = []
    for concurrency, factor in VS_TRITON.items():
        ours, theirs = _pair(points, concurrency)
        goal = goal_record(
            f"vit_vs_triton_c{concurrency}[kserve]",
            f"ViT at concurrency {concurrency}: attnserve images/s >= {factor:g}x those of {peer}",
            _ratio(ours, theirs, "throughput_rps"),
            factor,
            True,
            "x",
            attnserve_images_per_s=ours["throughput_rps"] if ours else None,
            triton_images_per_s=theirs["throughput_rps"] if theirs else None,
        )
        goals.append(_unmeasured(goal, reason))
    for concurrency in VS_TRITON:
        ours, theirs = _pair(points, concurrency)
        goal = goal_record(
            f"vit_p99_vs_triton_c{concurrency}[kserve]",
            f"ViT at concurrency {concurrency}: attnserve's p99 latency below that of {peer} "
            "(ratio < 1)",
            _ratio(ours, theirs, "p99"),
            1.0,
            False,
            "x",
            attnserve_p99_ms=ours["latency_ms"]["p99"] if ours else None,
            triton_p99_ms=theirs["latency_ms"]["p99"] if theirs else None,
        )
        goals.append(_unmeasured(goal, reason))
    return goals


def _ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None, what: str) -> float | None:
    """ours / theirs of a point's ``throughput_rps`` or latency percentile (None: missing)."""
    if not ours or not theirs:
        return None
    a, b = (p[what] if what == "throughput_rps" else p["latency_ms"][what] for p in (ours, theirs))
    return a / b if a is not None and b else None


def perf_analyzer_goals(points: list[dict[str, Any]], perf: dict[str, Any]) -> list[dict]:
    """0 errors per model and server, then each run's throughput against the load generator's."""
    if perf["status"] != "measured":
        goal = goal_record(
            "perf_analyzer_errors",
            "perf_analyzer finishes every run on every served model with 0 errors",
            None,
            0,
            False,
            "errors",
        )
        return [_unmeasured(goal, f"perf_analyzer {perf['status']}: {perf.get('reason')}")]
    goals = []
    runs = perf["runs"]
    for model, server in dict.fromkeys((r["model"], r["server"]) for r in runs):
        mine = [r for r in runs if (r["model"], r["server"]) == (model, server)]
        suffix = model if server == "attnserve" else f"{model},{server}"
        goals.append(
            goal_record(
                f"perf_analyzer_errors[{suffix}]",
                f"perf_analyzer {perf['version']} on {server}'s {model} with flags "
                f"{' '.join(mine[0]['flags']) or '(none)'}: 0 errors at every concurrency",
                sum(r["errors"] for r in mine),
                0,
                False,
                "errors",
                errors=[r.get("error") for r in mine if r["errors"]],
            )
        )
    goals += [_agreement_goal(points, run) for run in runs if run["errors"] == 0]
    return goals


def _agreement_goal(points: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """perf_analyzer's requests/s against the load generator's at the same concurrency."""
    model, server, concurrency = run["model"], run["server"], run["concurrency"]
    around = run.get("loadgen_rps_around")
    if around:  # the load generator right before and after the run (older results: none)
        return _agreement_record(run, sum(around) / len(around), "before and after the run")
    if model == "vit":
        variant = "batching" if server == "attnserve" else server
        ours = find_point(points, method="kserve_infer", variant=variant, concurrency=concurrency)
    else:
        ours = find_point(
            points,
            model=model,
            variant="batching",
            method="translate_stream",
            loop="closed",
            workload="fixed",
            concurrency=concurrency,
        )
    return _agreement_record(run, ours["throughput_rps"] if ours else None, None)


def _agreement_record(
    run: dict[str, Any], loadgen: float | None, when: str | None
) -> dict[str, Any]:
    model, server, concurrency = run["model"], run["server"], run["concurrency"]
    ratio = run["throughput_rps"] / loadgen if loadgen else None
    details = {"loadgen_measured": when} if when else {}
    return goal_record(
        f"perf_analyzer_vs_loadgen[{model},{server},c{concurrency}]",
        f"perf_analyzer's requests/s on {server}'s {model} at concurrency {concurrency} within "
        f"{PERF_TOLERANCE:.0%} of the benchmark's load generator's (|ratio - 1|)",
        abs(ratio - 1) if ratio is not None else None,
        PERF_TOLERANCE,
        False,
        "fraction",
        ratio=round(ratio, 4) if ratio is not None else None,
        perf_analyzer_rps=run["throughput_rps"],
        loadgen_rps=loadgen,
        **details,
    )
