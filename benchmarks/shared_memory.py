"""KServe inputs and outputs through system shared memory against the message, on attnserve and
on the Triton peer, with Triton's own perf_analyzer.

    python -m benchmarks.shared_memory [--repository DIR | --image-size 224] [--concurrency 1 8]
        [--rounds 3] [--window-ms 2000] [--no-triton] [--out DIR]

Serves the repository's ViT (``--image-size S``: instead a tiny random-weight ViT of S x S
images, exported into a scratch repository, for inputs larger than the shipped model's 3 KB)
with ``attnserve serve --system-shared-memory`` (one process), then
with the Triton peer (PyTriton's tritonserver, the same ONNX file, as ``bench serve`` runs it),
and runs perf_analyzer on each at every concurrency, ``--shared-memory none`` and ``system``
alternated for ``--rounds`` rounds (perf_analyzer's generated input: the declared image tensor).
Writes ``shared-memory-*.json``: per server, mode and concurrency the rounds' requests/s and
latencies, the median's ratio system / none per server, and attnserve / Triton per mode.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.output import DEFAULT_RESULTS, write_probe
from benchmarks.perf_analyzer import PerfAnalyzer, find_perf_analyzer
from benchmarks.server_process import ServeProcess
from benchmarks.triton_peer import on_vit_peer

MODES = ("none", "system")


def measure(
    perf: PerfAnalyzer, address: str, concurrency: list[int], rounds: int, window_ms: int
) -> list[dict[str, Any]]:
    """perf_analyzer's records of every (concurrency, mode), the modes alternated per round."""
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for c in concurrency:
            for mode in MODES:
                record = perf.run(address, "vit", c, window_ms=window_ms, shared_memory=mode)
                if record["errors"]:
                    raise RuntimeError(f"perf_analyzer failed: {record['error']}")
                runs.setdefault((c, mode), []).append(record)
    points = []
    for (c, mode), records in runs.items():
        rates = [r["throughput_rps"] for r in records]
        points.append(
            {
                "concurrency": c,
                "shared_memory": mode,
                "throughput_rps": rates,
                "median_rps": statistics.median(rates),
                "p50_ms": [r["latency_ms"]["p50"] for r in records],
                "server_ms": [r.get("server_ms") for r in records],
            }
        )
    return points


def ratios(results: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """system / none per server and concurrency; attnserve / Triton per mode and concurrency."""
    median = {
        (server, p["concurrency"], p["shared_memory"]): p["median_rps"]
        for server, points in results.items()
        for p in points
    }
    out: dict[str, float] = {}
    for server, c, mode in median:
        if mode == "system":
            out[f"system_vs_none[{server},c{c}]"] = round(
                median[(server, c, "system")] / median[(server, c, "none")], 3
            )
        if server == "attnserve" and ("triton", c, mode) in median:
            out[f"attnserve_vs_triton[{mode},c{c}]"] = round(
                median[(server, c, mode)] / median[("triton", c, mode)], 3
            )
    return out


def random_vit(repository: Path, image_size: int) -> Path:
    """A tiny random-weight ViT of ``image_size`` pixels (patches of 16) exported into
    ``repository``; the repository (needs torch: the export extra)."""
    from export.exporter import ExportOptions, export
    from export.sources import LoadedSource
    from models import vit

    config = vit.preset("tiny", image_size=image_size, patch_size=16, labels=tuple("0123456789"))
    source = LoadedSource("vit", vit.ViT(config).eval(), None, "tiny", "0")
    export(source, repository, ExportOptions(parity_examples=20))
    return repository


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_memory")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--image-size", type=int, help="a random-weight ViT of this image size instead"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2, help="the Triton peer's ORT threads")
    parser.add_argument("--no-triton", action="store_true", help="attnserve only")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    perf = find_perf_analyzer()
    if isinstance(perf, str):
        raise SystemExit(perf)
    with tempfile.TemporaryDirectory(prefix="attnserve-shm-bench-") as scratch:
        if args.image_size:
            args.repository = random_vit(Path(scratch), args.image_size)
        return run(args, perf)


def run(args: argparse.Namespace, perf: PerfAnalyzer) -> int:
    """Measure both servers and write the result."""
    measure_here = (args.concurrency, args.rounds, args.window_ms)
    results: dict[str, list[dict[str, Any]]] = {}
    server = ServeProcess(
        args.repository, "--system-shared-memory", "--models", "vit", "--metrics-port", "-1"
    ).start()
    try:
        results["attnserve"] = measure(perf, server.address, *measure_here)
    finally:
        server.stop()
    peer, triton = on_vit_peer(
        args.repository / "vit",
        args.threads,
        not args.no_triton,
        lambda peer: measure(perf, peer.address, *measure_here),
    )
    if peer is not None:
        results["triton"] = peer
    write_probe(
        "shared-memory",
        [{"server": name, **p} for name, points in results.items() for p in points],
        args.out,
        tiny=False,
        duration_s=args.window_ms / 1000,
        what="perf_analyzer on the ViT over KServe, --shared-memory none / system alternated",
        image_size=args.image_size or "the repository's",
        triton=triton,
        ratios=ratios(results),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
