"""The engine process's floor: how many classifications per second its event loop can take.

    python -m benchmarks.transport_floor [--concurrency 1 32 256] [--duration 3] [--out DIR]
        [--image-sizes 32 224] [--transports socket shm]

With ``--frontend-workers N`` every request a frontend admits crosses the Unix socket to the one
engine process, whose event loop decodes it, queues it in the model's dynamic batcher, and sends
the answer back (``serving.multiprocess``). On a GPU host that loop, not the model, can be the
ceiling (the ViT goal is 10,000 images/s). This measures it without a model: an engine process
runs the real ``EngineServer`` with a real ``DynamicBatcher`` (max batch 256, no queue delay)
whose batch function returns at once, and this process drives it through the real
``EngineClient`` / ``RemoteBatcher`` (what a frontend runs) with ``--concurrency`` concurrent
RGB float32 images of each ``--image-sizes`` side (32: the shipped ViT's input; 224: a
ViT-B/16's), closed loop, for ``--duration`` seconds after a warm-up, each image either in the
socket's message or in a frontend's shared memory arena of the default size (``--transports``;
the served frontends choose by size, ``shm.ARENA_MIN_BYTES``). Writes
``benchmarks/results/transport-floor-*.json``: per point, requests/s, p50 / p99 latency, and the
CPU time the engine process and this client process spent per request (the engine's is what
bounds requests/s per engine process: 1 s over it).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import process_cpu_seconds
from benchmarks.output import write_probe
from serving.server_config import ServerConfig

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
MODEL = "floor"
CLASSES = 10
MAX_BATCH = 256
TRANSPORTS = ("socket", "shm")
ARENA_BYTES = ServerConfig().frontend_shm_mb << 20  # a frontend's default arena


class _Repository:
    """The one model the floor's engine serves (``EngineServer`` only calls ``get``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def get(self, name: str, version: str = "") -> Any:
        return self.model


def _instant_batch(items: list[np.ndarray]) -> list[np.ndarray]:
    """A batch function that does no work: uniform class probabilities per image."""
    return [np.full(CLASSES, 1.0 / CLASSES, dtype=np.float32) for _ in items]


def _engine_main(path: str, ready: Any, stop: Any) -> None:
    asyncio.run(_engine(path, ready, stop))


async def _engine(path: str, ready: Any, stop: Any) -> None:
    from contract.model_config import DynamicBatching
    from serving.batching.dynamic import DynamicBatcher
    from serving.multiprocess.engine_server import EngineServer
    from serving.served import ServedClassifier

    settings = DynamicBatching(max_batch_size=MAX_BATCH, max_queue_size=4 * MAX_BATCH)
    batcher = DynamicBatcher(MODEL, _instant_batch, settings, stage="classifier")
    await batcher.start()
    model = ServedClassifier.__new__(ServedClassifier)  # the engine needs only its batcher
    model.batcher = batcher
    model.name = MODEL
    server = EngineServer(_Repository(model), path)  # type: ignore[arg-type]
    await server.bind()
    ready.set()
    while not stop.is_set():
        await asyncio.sleep(0.05)
    await server.close()
    await batcher.stop(drain=False)


def _cpu_seconds(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"no CPU time for process {pid} in /proc")
    return seconds


async def _drive(
    path: str,
    engine_pid: int,
    concurrency: int,
    duration: float,
    warmup: float,
    image_size: int = 32,
    transport: str = "socket",
) -> dict[str, Any]:
    from serving.multiprocess.remote import EngineClient, RemoteBatcher

    arena = ARENA_BYTES if transport == "shm" else 0
    client = EngineClient(path, engine_pid, arena_bytes=arena)  # every image in the arena
    await client.start()
    batcher = RemoteBatcher(client, MODEL, 1)
    shape = (3, image_size, image_size)
    image = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    latencies: list[float] = []
    measuring = False

    async def worker(until: float) -> None:
        while (now := time.perf_counter()) < until:
            await batcher.submit(image, timeout_s=30.0)
            if measuring:
                latencies.append(time.perf_counter() - now)

    await asyncio.gather(*(worker(time.perf_counter() + warmup) for _ in range(concurrency)))
    measuring = True
    engine_cpu, own_cpu = _cpu_seconds(engine_pid), time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker(started + duration) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    engine_cpu = _cpu_seconds(engine_pid) - engine_cpu
    own_cpu = time.process_time() - own_cpu
    placed = 0 if client.arena is None else client.arena.placed  # images that went through it
    await client.close()
    calls = len(latencies)
    ordered = sorted(latencies)
    return {
        "concurrency": concurrency,
        "image_size": image_size,
        "image_bytes": image.nbytes,
        "transport": transport,
        "arena_images": placed,
        "requests": calls,
        "requests_per_s": round(calls / elapsed, 1),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(calls - 1, int(0.99 * calls))] * 1000, 3),
        "engine_cpu_us_per_request": round(engine_cpu / calls * 1e6, 1),
        "client_cpu_us_per_request": round(own_cpu / calls * 1e6, 1),
        "engine_bound_requests_per_s": round(calls / engine_cpu, 1) if engine_cpu else None,
    }


def measure(
    concurrency: list[int],
    duration: float,
    warmup: float,
    image_sizes: list[int] = [32],  # noqa: B006 (read only)
    transports: list[str] = ["socket"],  # noqa: B006 (read only)
) -> list[dict[str, Any]]:
    """One engine process; each point (image size, transport, concurrency) driven in turn
    from this process."""
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="attnserve-floor-") as scratch:
        path = os.path.join(scratch, "engine.sock")
        ready, stop = context.Event(), context.Event()
        engine = context.Process(target=_engine_main, args=(path, ready, stop), daemon=True)
        engine.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the floor's engine process did not start in 60 s")
            assert engine.pid is not None
            return [
                asyncio.run(_drive(path, engine.pid, c, duration, warmup, size, transport))
                for size in image_sizes
                for c in concurrency
                for transport in transports
            ]
        finally:
            stop.set()
            engine.join(10)
            if engine.is_alive():
                engine.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transport_floor")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each point")
    parser.add_argument(
        "--image-sizes",
        type=int,
        nargs="+",
        default=[32],
        help="square RGB float32 images of these sides (32: the shipped ViT's, 224: ViT-B's)",
    )
    parser.add_argument(
        "--transports",
        nargs="+",
        choices=TRANSPORTS,
        default=list(TRANSPORTS),
        help="images in the Unix socket's messages, or in the frontend's shared memory arena",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tiny", action="store_true", help="short points (CI smoke run)")
    args = parser.parse_args(argv)
    duration, warmup = (0.3, 0.1) if args.tiny else (args.duration, args.warmup)
    points = measure(args.concurrency, duration, warmup, args.image_sizes, args.transports)
    write_probe(
        "transport-floor",
        points,
        args.out,
        args.tiny,
        duration,
        max_batch_size=MAX_BATCH,
        image="3 x size x size float32",
        arena_bytes=ARENA_BYTES,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
