"""What request tracing costs a served model: the same server with tracing off and with every
request traced (``--trace-level TIMESTAMPS --trace-rate 1``), in alternated runs.

    python -m benchmarks.trace_cost [--repository DIR] [--duration 15] [--pairs 2]
        [--concurrency 1,8] [--out DIR]

Per pair, two ``attnserve serve`` processes in turn (off then traced, or traced then off: the
order alternates from pair to pair, as this VM's speed drifts) on the repository's ViT and
translator; per server, closed-loop Classify (one PNG) and Translate (one short text, 8 new
tokens) at each concurrency after a warm-up. Writes each point's requests/s and p50 / p99
latency, the traced / off ratios of each pair, and the traced servers' trace summaries (request,
queue, compute and the rest, per model) to ``benchmarks/results/trace-cost/trace-cost-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Client, Workload, measure
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.serve_workloads import sample_image
from benchmarks.server_process import ServeProcess

TEXT = "three hundred and forty-seven"
NEW_TOKENS = 8


def workloads(image: bytes) -> dict[str, Workload]:
    return {
        "classify": Workload("classify", "vit", image=image),
        "translate": Workload(
            "translate", "translator", text=TEXT, language="de", new_tokens=NEW_TOKENS
        ),
    }


async def drive(
    server: ServeProcess, concurrency: tuple[int, ...], duration: float, warmup: float
) -> list[dict[str, Any]]:
    """Each workload at each concurrency against ``server`` (its CPU time recorded)."""
    points = []
    for name, workload in workloads(sample_image()).items():
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


def run_server(
    repository: Path, traced: bool, folder: Path, settings: argparse.Namespace
) -> tuple[list[dict[str, Any]], Path | None]:
    """One server's points, and its trace file (None untraced)."""
    trace = folder / f"trace-{len(list(folder.iterdir()))}.json" if traced else None
    flags = ["--trace-file", str(trace), "--trace-level", "TIMESTAMPS", "--trace-rate", "1"]
    server = ServeProcess(
        repository,
        *("--host", "127.0.0.1", "--metrics-port", "-1", "--log-level", "WARNING"),
        *("--models", "vit", "translator"),
        *(flags if traced else []),
        grace=2,
    ).start()
    try:
        points = asyncio.run(
            drive(server, settings.concurrency, settings.duration, settings.warmup)
        )
    finally:
        server.stop()
    return points, trace


def ratios(off: list[dict[str, Any]], traced: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Traced / off, point by point: requests/s and p50 latency."""
    rows = []
    for a, b in zip(off, traced, strict=True):
        rows.append(
            {
                "workload": a["workload"],
                "concurrency": a["concurrency"],
                "throughput": round(b["throughput_rps"] / a["throughput_rps"], 3),
                "p50_latency": round(b["latency_ms"]["p50"] / a["latency_ms"]["p50"], 3),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_cost")
    parser.add_argument(
        "--repository",
        type=Path,
        help="default: the shipped models, exported into the benchmark cache on first use",
    )
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each point")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument(
        "--concurrency",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 8),
        help="closed-loop clients per point (default 1,8)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "trace-cost")
    args = parser.parse_args(argv)
    if args.repository is None:
        from benchmarks.marian import default_cache
        from benchmarks.serve_setups import shipped_repository

        args.repository = shipped_repository(default_cache())
    from serving.trace_summary import read_traces, summary_rows

    points: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnserve-trace-cost-") as scratch:
        for pair in range(args.pairs):
            runs: dict[bool, list[dict[str, Any]]] = {}
            order = (False, True) if pair % 2 == 0 else (True, False)
            for traced in order:
                log(f"pair {pair}: tracing {'on' if traced else 'off'}")
                runs[traced], trace = run_server(args.repository, traced, Path(scratch), args)
                summary = summary_rows(read_traces([trace])) if trace is not None else None
                points += [{"pair": pair, "traced": traced, **p} for p in runs[traced]]
                if summary is not None:
                    pairs.append({"pair": pair, "trace_summary": summary})
            pairs[-1]["ratios"] = ratios(runs[False], runs[True])
    write_probe(
        "trace-cost",
        points,
        args.out,
        False,
        args.duration,
        pairs=pairs,
        text=TEXT,
        new_tokens=NEW_TOKENS,
    )
    for record in pairs:
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
