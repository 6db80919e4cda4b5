"""What a priority level buys a request under load, on attnserve and on the Triton peer.

    python -m benchmarks.priority [--repository DIR] [--background 128] [--rounds 3]
        [--window-s 10] [--think-ms 200] [--frontend-workers 1] [--no-triton] [--out DIR]

Serves the repository's ViT with ``batching.priority_levels: 2`` and ``default_priority_level:
2`` (attnserve, one process; then the Triton peer, PyTriton's tritonserver with the same ONNX
file and the same levels in its dynamic batcher). perf_analyzer keeps ``--background``
requests of the default level in flight all along (Triton's load generator; it sends no
priority). A probe client sends one image at a time over KServe, each after a random pause
(uniform up to ``--think-ms``, so that it arrives at any point of a running batch), in windows
of ``--window-s`` alternated: without a priority (it queues behind the background, first come
first served) and with ``priority`` 1 (as tritonclient sends it). Writes ``priority-*.json``:
per server and window the probe's latency percentiles, the server's images/s and images per
batched call (ModelStatistics); the median p50 / p99 of each mode, the ratio default /
priority 1 per server (how much sooner the urgent request is answered) and attnserve / Triton
per mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.perf_analyzer import PerfAnalyzer, PerfRun, find_perf_analyzer
from benchmarks.server_process import ServeProcess
from benchmarks.triton_peer import on_vit_peer
from contract.model_config import ClassifierConfig
from contract.repository import read_model_config, write_model_config
from serving.kserve.tensors import input_tensor
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

MODES = {"default": None, "priority 1": 1}  # the probe's priority parameter per mode
LEVELS = {"priority_levels": 2, "default_priority_level": 2}  # the probe's 1 is the higher
TIMEOUT_S = 30.0


def vit_with_levels(repository: Path, scratch: Path) -> Path:
    """A repository holding the ViT entry (graphs hard-linked) with two priority levels."""
    target = scratch / "repository"
    shutil.copytree(repository / "vit", target / "vit", copy_function=os.link)
    (target / "vit" / "config.yaml").unlink()  # rewritten, never through the link
    config = vit_config(repository)
    batching = dataclasses.replace(
        config.batching,
        priority_levels=LEVELS["priority_levels"],
        default_priority_level=LEVELS["default_priority_level"],
    )
    write_model_config(dataclasses.replace(config, batching=batching), target / "vit")
    return target


def vit_config(repository: Path) -> ClassifierConfig:
    """The repository's ViT entry's config (with its image preprocessing)."""
    config = read_model_config(repository / "vit")
    if not isinstance(config, ClassifierConfig) or config.image is None:
        raise SystemExit(f"{repository / 'vit'} is not an image classifier entry")
    return config


def probe_request(size: int, priority: int | None, seed: int) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name="vit")
    pixels = np.random.default_rng(seed).integers(0, 256, (1, size, size, 3), np.uint8)
    header, raw = input_tensor("image", "UINT8", pixels)
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    if priority is not None:
        request.parameters["priority"].uint64_param = priority  # as tritonclient sends it
    return request


def counts(stub: kpb_grpc.GRPCInferenceServiceStub) -> tuple[int, int]:
    """The ViT's images inferred and batched calls so far (ModelStatistics)."""
    reply = stub.ModelStatistics(kpb.ModelStatisticsRequest(name="vit"), timeout=TIMEOUT_S)
    mine = [s for s in reply.model_stats if s.name == "vit"]
    return sum(s.inference_count for s in mine), sum(s.execution_count for s in mine)


def probe_window(
    stub: kpb_grpc.GRPCInferenceServiceStub,
    size: int,
    priority: int | None,
    seconds: float,
    think_s: float,
) -> dict[str, Any]:
    """One request at a time for ``seconds``, each after a random pause of up to ``think_s``:
    the probe's latencies and the server's rate. (Without the pause the probe would send each
    request just as its last batch ended and the next had left, always waiting a whole batch.)"""
    requests = [probe_request(size, priority, seed) for seed in range(8)]
    pauses = np.random.default_rng(0).uniform(0, think_s, 100_000)
    latencies: list[float] = []
    before, started = counts(stub), time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(pauses[len(latencies) % len(pauses)])
        sent = time.perf_counter()
        stub.ModelInfer(requests[len(latencies) % len(requests)], timeout=TIMEOUT_S)
        latencies.append((time.perf_counter() - sent) * 1000)
    after, seconds = counts(stub), time.monotonic() - started
    images, batches = after[0] - before[0], after[1] - before[1]
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
    return {
        "requests": len(latencies),
        "p50_ms": round(float(p50), 3),
        "p90_ms": round(float(p90), 3),
        "p99_ms": round(float(p99), 3),
        "server_images_per_s": round(images / seconds, 1),
        "images_per_batch": round(images / batches, 2) if batches else None,
    }


