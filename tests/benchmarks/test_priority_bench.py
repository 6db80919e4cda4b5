"""``python -m benchmarks.priority``: a probe with and without priority 1 under perf_analyzer's
background load on a real attnserve server; the summary pairs the right medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.perf_analyzer import find_perf_analyzer
from benchmarks.priority import main, summary


def test_the_summary_pairs_modes_and_servers() -> None:
    def window(mode: str, p50: float, p99: float) -> dict:
        return {"mode": mode, "p50_ms": p50, "p99_ms": p99}

    results = {
        "attnserve": [window("default", 300, 400), window("priority 1", 100, 200)],
        "triton": [window("default", 600, 800), window("priority 1", 50, 100)],
    }
    out = summary(results)
    assert out["default_vs_priority[attnserve,p50]"] == 3.0
    assert out["default_vs_priority[triton,p99]"] == 8.0
    assert out["attnserve_vs_triton[priority 1,p50]"] == 2.0
    assert out["attnserve_vs_triton[default,p99]"] == 0.5
    assert out["p50_ms[triton,default]"] == 600


def test_a_short_run_against_attnserve(tiny_repository: Path, tmp_path: Path) -> None:
    found = find_perf_analyzer()
    if isinstance(found, str):
        pytest.skip(found)
    argv = ["--repository", str(tiny_repository), "--no-triton", "--rounds", "1"]
    argv += ["--window-s", "1", "--think-ms", "20", "--background", "64", "--out", str(tmp_path)]
    assert main(argv) == 0
    (path,) = tmp_path.glob("priority-*.json")
    result = json.loads(path.read_text())
    modes = {p["mode"]: p for p in result["points"]}
    assert set(modes) == {"default", "priority 1"} and result["triton"]["status"] == "skipped"
    for point in modes.values():
        assert point["requests"] > 0 and point["server_images_per_s"] > 0
        assert point["images_per_batch"] >= 1
    assert result["levels"] == {"priority_levels": 2, "default_priority_level": 2}
    assert (result["think_ms"], result["frontend_workers"]) == (20, 1)
    assert "default_vs_priority[attnserve,p50]" in result["summary"]
