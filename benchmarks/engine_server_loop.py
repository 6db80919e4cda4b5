"""The engine process's own ceiling: ``engine_loop``'s instant engine behind the engine socket.

    python -m benchmarks.engine_server_loop [--streams 32 128 256] [--frontends 2] [--duration 3]

With ``frontend_workers`` > 1 the decode loop runs in the engine process, whose event loop also
reads the frontends' requests from its Unix socket and writes their tokens back
(``serving.multiprocess.engine_server``). On a GPU host that process, not the model, bounds the
served translator: its engine thread and its event loop share one interpreter. This runs
``engine_loop``'s engine (a real ``InFlightEngine`` and in-place cache whose decoder step answers
at once, the encoder's output computed once and repeated) behind a real ``EngineServer`` in this
process, and ``--frontends`` client processes that drive their share of ``--streams`` 64-token
greedy streams through the frontends' own ``EngineClient`` / ``RemoteEngine`` (closed loop, no
gRPC), for ``--duration`` seconds after a warm-up.

Writes ``benchmarks/results/engine-server-loop-*.json``: per stream count, new tokens/s at the
clients, decode steps/s, rows per step, the engine process's CPU time per token (its engine
thread and event loop together) and the client processes' (what a frontend spends per token on
the engine's messages, before any gRPC); with ``--device-step-ms`` also the emulated device's
busy share, the engine thread's wait per step and the host's time between two steps
(``host_gap_ms``), and with ``--overlap`` the share of steps started ahead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine_loop import (
    DEFAULT_OUT,
    NEW_TOKENS,
    SOURCE,
    add_device_argument,
    add_repository_argument,
    default_repository,
    device_figures,
    device_of,
    engine_config,
    instant_engine,
)
from benchmarks.output import write_probe

MODEL = "translator"
# --spread: the fewest and most new tokens a request asks for (uniform; NEW_TOKENS on average)
SPREAD = (NEW_TOKENS // 2, NEW_TOKENS * 3 // 2)
CLIENT_START_S = 4.0  # a client process imports numpy and the serving package before it drives


async def _drive(
    address: str, streams: int, start_at: float, end_at: float, spread: bool = False
) -> dict[str, int]:
    """A client process: ``streams`` closed-loop streams; tokens and requests that arrived
    between ``start_at`` and ``end_at`` (wall-clock seconds). With ``spread`` each request asks
    for between half and one and a half times ``NEW_TOKENS`` (uniform, the same mean)."""
    from serving.engine.requests import GenerationRequest, TokenEvent
    from serving.generation.options import DecodingOptions
    from serving.multiprocess.remote import EngineClient, RemoteEngine

    client = EngineClient(address)
    await client.start()
    engine = RemoteEngine(client, MODEL, 1, streams)
    lengths = np.random.default_rng(os.getpid())
    counts = {"tokens": 0, "requests": 0, "cpu_us": 0}

    def options() -> DecodingOptions:
        if not spread:
            return DecodingOptions(max_new_tokens=NEW_TOKENS)
        return DecodingOptions(max_new_tokens=int(lengths.integers(SPREAD[0], SPREAD[1] + 1)))

    async def stream() -> None:
        while time.time() < end_at:
            request = GenerationRequest(options=options(), source_ids=np.array(SOURCE))
            async for chunk in engine.generate_chunks(request):
                if start_at <= time.time() < end_at:
                    counts["tokens"] += sum(isinstance(event, TokenEvent) for event in chunk)
            if start_at <= time.time() < end_at:
                counts["requests"] += 1

    async def clock() -> None:  # this process's CPU time over the window
        await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.process_time()
        await asyncio.sleep(max(0.0, end_at - time.time()))
        counts["cpu_us"] = round((time.process_time() - started) * 1e6)

    await asyncio.gather(clock(), *(stream() for _ in range(streams)))
    await client.close()
    return counts


async def _point(
    server: Any,
    engine: Any,
    address: str,
    streams: int,
    frontends: int,
    duration: float,
    warmup: float,
    device: Any = None,
    spread: bool = False,
) -> dict[str, Any]:
    start_at = time.time() + CLIENT_START_S + warmup
    end_at = start_at + duration
    shares = [streams // frontends + (i < streams % frontends) for i in range(frontends)]
    clients = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.engine_server_loop",
            "--client",
            json.dumps([address, share, start_at, end_at, spread]),
            stdout=asyncio.subprocess.PIPE,
        )
        for share in shares
        if share
    ]
    await asyncio.sleep(start_at - time.time())
    cpu, steps, ahead = time.process_time(), engine.steps, engine.steps_ahead
    blocks = engine.blocks
    before = device.totals() if device else (0.0, 0, 0.0)
    await asyncio.sleep(end_at - time.time())
    cpu, steps = time.process_time() - cpu, engine.steps - steps
    ahead, blocks = engine.steps_ahead - ahead, engine.blocks - blocks
    outputs = [await client.communicate() for client in clients]
    if any(client.returncode for client in clients):
        raise RuntimeError("a client process failed")
    counts = [json.loads(out) for out, _ in outputs]
    tokens = sum(c["tokens"] for c in counts)
    return {
        "streams": streams,
        "frontends": len(clients),
        "tokens": tokens,
        "requests": sum(c["requests"] for c in counts),
        "seconds": duration,
        "tokens_per_s": round(tokens / duration, 1),
        "steps_per_s": round(steps / duration, 1),
        "rows_per_step": round(tokens / steps, 2) if steps else 0.0,
        # with --overlap: the steps started before their predecessor's bookkeeping
        "steps_ahead_share": round(ahead / steps, 3) if steps else 0.0,
        # with --decode-block: decode blocks run (steps per block: steps / blocks)
        "blocks": blocks,
        "engine_process_cpu_share": round(cpu / duration, 3),
        "engine_process_us_per_token": round(cpu / tokens * 1e6, 2) if tokens else None,
        # the client processes' CPU (a frontend's engine-side work per token, without gRPC)
        "client_us_per_token": (
            round(sum(c["cpu_us"] for c in counts) / tokens, 2) if tokens else None
        ),
        **device_figures(device, before, duration),
    }


def measure(
    entry: Path,
    streams: list[int],
    frontends: int,
    duration: float,
    warmup: float,
    device_step_ms: float | None = None,
    join_interval_steps: int = 1,
    spread: bool = False,
    overlap: bool = False,
    block: int = 0,
) -> list[dict[str, Any]]:
    """One engine with rows for the most streams behind one engine server; each stream count
    driven in turn by ``frontends`` client processes. The collector is set as in the server."""
    from contract.repository import resolve_version
    from serving.gc_policy import settle
    from serving.multiprocess.engine_server import EngineServer
    from serving.repository import ModelRepository
    from serving.served.generator import ServedGenerator

    device = device_of(device_step_ms)
    limit = SPREAD[1] if spread else NEW_TOKENS  # the most a request asks for
    engine, _ = instant_engine(
        entry,
        max(streams),
        instant_encoder=True,
        device=device,
        join_interval_steps=join_interval_steps,
        max_new_tokens=limit,
        overlap=overlap,
        block=block,
    )
    config = engine_config(entry, max(streams), join_interval_steps, limit, overlap)
    model = ServedGenerator(config, resolve_version(entry), None, engine=engine)
    settle(True, 0)
    engine.start()
    points = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            address = os.path.join(folder, "engine.sock")

            async def run(n: int) -> dict[str, Any]:
                server = EngineServer(ModelRepository([model]), address)
                await server.bind()
                try:
                    return await _point(
                        server, engine, address, n, frontends, duration, warmup, device, spread
                    )
                finally:
                    await server.close()  # removes the socket file: the next point binds anew

            for n in streams:
                points.append(asyncio.run(run(n)))
    finally:
        engine.stop()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_server_loop")
    parser.add_argument("--streams", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--frontends", type=int, default=2, help="client processes")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each point")
    add_repository_argument(parser)
    add_device_argument(parser)
    parser.add_argument(
        "--join-interval-steps",
        type=int,
        default=1,
        help="the model's batching.join_interval_steps (default 1: join at every step)",
    )
    parser.add_argument(
        "--spread",
        action="store_true",
        help=f"each request asks for {SPREAD[0]}-{SPREAD[1]} new tokens (uniform) "
        f"instead of {NEW_TOKENS}: the streams fall out of step, so requests join and leave at "
        "nearly every step, as in real traffic",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tiny", action="store_true", help="short points (CI smoke run)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a client process's own arguments
    args = parser.parse_args(argv)
    if args.client:
        address, streams, start_at, end_at, spread = json.loads(args.client)
        print(json.dumps(asyncio.run(_drive(address, streams, start_at, end_at, spread))))
        return 0
    args.repository = args.repository or default_repository()
    duration, warmup = (1.0, 0.2) if args.tiny else (args.duration, args.warmup)
    points = measure(
        args.repository / MODEL,
        args.streams,
        args.frontends,
        duration,
        warmup,
        args.device_step_ms,
        args.join_interval_steps,
        args.spread,
        args.overlap,
        args.decode_block,
    )
    write_probe(
        "engine-server-loop",
        points,
        args.out,
        args.tiny,
        duration,
        new_tokens=NEW_TOKENS,
        frontends=args.frontends,
        device_step_ms=args.device_step_ms,
        join_interval_steps=args.join_interval_steps,
        spread=args.spread,
        overlap=args.overlap,
        decode_block=args.decode_block,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
