"""``python -m benchmarks.openai_api``: one real server, the gRPC client and both OpenAI clients
on the same translations in rotating order, every run with 0 errors and the same token counts,
and the ratios against gRPC paired by round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.openai_api import CLIENTS, main, ratios


def test_every_client_is_measured_in_rotating_order(tiny_repository: Path, tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    args = ["--repository", str(tiny_repository), "--out", str(tmp_path), "--rounds", "2"]
    settings = ["--duration", "0.3", "--warmup", "0.1", "--unary", "2", "--streams", "2"]
    settings += ["--new-tokens", "4"]
    assert main([*args, *settings]) == 0
    (path,) = tmp_path.glob("openai-api-*.json")
    assert path.with_suffix(".png").stat().st_size > 0
    result = json.loads(path.read_text())
    runs = result["points"]
    for run in runs:
        assert run["errors"] == 0 and run["requests"] > 0, run
        assert run["tokens_per_request"] == 4  # min = max new tokens on every client
        assert run["server_cpu_ms_per_request"] > 0
    orders = [[r["client"] for r in runs if r["round"] == n and not r["stream"]] for n in (0, 1)]
    assert orders == [list(CLIENTS), [*CLIENTS[1:], CLIENTS[0]]]
    streamed = [r for r in runs if r["stream"]]
    assert all(r["ttft_ms"]["p50"] is not None for r in streamed)
    assert {(r["stream"], r["client"]) for r in result["ratios"]} == {
        (stream, client) for stream in (False, True) for client in CLIENTS[1:]
    }
    assert all(len(row["throughput_vs_grpc"]) == 2 for row in result["ratios"])
    assert result["machine"]["cpu_model"] and result["new_tokens"] == 4


def test_ratios_pair_the_clients_of_each_round() -> None:
    def run(round_: int, client: str, rps: float, p50: float, cpu: float) -> dict[str, object]:
        return {
            "round": round_,
            "client": client,
            "stream": False,
            "concurrency": 1,
            "throughput_rps": rps,
            "latency_ms": {"p50": p50},
            "server_cpu_ms_per_request": cpu,
        }

    runs = [run(0, "grpc", 100, 2, 1.0), run(0, "openai", 80, 3, 1.5)]
    runs += [run(1, "openai", 90, 2.5, 0.9), run(1, "grpc", 100, 2, 1.0), run(2, "grpc", 50, 1, 1)]
    row = next(r for r in ratios(runs) if r["client"] == "openai")
    assert row["throughput_vs_grpc"] == [0.8, 0.9]
    assert row["throughput_vs_grpc_median"] == 0.85
    assert row["p50_latency_vs_grpc"] == [1.5, 1.25]
    assert row["server_cpu_per_request_vs_grpc"] == [1.5, 0.9]
    sdk = next(r for r in ratios(runs) if r["client"] == "openai-sdk")
    assert sdk["throughput_vs_grpc"] == [] and sdk["throughput_vs_grpc_median"] is None
