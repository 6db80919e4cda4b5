"""What the response cache gives and costs: the same server without and with
``--cache-config`` (the ViT and the translator set ``response_cache: true``), in alternated runs,
and the cache's own work per request.

    python -m benchmarks.response_cache [--repository DIR] [--duration 15] [--pairs 2]
        [--concurrency 1,8] [--out DIR]

Per pair, two ``attnserve serve`` processes in turn (off then cached, or cached then off: the
order alternates from pair to pair, as this VM's speed drifts); per server, closed-loop KServe
``ModelInfer`` with one request repeated (the ViT: one 32 × 32 image; the translator: one short
text), so that with the cache every request after the first is a hit: the upper bound of what
the cache gives. Then, in this process, the cache's work for each of those requests as it
happens in a server: a miss's key and insertion, and a hit's key, lookup and answer (µs, the
median of 2,000). Writes requests/s and p50 / p99 latency per point, the cached / off ratios of
each pair and the per-request costs to ``benchmarks/results/response-cache/response-cache-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.loadgen import Workload, kserve_request
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.repository_copy import linked_copy, rewrite_config
from benchmarks.served_pairs import add_pair_arguments, drive, ratios, repository_of
from benchmarks.server_process import ServeProcess

CACHED_MODELS = ("vit", "translator")
CACHE_BYTES = 64 << 20
TEXT = "three hundred and forty-seven"


def workloads() -> dict[str, Workload]:
    image = np.random.default_rng(0).integers(0, 256, (1, 32, 32, 3), np.uint8)
    return {
        "vit": Workload("kserve_infer", "vit", tensors=(("image", "UINT8", image),)),
        "translator": Workload(
            "kserve_infer",
            "translator",
            tensors=(
                ("text", "BYTES", np.array([[TEXT.encode()]], dtype=object)),
                ("target_language", "BYTES", np.array([[b"de"]], dtype=object)),
            ),
        ),
    }


def cached_copy(repository: Path, folder: Path) -> Path:
    """``repository``'s ViT and translator, with ``response_cache: true`` (files linked)."""
    root = linked_copy(repository, folder / "repository", CACHED_MODELS)
    for name in CACHED_MODELS:
        rewrite_config(root / name, response_cache=True)
    return root


def run_server(
    root: Path, cached: bool, settings: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """One server's points, and its ModelStatistics' cache hits and misses per model."""
    server = ServeProcess(
        root,
        *("--host", "127.0.0.1", "--metrics-port", "-1", "--log-level", "WARNING"),
        *(("--cache-config", f"local,size={CACHE_BYTES}") if cached else ()),
        grace=2,
    ).start()
    try:
        points = asyncio.run(
            drive(server, workloads(), settings.concurrency, settings.duration, settings.warmup)
        )
        return points, cache_counts(server.address)
    finally:
        server.stop()


def cache_counts(address: str) -> dict[str, dict[str, int]]:
    import grpc

    from serving.proto_gen.inference import grpc_service_pb2 as kpb
    from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

    with grpc.insecure_channel(address) as channel:
        reply = kpb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            kpb.ModelStatisticsRequest(), timeout=30
        )
    return {
        stats.name: {
            "hits": stats.inference_stats.cache_hit.count,
            "misses": stats.inference_stats.cache_miss.count,
            "inferences": stats.inference_count,
        }
        for stats in reply.model_stats
    }


def per_request_costs(root: Path, rounds: int = 2000) -> dict[str, dict[str, float]]:
    """The cache's work for each workload's request, in µs (medians): a miss's key and insertion
    of the serialized response, a hit's key, lookup and parsed answer; and the sizes."""
    from serving.kserve.execute import infer
    from serving.kserve.request import prepare
    from serving.metrics import ServingMetrics
    from serving.proto_gen.inference import grpc_service_pb2 as kpb
    from serving.repository import ModelRepository
    from serving.response_cache import ResponseCache, cache_key

    async def measure_all() -> dict[str, dict[str, float]]:
        repository = ModelRepository.load(root, ServingMetrics())
        await repository.start()
        costs = {}
        try:
            for name, workload in workloads().items():
                request = kserve_request(workload.model, workload.tensors)
                call = prepare(repository.get(name), request, None)
                reply = await infer(call)
                cache = ResponseCache(CACHE_BYTES)
                misses, hits = [], []
                first = b""
                for i in range(rounds):  # each a new entry, as a miss stores one
                    started = time.perf_counter()
                    key = cache_key(call) or b""
                    cache.put(key + i.to_bytes(4, "little"), reply.SerializeToString())
                    misses.append(time.perf_counter() - started)
                    first = first or key + i.to_bytes(4, "little")
                for _ in range(rounds):
                    started = time.perf_counter()
                    held = cache.get(first)
                    answer = kpb.ModelInferResponse.FromString(held or b"")
                    answer.id = "x"
                    hits.append(time.perf_counter() - started)
                keying = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    cache_key(call)
                    keying.append(time.perf_counter() - started)
                costs[name] = {
                    "miss_us": round(statistics.median(misses) * 1e6, 2),
                    "hit_us": round((statistics.median(hits) + statistics.median(keying)) * 1e6, 2),
                    "key_us": round(statistics.median(keying) * 1e6, 2),
                    "request_bytes": request.ByteSize(),
                    "response_bytes": reply.ByteSize(),
                }
        finally:
            await repository.stop(0)
        return costs

    return asyncio.run(measure_all())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.response_cache")
    add_pair_arguments(parser, DEFAULT_RESULTS / "response-cache")
    args = parser.parse_args(argv)
    args.repository = repository_of(args)
    points: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnserve-response-cache-") as scratch:
        root = cached_copy(args.repository, Path(scratch))
        for pair in range(args.pairs):
            runs: dict[bool, list[dict[str, Any]]] = {}
            counts = {}
            for cached in (False, True) if pair % 2 == 0 else (True, False):
                log(f"pair {pair}: response cache {'on' if cached else 'off'}")
                runs[cached], counts[cached] = run_server(root, cached, args)
                points += [{"pair": pair, "cached": cached, **p} for p in runs[cached]]
            pairs.append(
                {
                    "pair": pair,
                    "ratios": ratios(runs[False], runs[True]),
                    "cache": counts[True],
                    "off": counts[False],
                }
            )
        costs = per_request_costs(root)
    write_probe(
        "response-cache",
        points,
        args.out,
        False,
        args.duration,
        pairs=pairs,
        per_request=costs,
        cache_bytes=CACHE_BYTES,
        text=TEXT,
    )
    for record in [*pairs, costs]:
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
