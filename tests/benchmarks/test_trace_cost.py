"""``python -m benchmarks.trace_cost``: real servers with tracing off and on, driven in turn; the
traced one's requests are all in its trace summary and the ratios pair the runs point by point."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.trace_cost import main


def test_a_pair_of_runs_is_measured_and_traced(tiny_repository: Path, tmp_path: Path) -> None:
    args = ["--repository", str(tiny_repository), "--out", str(tmp_path)]
    assert (
        main([*args, "--duration", "0.5", "--warmup", "0", "--pairs", "1", "--concurrency", "2"])
        == 0
    )
    (path,) = tmp_path.glob("trace-cost-*.json")
    result = json.loads(path.read_text())
    points = result["points"]
    assert [(p["traced"], p["workload"]) for p in points] == [
        (False, "classify"),
        (False, "translate"),
        (True, "classify"),
        (True, "translate"),
    ]
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in points)
    [pair] = result["pairs"]
    served = {p["workload"]: p["requests"] for p in points if p["traced"]}
    traced = {row["model"]: row["traces"] for row in pair["trace_summary"]}
    assert traced == {"vit": served["classify"], "translator": served["translate"]}
    assert [(r["workload"], r["concurrency"]) for r in pair["ratios"]] == [
        ("classify", 2),
        ("translate", 2),
    ]
    assert all(r["throughput"] > 0 for r in pair["ratios"])
