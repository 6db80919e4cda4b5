"""What KServe over HTTP/REST costs against gRPC: one server, both ports, the same client.

    python -m benchmarks.http_rest [--repository DIR] [--concurrency 1,8] [--rounds 3]
        [--window-ms 2000] [--frontend-workers 1] [--threads 2] [--no-triton] [--out DIR]

One ``attnserve serve --http-port 0`` on the repository; Triton's perf_analyzer (its C++ client,
so neither protocol is measured through a Python client) runs each model at each concurrency over
``-i grpc`` and ``-i http`` (binary tensor data), the protocol order alternating from round to
round (this VM's speed drifts): the ViT on perf_analyzer's random 32 × 32 images, the translator
(unary ModelInfer) on one short text into German. Then the same for the ViT on the Triton peer
(tritonserver 2.51 through PyTriton, as in ``bench serve``; its gRPC and HTTP endpoints), unless
``--no-triton`` or it cannot run here (the record says why). Writes every run's requests/s, p50 /
p99 latency and the server's own queue and compute time; per server, model and concurrency the
HTTP / gRPC ratios of each round (requests/s; p50 latency); and per protocol attnserve / Triton
on the ViT, to ``benchmarks/results/http-rest/http-rest-*.json``. Needs perf_analyzer (`make
perf-analyzer`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.perf_analyzer import PerfAnalyzer, find_perf_analyzer
from benchmarks.served_pairs import repository_of
from benchmarks.server_process import ServeProcess
from benchmarks.triton_peer import on_vit_peer

PROTOCOLS = ("grpc", "http")
TEXT = "three hundred and forty-seven"


def input_data(folder: Path) -> dict[str, Path | None]:
    """Each model's perf_analyzer input data (None: generated)."""
    text = folder / "translator.json"
    text.write_text(json.dumps({"data": [{"text": [TEXT], "target_language": ["de"]}]}))
    return {"vit": None, "translator": text}


def measure(
    tool: PerfAnalyzer,
    addresses: dict[str, str],
    data: dict[str, Path | None],
    settings: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Every (round, model, concurrency, protocol) run of one server (``addresses``: its
    HOST:PORT by protocol)."""
    runs = []
    for round_ in range(settings.rounds):
        order = PROTOCOLS if round_ % 2 == 0 else tuple(reversed(PROTOCOLS))
        for model, inputs in data.items():
            for concurrency in settings.concurrency:
                for protocol in order:
                    log(f"round {round_}: {model} at {concurrency} over {protocol}")
                    record = tool.run(
                        addresses[protocol],
                        model,
                        concurrency,
                        window_ms=settings.window_ms,
                        input_data=inputs,
                        protocol=protocol,
                    )
                    runs.append({"round": round_, **record})
    return runs


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server, model and concurrency: HTTP / gRPC requests/s and p50 latency, per round and
    median."""
    table: dict[tuple[str, str, int], dict[int, dict[str, dict[str, Any]]]] = {}
    for run in runs:
        if run.get("errors"):
            continue
        key = (run.get("server", "attnserve"), run["model"], run["concurrency"])
        table.setdefault(key, {}).setdefault(run["round"], {})[run["protocol"]] = run
    out = []
    for (server, model, concurrency), rounds in table.items():
        pairs = [r for r in rounds.values() if set(r) == set(PROTOCOLS)]
        if not pairs:
            continue
        throughput = [p["http"]["throughput_rps"] / p["grpc"]["throughput_rps"] for p in pairs]
        latency = [p["http"]["latency_ms"]["p50"] / p["grpc"]["latency_ms"]["p50"] for p in pairs]
        added = [p["http"]["latency_ms"]["p50"] - p["grpc"]["latency_ms"]["p50"] for p in pairs]
        out.append(
            {
                "server": server,
                "model": model,
                "concurrency": concurrency,
                "http_over_grpc_rps": [round(r, 3) for r in throughput],
                "http_over_grpc_rps_median": round(statistics.median(throughput), 3),
                "http_over_grpc_p50": [round(r, 3) for r in latency],
                "http_minus_grpc_p50_ms": round(statistics.median(added), 3),
            }
        )
    return out


def against_triton(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol and concurrency: attnserve / Triton requests/s on the ViT (medians over the
    rounds of each)."""
    rates: dict[tuple[str, str, int], list[float]] = {}
    for run in runs:
        if run["model"] == "vit" and not run.get("errors"):
            key = (run.get("server", "attnserve"), run["protocol"], run["concurrency"])
            rates.setdefault(key, []).append(run["throughput_rps"])
    out = []
    for (server, protocol, concurrency), ours in sorted(rates.items()):
        theirs = rates.get(("triton", protocol, concurrency))
        if server == "attnserve" and theirs:
            ratio = statistics.median(ours) / statistics.median(theirs)
            out.append(
                {
                    "protocol": protocol,
                    "concurrency": concurrency,
                    "attnserve_rps": round(statistics.median(ours), 1),
                    "triton_rps": round(statistics.median(theirs), 1),
                    "attnserve_over_triton": round(ratio, 3),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_rest")
    parser.add_argument("--repository", type=Path, help="default: the shipped models, exported")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "http-rest")
    parser.add_argument(
        "--concurrency",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 8),
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--frontend-workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="the Triton peer's ORT threads")
    parser.add_argument("--no-triton", action="store_true", help="attnserve only")
    args = parser.parse_args(argv)
    args.repository = repository_of(args)
    tool = find_perf_analyzer()
    if isinstance(tool, str):
        parser.error(tool)
    server = ServeProcess(
        args.repository,
        *("--host", "127.0.0.1", "--metrics-port", "-1", "--log-level", "WARNING"),
        *("--http-port", "0", "--frontend-workers", str(args.frontend_workers)),
        grace=2,
    ).start()
    addresses = {"grpc": server.address, "http": f"127.0.0.1:{server.http_port}"}
    try:
        with tempfile.TemporaryDirectory(prefix="attnserve-http-rest-") as scratch:
            runs = measure(tool, addresses, input_data(Path(scratch)), args)
    finally:
        server.stop()
    runs = [{"server": "attnserve", **run} for run in runs]
    peer, triton = on_vit_peer(
        args.repository / "vit",
        args.threads,
        not args.no_triton,
        lambda peer: measure(
            tool, {"grpc": peer.address, "http": peer.http_address}, {"vit": None}, args
        ),
    )
    runs += [{"server": "triton", **run} for run in peer or []]
    summary = ratios(runs)
    duration = args.window_ms / 1000 * 3
    write_probe(
        "http-rest",
        runs,
        args.out,
        False,
        duration,
        frontend_workers=args.frontend_workers,
        triton=triton,
        ratios=summary,
        against_triton=against_triton(runs),
    )
    for row in summary:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
