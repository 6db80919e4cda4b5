"""Quick serving figures: single-request latency and 32 concurrent translation streams.

    attnserve export-all export/plans/shipped.yaml --repository /tmp/shiprepo
    python -m benchmarks.quick_serve /tmp/shiprepo [--out result.json]

Starts a real server on a loopback port, measures 200 sequential unary Translate calls (one short
held-out text each) and 400 TranslateStream calls from 32 client threads, prints JSON. The full
load generator (closed / open loop, batching on / off, peers) is `attnserve bench serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from models.data.translation import Pair, generate_pairs
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.server import create_server
from serving.server_config import ServerConfig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def unary_latency(stub: pb_grpc.AttnServeStub, pairs: list[Pair]) -> dict[str, Any]:
    """Sequential unary calls: the latency a lone client sees."""

    def call(pair: Pair) -> tuple[float, int]:
        start = time.perf_counter()
        response = stub.Translate(
            pb.TranslateRequest(texts=[pair.source], target_language=pair.lang)
        )
        return time.perf_counter() - start, len(response.translations[0].token_ids)

    for pair in pairs[:20]:  # warm-up
        call(pair)
    results = [call(pair) for pair in pairs[:200]]
    ms = [seconds * 1000 for seconds, _ in results]
    return {
        "requests": len(results),
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(percentile(ms, 0.9), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_new_tokens": round(statistics.mean(n for _, n in results), 2),
    }


def concurrent_streams(
    stub: pb_grpc.AttnServeStub, pairs: list[Pair], clients: int = 32
) -> dict[str, Any]:
    """``clients`` threads streaming translations back to back: served throughput."""

    def stream(pair: Pair) -> tuple[float, float, int]:
        start = time.perf_counter()
        first, tokens = 0.0, 0
        request = pb.TranslateStreamRequest(text=pair.source, target_language=pair.lang)
        for message in stub.TranslateStream(request):
            if message.token_ids:
                tokens += len(message.token_ids)
                first = first or time.perf_counter() - start
        return time.perf_counter() - start, first, tokens

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(stream, pairs[:64]))  # warm-up
        start = time.perf_counter()
        results = list(pool.map(stream, pairs))
        wall = time.perf_counter() - start
    latency = [r[0] * 1000 for r in results]
    return {
        "clients": clients,
        "requests": len(results),
        "requests_per_s": round(len(results) / wall, 1),
        "new_tokens_per_s": round(sum(r[2] for r in results) / wall, 1),
        "ttft_p50_ms": round(statistics.median(r[1] * 1000 for r in results), 1),
        "latency_p50_ms": round(statistics.median(latency), 1),
        "latency_p99_ms": round(percentile(latency, 0.99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    config = ServerConfig(repository=str(args.repository), port=0, metrics_port=-1)
    running = loop.run_until_complete(create_server(config))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        stub = pb_grpc.AttnServeStub(grpc.insecure_channel(f"127.0.0.1:{running.port}"))
        pairs = generate_pairs(400, seed=77, split="test")
        result = {
            "single_request_unary": unary_latency(stub, pairs),
            "concurrency_32_streams": concurrent_streams(stub, pairs),
        }
    finally:
        asyncio.run_coroutine_threadsafe(running.stop(1.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
