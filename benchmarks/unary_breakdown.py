"""Where a unary Translate of one new token spends its time, one call at a time.

    python -m benchmarks.unary_breakdown [--repository DIR] [--calls 300] [--out DIR]

The serving goal "unary Translate overhead p50 <= 1 ms" is the client's latency minus the
engine's own time (encode, cache admission, one decoder step). This probe splits the rest: it
serves the repository's translator from a server in this process (its own event loop and thread,
as ``attnserve serve`` with one process), wraps the handler and the engine's stages with clock
reads, and makes ``--calls`` sequential calls from a synchronous gRPC client after 50 warm-up
calls. Per stage it writes the median time since the client sent the call, and the median time
from the previous stage (``benchmarks/results/unary-breakdown-*.json``). The wrappers add a few
microseconds per stage; the client shares the process (its thread waits in gRPC's C core).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.output import DEFAULT_RESULTS, write_probe

WARMUP_CALLS = 50
TEXT = "three hundred and forty-seven"
STAGES = (
    "handler_entry",  # the servicer method runs (transport, interceptors, parsing done)
    "engine_enqueue",  # the request reaches the engine (options, tokenising, request built)
    "engine_admits",  # the engine thread takes it
    "encode_start",
    "encode_end",
    "step_start",  # after the cache admission (cross K/V written into its rows)
    "step_end",
    "finish_posted",  # the engine thread hands the result to the event loop
    "result_in_loop",  # the handler's coroutine has it
    "handler_return",  # the response is built
    "client_done",  # the response reached the client
)


class Clock:
    """The first time each stage is reached during the current call."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def stamp(self, stage: str) -> None:
        self.times.setdefault(stage, time.perf_counter())

    def around(self, function: Callable, before: str, after: str | None = None) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stamp(before)
            try:
                return function(*args, **kwargs)
            finally:
                if after is not None:
                    self.stamp(after)

        return timed


def instrument(clock: Clock) -> Callable[[], None]:
    """Wrap the stages (class attributes: before the server is created); returns what puts the
    originals back."""
    from serving.engine.inflight import InFlightEngine
    from serving.engine.inplace_cache import InPlaceKVCache
    from serving.engine.padded_cache import PaddedKVCache
    from serving.seq2seq import Seq2SeqRunner
    from serving.services.attnserve import AttnServeServicer

    originals = [
        (owner, name, owner.__dict__[name])
        for owner, name in (
            (AttnServeServicer, "Translate"),
            (InFlightEngine, "generate_chunks"),
            (InFlightEngine, "_admit"),
            (InFlightEngine, "_finish"),
            (Seq2SeqRunner, "encode"),
            *(
                (cache, step)
                for cache in (InPlaceKVCache, PaddedKVCache)
                for step in ("step", "step_greedy")
            ),
        )
    ]
    translate = AttnServeServicer.Translate

    async def handler(self: Any, request: Any, context: Any) -> Any:
        clock.stamp("handler_entry")
        response = await translate(self, request, context)
        clock.stamp("handler_return")
        return response

    setattr(AttnServeServicer, "Translate", handler)  # noqa: B010 (instrumentation)
    chunks = InFlightEngine.generate_chunks

    async def generate_chunks(self: Any, request: Any) -> Any:
        clock.stamp("engine_enqueue")
        async for chunk in chunks(self, request):
            clock.stamp("result_in_loop")
            yield chunk

    patches: list[tuple[Any, str, Any]] = [
        (InFlightEngine, "generate_chunks", generate_chunks),
        (InFlightEngine, "_admit", clock.around(InFlightEngine._admit, "engine_admits")),
        (InFlightEngine, "_finish", clock.around(InFlightEngine._finish, "finish_posted")),
        (Seq2SeqRunner, "encode", clock.around(Seq2SeqRunner.encode, "encode_start", "encode_end")),
    ]
    for cache in (InPlaceKVCache, PaddedKVCache):
        patches.append((cache, "step", clock.around(cache.step, "step_start", "step_end")))
        step_greedy = clock.around(cache.step_greedy, "step_start", "step_end")
        patches.append((cache, "step_greedy", step_greedy))
    for owner, name, wrapped in patches:  # setattr: mypy refuses assignments to methods
        setattr(owner, name, wrapped)

    def restore() -> None:
        for owner, name, original in originals:
            setattr(owner, name, original)

    return restore


def measure(repository: Path, calls: int) -> list[dict[str, Any]]:
    """Per stage: median ms since the call was sent, and since the stage before."""
    import grpc

    from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
    from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
    from serving.server import create_server
    from serving.server_config import ServerConfig

    clock = Clock()
    restore = instrument(clock)
    loop = asyncio.new_event_loop()
    config = ServerConfig(repository=str(repository), port=0, metrics_port=-1)
    running = loop.run_until_complete(create_server(config))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    samples: list[dict[str, float]] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.AttnServeStub(channel)
            options = pb.DecodingOptions(max_new_tokens=1)
            request = pb.TranslateRequest(texts=[TEXT], target_language="de", options=options)
            for call in range(WARMUP_CALLS + calls):
                clock.times.clear()
                sent = time.perf_counter()
                stub.Translate(request, timeout=30)
                clock.stamp("client_done")
                if call >= WARMUP_CALLS:
                    samples.append({k: (t - sent) * 1e3 for k, t in clock.times.items()})
    finally:
        asyncio.run_coroutine_threadsafe(running.stop(grace=1), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        restore()
    points, previous = [], 0.0
    for stage in STAGES:
        at = statistics.median(s[stage] for s in samples)
        points.append(
            {"stage": stage, "ms": round(at, 4), "since_previous_ms": round(at - previous, 4)}
        )
        previous = at
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.unary_breakdown")
    parser.add_argument(
        "--repository",
        type=Path,
        help="default: the shipped models, exported into the benchmark cache on first use",
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "unary-breakdown")
    args = parser.parse_args(argv)
    if args.repository is None:
        from benchmarks.marian import default_cache
        from benchmarks.serve_setups import shipped_repository

        args.repository = shipped_repository(default_cache())
    points = measure(args.repository, args.calls)
    write_probe("unary-breakdown", points, args.out, False, 0.0, calls=args.calls, text=TEXT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
