"""The gRPC floor under the unary overhead goal: an empty unary call's round trip on loopback.

    python -m benchmarks.grpc_floor [--calls 2000] [--work-ms 2.0] [--out DIR] [--tiny]

Serves attnserve.v1 ``ListModels`` with an empty answer from a grpc.aio server (what `attnserve
serve` runs) and from a synchronous grpc server (a thread pool), each in its own process, and
calls it from a grpc.aio client and from a synchronous client in this process, one call at a
time, after a warm-up. A third server, ``aio-engine``, answers only after a worker thread has
busy-waited ``--work-ms`` (about the engine's time for a minimal Translate) and handed the
answer back to the event loop with ``call_soon_threadsafe``, as the engine thread does: the
floor under a call that waits for a model, whose threads go idle meanwhile. The same work is
also done by ``sync-engine`` (a synchronous server's handler thread hands it to a worker and
waits on an event) and inline in the handler (``aio-inline``, ``sync-inline``: no hand-off), so
the hand-off's share and a synchronous server's floor can be told apart. ``aio-strict`` is
``aio`` with the server's own interceptor (``StrictParsing``, which moves request parsing into
the call): its cost per call. Writes
``benchmarks/results/grpc-floor-*.json``: p50 / p99 round trip per (server, client) pair (for
the servers that work also ``overhead_p50``, the p50 minus the work), with the machine. The unary
Translate overhead of `attnserve bench serve` (client latency minus the engine's own time)
cannot go below the ``aio-engine`` / ``aio`` pair's overhead plus the server's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from benchmarks.machine import machine_metadata
from benchmarks.output import timestamp
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.services.parsing import StrictParsing

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
SERVERS = ("aio", "aio-strict", "sync", "aio-engine", "sync-engine", "aio-inline", "sync-inline")
WORKING = {"aio-engine", "sync-engine", "aio-inline", "sync-inline"}  # answer after the work
CLIENTS = ("aio", "sync")


class _Empty(pb_grpc.AttnServeServicer):
    def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        return pb.ListModelsResponse()


class _AioEmpty(pb_grpc.AttnServeServicer):
    async def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        return pb.ListModelsResponse()


def _busy(seconds: float) -> None:
    """Keep this thread's core busy for ``seconds``, as a model call does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _SyncAfterWork(pb_grpc.AttnServeServicer):
    """A synchronous server's handler thread hands the work to a worker thread and waits."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.calls: queue.SimpleQueue[threading.Event] = queue.SimpleQueue()
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        while True:
            done = self.calls.get()
            _busy(self.work_s)
            done.set()

    def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        done = threading.Event()
        self.calls.put(done)
        done.wait()
        return pb.ListModelsResponse()


class _SyncInline(pb_grpc.AttnServeServicer):
    def __init__(self, work_s: float) -> None:
        self.work_s = work_s

    def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        _busy(self.work_s)
        return pb.ListModelsResponse()


class _AioInline(pb_grpc.AttnServeServicer):
    def __init__(self, work_s: float) -> None:
        self.work_s = work_s

    async def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        _busy(self.work_s)
        return pb.ListModelsResponse()


class _AioAfterWork(pb_grpc.AttnServeServicer):
    """Answers once a worker thread has spent ``work_s`` on the call (the engine's hand-off)."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.calls: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        while True:
            loop, done = self.calls.get()
            _busy(self.work_s)
            loop.call_soon_threadsafe(done.set_result, None)

    async def ListModels(self, request: Any, context: Any) -> pb.ListModelsResponse:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.calls.put((loop, done))
        await done
        return pb.ListModelsResponse()


def serve(kind: str, ports: Any, stop: Any, work_s: float = 0.0) -> None:
    """Run an empty server of ``kind`` (one of ``SERVERS``) on a free loopback port until
    ``stop``; the working kinds answer after ``work_s`` of work (module docstring)."""
    if kind.startswith("sync"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        working = _SyncAfterWork if kind == "sync-engine" else _SyncInline
        servicer = _Empty() if kind == "sync" else working(work_s)
        pb_grpc.add_AttnServeServicer_to_server(servicer, server)
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        stop.wait()
        server.stop(0)
        return

    async def main() -> None:
        server = grpc.aio.server(interceptors=[StrictParsing()] if kind == "aio-strict" else None)
        kinds = {"aio-engine": _AioAfterWork, "aio-inline": _AioInline}
        servicer = kinds[kind](work_s) if kind in kinds else _AioEmpty()
        pb_grpc.add_AttnServeServicer_to_server(servicer, server)
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await server.stop(0)

    asyncio.run(main())


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": statistics.median(ordered) * 1e3, "p99": p99 * 1e3}


def _timed(call: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def sync_client(port: int, calls: int, warmup: int) -> list[float]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.AttnServeStub(channel)
        return _timed(lambda: stub.ListModels(pb.ListModelsRequest(), timeout=10), calls, warmup)


def aio_client(port: int, calls: int, warmup: int) -> list[float]:
    async def main() -> list[float]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.AttnServeStub(channel)
            for _ in range(warmup):
                await stub.ListModels(pb.ListModelsRequest(), timeout=10)
            out = []
            for _ in range(calls):
                start = time.perf_counter()
                await stub.ListModels(pb.ListModelsRequest(), timeout=10)
                out.append(time.perf_counter() - start)
            return out

    return asyncio.run(main())


def measure(calls: int, warmup: int, work_ms: float = 2.0) -> list[dict[str, Any]]:
    """One record per (server, client) pair: the empty call's round trip (``aio-engine``: after
    ``work_ms`` of work, with the round trip minus the work as ``overhead_p50``)."""
    context = mp.get_context("spawn")  # a fresh interpreter, as `attnserve serve` is
    clients = {"aio": aio_client, "sync": sync_client}
    records = []
    for kind in SERVERS:
        ports, stop = context.Queue(), context.Event()
        work_s = work_ms / 1e3 if kind in WORKING else 0.0
        process = context.Process(target=serve, args=(kind, ports, stop, work_s), daemon=True)
        process.start()
        try:
            port = ports.get(timeout=60)
            for client in CLIENTS:
                record: dict[str, Any] = {
                    "server": kind,
                    "client": client,
                    "calls": calls,
                    **_summary(clients[client](port, calls, warmup)),
                }
                if work_s:
                    record["work_ms"] = work_ms
                    record["overhead_p50"] = record["p50"] - work_ms
                records.append(record)
        finally:
            stop.set()
            process.join(10)
            if process.is_alive():
                process.kill()
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc_floor")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per pair")
    parser.add_argument(
        "--work-ms", type=float, default=2.0, help="the aio-engine server's work per call"
    )
    parser.add_argument("--tiny", action="store_true", help="50 calls per pair (CI smoke run)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    calls = 50 if args.tiny else args.calls
    result = {
        "schema": "attnserve-grpc-floor/1",
        "kind": "grpc-floor",
        "tiny": args.tiny,
        "grpcio": grpc.__version__,
        "machine": machine_metadata("cpu"),
        "what": "round trip of an empty unary call (attnserve.v1 ListModels answering nothing) "
        "on loopback, one call at a time; server in its own process; aio-strict is aio with "
        "attnserve's parsing interceptor; aio-engine answers after "
        "work_ms of a worker thread's time, handed back to the event loop as the engine does; "
        "sync-engine the same from a synchronous server's handler thread; aio-inline and "
        "sync-inline do the work in the handler",
        "pairs": measure(calls, warmup=max(10, calls // 10), work_ms=args.work_ms),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"grpc-floor-{timestamp()}{'-tiny' if args.tiny else ''}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
