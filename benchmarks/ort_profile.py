"""Where a decode step's time goes: ONNX Runtime's profiler over the engine benchmark's decoding.

    python -m benchmarks.ort_profile [--precision fp32] [--batch 1 16] [--threads 2] [--tiny]

Exports (or reuses from the benchmark cache) the Marian-shaped entry that `attnserve bench
engine` uses, decodes 64 tokens per row with the same ``fixed_greedy`` loop under ONNX Runtime's
profiler, and writes ``benchmarks/results/ort-profile-*.json``: per batch size, ms per decode
step and each operator type's share of the decoder's kernel time. This is the profile the
engine goals' gaps are explained with (MatMul share = weight-bound, Concat = KV-cache copies).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.attnserve_runner import entry_decode_attention, export_attnserve, fixed_greedy
from benchmarks.machine import machine_metadata
from benchmarks.marian import (
    BASE,
    EOS_ID,
    TINY,
    MarianShape,
    build_marian,
    default_cache,
    source_ids,
)
from benchmarks.output import timestamp
from contract.graphs import DECODE_ATTENTIONS

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def op_shares(profile: list[dict[str, Any]]) -> tuple[dict[str, float], float, int]:
    """(operator type -> share of kernel time, kernel microseconds, runs) of a profile."""
    by_op: collections.Counter[str] = collections.Counter()
    runs = 0
    for event in profile:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            runs += 1
    total = float(sum(by_op.values()))
    shares = {op: round(us / total, 4) for op, us in by_op.most_common()} if total else {}
    return shares, total, runs


def profile_batch(
    entry: Path,
    batch: int,
    threads: int,
    new_tokens: int,
    shape: MarianShape,
    kv_cache: Literal["inplace", "growing"] = "inplace",
) -> dict[str, Any]:
    """Decode one batch under the profiler; ms per step and operator shares."""
    import onnxruntime as ort

    from contract.graphs import DECODER_INPLACE, INPLACE_GRAPH_FILES, graph_files
    from contract.model_config import GeneratorConfig
    from contract.repository import read_model_config, resolve_version
    from serving.backends.onnxruntime import OnnxRuntimeBackend, session_options
    from serving.engine.padded_cache import PaddedKVCache
    from serving.seq2seq import Seq2SeqRunner
    from serving.served.generator import inplace_cache

    config = read_model_config(entry)
    assert isinstance(config, GeneratorConfig)
    options = replace(
        config.onnxruntime,
        intra_op_threads=threads,
        allow_spinning=True,
        cpu_memory_arena=True,
        kv_cache=kv_cache,
    )
    batching = replace(config.batching, max_active_sequences=batch)
    config = replace(config, onnxruntime=options, batching=batching)
    version = resolve_version(entry)
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES}
    graph = DECODER_INPLACE if kv_cache == "inplace" else "decoder"
    backend = OnnxRuntimeBackend(version, files, options)
    with tempfile.TemporaryDirectory() as scratch:
        so = session_options(options)
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(scratch) / "decoder")
        decoder = ort.InferenceSession(str(version / files[graph]), so, providers=backend.providers)
        backend._sessions[graph] = decoder  # the profiled session replaces the plain one
        runner = Seq2SeqRunner(backend, config.decoder)
        cache = (
            inplace_cache(backend, config)
            if kv_cache == "inplace"
            else PaddedKVCache(runner, batch * config.decoder.max_positions)
        )
        rng = np.random.default_rng(0)
        ids = source_ids(rng, batch, 32, shape)
        encoded = runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        started = time.perf_counter()
        fixed_greedy(cache, encoded, config.decoder, new_tokens, [EOS_ID])
        wall = time.perf_counter() - started
        shares, kernel_us, runs = op_shares(json.loads(Path(decoder.end_profiling()).read_text()))
    return {
        "batch": batch,
        "decoder_runs": runs,
        "ms_per_step_profiled": round(wall / new_tokens * 1000, 3),
        "kernel_ms_per_step": round(kernel_us / max(runs, 1) / 1000, 3),
        "op_share": shares,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ort_profile")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-cache", choices=("inplace", "growing"), default="inplace", help="decoder graph"
    )
    parser.add_argument(
        "--decode-attention",
        choices=DECODE_ATTENTIONS,
        default=None,
        help="the in-place decoder's attention (default: the precision's export default)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny model (CI smoke run)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else BASE
    cache = args.cache or default_cache()
    marian = build_marian(cache, shape)
    entry = export_attnserve(
        marian, cache, shape, args.precision, fast_int8=True, decode_attention=args.decode_attention
    )
    attention = entry_decode_attention(entry)
    new_tokens = 8 if args.tiny else 64
    result = {
        "schema": "attnserve-ort-profile/1",
        "kind": "ort-profile",
        "tiny": args.tiny,
        "precision": args.precision,
        "kv_cache": args.kv_cache,
        "decode_attention": attention,
        "threads": args.threads,
        "new_tokens": new_tokens,
        "machine": machine_metadata("cpu"),
        "note": "profiling adds overhead: compare shares, not absolute times",
        "batches": [
            profile_batch(entry, b, args.threads, new_tokens, shape, args.kv_cache)
            for b in args.batch
        ],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = (
        args.out / f"ort-profile-{args.precision}-{args.kv_cache}-{attention}-{timestamp()}"
        f"{'-tiny' if args.tiny else ''}.json"
    )
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
