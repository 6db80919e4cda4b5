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

from benchmarks.loadgen import Workload
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.serve_workloads import sample_image
from benchmarks.served_pairs import add_pair_arguments, drive, ratios, repository_of
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
            drive(
                server,
                workloads(sample_image()),
                settings.concurrency,
                settings.duration,
                settings.warmup,
            )
        )
    finally:
        server.stop()
    return points, trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_cost")
    add_pair_arguments(parser, DEFAULT_RESULTS / "trace-cost")
    args = parser.parse_args(argv)
    args.repository = repository_of(args)
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