def measure(
    perf: PerfAnalyzer, address: str, size: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The probe's windows, modes alternated, under perf_analyzer's background load."""
    run = PerfRun(perf, address, "vit", args.background, window_ms=3_600_000)
    with tempfile.TemporaryDirectory(prefix="attnserve-priority-") as scratch:
        background = subprocess.Popen(
            run.command(Path(scratch) / "background.csv"),
            env=perf.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with grpc.insecure_channel(address) as channel:
                stub = kpb_grpc.GRPCInferenceServiceStub(channel)
                think_s = args.think_ms / 1000
                probe_window(stub, size, None, 2.0, think_s)  # warm-up: the background ramps up
                windows = []
                for round_ in range(args.rounds):
                    for mode, priority in MODES.items():
                        window = probe_window(stub, size, priority, args.window_s, think_s)
                        windows.append({"round": round_, "mode": mode, **window})
                        log(f"{address} {mode}: {window}")
            if background.poll() is not None:
                _, errors = background.communicate()
                raise RuntimeError(f"perf_analyzer stopped: {errors[-400:]}")
        finally:
            background.terminate()
            background.wait(timeout=30)
    return windows


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Median p50 / p99 per server and mode; default / priority 1 per server; attnserve /
    Triton per mode (latency ratios: above 1 = the first is slower)."""
    median = {
        (server, mode, q): statistics.median(w[f"{q}_ms"] for w in windows if w["mode"] == mode)
        for server, windows in results.items()
        for mode in MODES
        for q in ("p50", "p99")
    }
    out: dict[str, float] = {}
    for (server, mode, q), value in median.items():
        out[f"{q}_ms[{server},{mode}]"] = round(value, 3)
        if mode == "priority 1":
            out[f"default_vs_priority[{server},{q}]"] = round(
                median[(server, "default", q)] / value, 2
            )
        if server == "attnserve" and ("triton", mode, q) in median:
            out[f"attnserve_vs_triton[{mode},{q}]"] = round(value / median[("triton", mode, q)], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.priority")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--background", type=int, default=128, help="perf_analyzer concurrency")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2, help="the Triton peer's ORT threads")
    parser.add_argument(
        "--think-ms", type=float, default=200.0, help="the probe's pause: uniform, up to this"
    )
    parser.add_argument(
        "--frontend-workers", type=int, default=1, help="attnserve's frontend processes"
    )
    parser.add_argument("--no-triton", action="store_true", help="attnserve only")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    perf = find_perf_analyzer()
    if isinstance(perf, str):
        raise SystemExit(perf)
    with tempfile.TemporaryDirectory(prefix="attnserve-priority-repo-") as scratch:
        return run(args, perf, vit_with_levels(args.repository, Path(scratch)))


def run(args: argparse.Namespace, perf: PerfAnalyzer, repository: Path) -> int:
    """Measure both servers and write the result."""
    image = vit_config(repository).image
    assert image is not None  # vit_config checked it
    size = image.size
    results: dict[str, list[dict[str, Any]]] = {}
    server = ServeProcess(
        repository,
        *("--models", "vit", "--metrics-port", "-1"),
        *("--frontend-workers", str(args.frontend_workers)),
    ).start()
    try:
        results["attnserve"] = measure(perf, server.address, size, args)
    finally:
        server.stop()
    peer, triton = on_vit_peer(
        repository / "vit",
        args.threads,
        not args.no_triton,
        lambda peer: measure(perf, peer.address, size, args),
    )
    if peer is not None:
        results["triton"] = peer
    write_probe(
        "priority",
        [{"server": name, **w} for name, windows in results.items() for w in windows],
        args.out,
        tiny=False,
        duration_s=args.window_s,
        what=(
            "a probe client (1 request at a time, KServe) without a priority / with priority 1, "
            f"alternated, under perf_analyzer at concurrency {args.background} (default level)"
        ),
        levels=LEVELS,
        background=args.background,
        think_ms=args.think_ms,
        frontend_workers=args.frontend_workers,
        triton=triton,
        summary=summary(results),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
