"""What the A / B benchmarks of a served setting share (``benchmarks.trace_cost``,
``benchmarks.response_cache``): their flags, closed-loop points per workload against one server,
and the B / A ratios of a pair of servers run in turn."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Client, Workload, measure
from benchmarks.server_process import ServeProcess


def add_pair_arguments(parser: argparse.ArgumentParser, out: Path, pairs: bool = True) -> None:
    """--repository, --duration, --warmup, --pairs (where ``pairs``), --concurrency and --out
    (default ``out``)."""
    parser.add_argument(
        "--repository",
        type=Path,
        help="default: the shipped models, exported into the benchmark cache on first use",
    )
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each point")
    if pairs:
        parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument(
        "--concurrency",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 8),
        help="closed-loop clients per point (default 1,8)",
    )
    parser.add_argument("--out", type=Path, default=out)


def repository_of(args: argparse.Namespace) -> Path:
    """``--repository``, or the shipped models exported into the benchmark cache."""
    if args.repository is not None:
        return Path(args.repository)
    from benchmarks.marian import default_cache
    from benchmarks.serve_setups import shipped_repository

    return shipped_repository(default_cache())


async def drive(
    server: ServeProcess,
    workloads: dict[str, Workload],
    concurrency: tuple[int, ...],
    duration: float,
    warmup: float,
) -> list[dict[str, Any]]:
    """Each workload at each concurrency against ``server`` (its CPU time recorded)."""
    points = []
    for name, workload in workloads.items():
        client = Client(server.address, workload, connections=1)
        try:
            await client.wait_ready()
            for clients in concurrency:
                point = await measure(
                    client,
                    concurrency=clients,
                    duration=duration,
                    warmup=warmup,
                    server_cpu=server.cpu_seconds,
                )
                points.append({"workload": name, "concurrency": clients, **point})
        finally:
            await client.close()
    return points


def ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """B / A, point by point: requests/s and p50 latency."""
    rows = []
    for first, second in zip(a, b, strict=True):
        rows.append(
            {
                "workload": first["workload"],
                "concurrency": first["concurrency"],
                "throughput": round(second["throughput_rps"] / first["throughput_rps"], 3),
                "p50_latency": round(second["latency_ms"]["p50"] / first["latency_ms"]["p50"], 3),
            }
        )
    return rows
