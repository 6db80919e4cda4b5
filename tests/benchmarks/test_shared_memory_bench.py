"""``python -m benchmarks.shared_memory``: perf_analyzer on a real attnserve server with and
without system shared memory, every run without errors; the ratios pair the right medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.perf_analyzer import find_perf_analyzer
from benchmarks.shared_memory import main, ratios


def test_ratios_pair_each_server_s_modes_and_the_servers() -> None:
    def point(c: int, mode: str, rps: float) -> dict:
        return {"concurrency": c, "shared_memory": mode, "median_rps": rps}

    results = {
        "attnserve": [point(1, "none", 100), point(1, "system", 120)],
        "triton": [point(1, "none", 50), point(1, "system", 80)],
    }
    assert ratios(results) == {
        "system_vs_none[attnserve,c1]": 1.2,
        "system_vs_none[triton,c1]": 1.6,
        "attnserve_vs_triton[none,c1]": 2.0,
        "attnserve_vs_triton[system,c1]": 1.5,
    }


def test_a_short_run_against_attnserve(tiny_repository: Path, tmp_path: Path) -> None:
    found = find_perf_analyzer()
    if isinstance(found, str):
        pytest.skip(found)
    argv = ["--repository", str(tiny_repository), "--no-triton", "--rounds", "1"]
    argv += ["--window-ms", "300", "--concurrency", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    (path,) = tmp_path.glob("shared-memory-*.json")
    result = json.loads(path.read_text())
    modes = {p["shared_memory"]: p for p in result["points"]}
    assert set(modes) == {"none", "system"} and result["triton"]["status"] == "skipped"
    for point in modes.values():
        assert point["median_rps"] > 0 and point["server_ms"][0]["compute_infer"] > 0
    assert set(result["ratios"]) == {"system_vs_none[attnserve,c1]"}
