"""``python -m benchmarks.http_rest``: one real server, perf_analyzer over gRPC and over HTTP/REST
in alternated order, every run with 0 errors, and the HTTP / gRPC ratios computed from the runs
(skips, saying why, without perf_analyzer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.http_rest import against_triton, main, ratios
from benchmarks.perf_analyzer import find_perf_analyzer


def test_both_protocols_are_measured_in_alternated_order(
    tiny_repository: Path, tmp_path: Path
) -> None:
    found = find_perf_analyzer()
    if isinstance(found, str):
        pytest.skip(found)
    args = ["--repository", str(tiny_repository), "--out", str(tmp_path)]
    settings = ["--rounds", "2", "--window-ms", "300", "--concurrency", "2", "--no-triton"]
    assert main([*args, *settings]) == 0
    (path,) = tmp_path.glob("http-rest-*.json")
    result = json.loads(path.read_text())
    runs = result["points"]
    assert all(run["errors"] == 0 and run["throughput_rps"] > 0 for run in runs)
    orders = [
        [r["protocol"] for r in runs if r["round"] == n and r["model"] == "vit"] for n in (0, 1)
    ]
    assert orders == [["grpc", "http"], ["http", "grpc"]]
    assert {(r["model"], r["concurrency"]) for r in result["ratios"]} == {
        ("vit", 2),
        ("translator", 2),
    }
    assert result["machine"]["cpu_model"] and result["frontend_workers"] == 1
    assert result["triton"] == {"status": "skipped", "reason": "--no-triton"}
    assert result["against_triton"] == []
    for row in result["ratios"]:
        assert len(row["http_over_grpc_rps"]) == 2 and row["http_over_grpc_rps_median"] > 0


def test_ratios_pair_the_protocols_of_each_round() -> None:
    def run(round_: int, protocol: str, rps: float, p50: float) -> dict[str, object]:
        return {
            "round": round_,
            "model": "vit",
            "concurrency": 1,
            "protocol": protocol,
            "errors": 0,
            "throughput_rps": rps,
            "latency_ms": {"p50": p50},
        }

    runs = [run(0, "grpc", 100, 2), run(0, "http", 80, 3), run(1, "http", 90, 2.5)]
    runs += [run(1, "grpc", 100, 2), run(2, "grpc", 50, 1)]  # round 2 has no HTTP run
    [row] = ratios(runs)
    assert row["http_over_grpc_rps"] == [0.8, 0.9]
    assert row["http_over_grpc_rps_median"] == 0.85
    assert row["http_over_grpc_p50"] == [1.5, 1.25]
    assert row["http_minus_grpc_p50_ms"] == 0.75


def test_against_triton_compares_medians_per_protocol() -> None:
    def run(server: str, protocol: str, rps: float) -> dict[str, object]:
        return {
            "server": server,
            "model": "vit",
            "concurrency": 8,
            "protocol": protocol,
            "throughput_rps": rps,
        }

    runs = [run("attnserve", "http", r) for r in (100, 120, 110)]
    runs += [run("triton", "http", r) for r in (50, 55, 60)] + [run("attnserve", "grpc", 90)]
    assert against_triton(runs) == [
        {
            "protocol": "http",
            "concurrency": 8,
            "attnserve_rps": 110,
            "triton_rps": 55,
            "attnserve_over_triton": 2.0,
        }
    ]
