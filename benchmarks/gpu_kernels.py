"""What a decode step launches on a GPU: kernels and copies per step, and how busy they keep it.

    python -m benchmarks.gpu_kernels [--batches 1 64] [--precisions fp32 fp16] [--no-cuda-graphs]
        [--decode-attentions fused matmul]

At small batches a decode step on a GPU is mostly kernel launches: the step's time is its number
of kernels times a few microseconds, not its FLOPs. This decodes 64 tokens per row of the
Marian-base entry that ``attnserve bench engine`` uses (exported into the same cache), through
the same ``fixed_greedy`` loop and CUDA graphs, under PyTorch's profiler, whose CUPTI tracing
records every kernel and copy in the process, ONNX Runtime's included. Writes
``benchmarks/results/gpu-kernels-*.json``: per precision, decode attention and batch, the wall
time per step (a run without the profiler), kernels and copies per step, the GPU's busy time per
step (the union of the kernels' intervals), and the kernels that take the most of it.

Needs a CUDA GPU, onnxruntime-gpu and torch with CUDA (the device image has both).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import write_probe
from contract.graphs import DECODE_ATTENTIONS

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
KERNEL, COPY = "kernel", "gpu_memcpy"  # the chrome trace's categories (PyTorch's kineto)
TOP_KERNELS = 15


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, duration) intervals."""
    covered, end = 0.0, float("-inf")
    for start, duration in sorted(intervals):
        stop = start + duration
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def kernel_summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per decode step: kernels, copies, GPU busy microseconds, and the top kernels by time.

    Args:
        events: a chrome trace's ``traceEvents`` (complete events, ``ph`` "X").
        steps: decode steps the trace covers.
    """
    kernels = [e for e in events if e.get("cat") == KERNEL and e.get("ph") == "X"]
    copies = [e for e in events if e.get("cat") == COPY and e.get("ph") == "X"]
    by_name: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for event in kernels:
        by_name[event["name"]] += event["dur"]
        count[event["name"]] += 1
    busy = busy_us([(e["ts"], e["dur"]) for e in kernels + copies])
    total = sum(by_name.values())
    return {
        "kernels_per_step": round(len(kernels) / steps, 2),
        "copies_per_step": round(len(copies) / steps, 2),
        "gpu_busy_us_per_step": round(busy / steps, 1),
        "kernel_us_per_step": round(total / steps, 1),
        "top_kernels": [
            {
                "name": name[:160],
                "per_step": round(count[name] / steps, 2),
                "us_per_step": round(us / steps, 2),
                "share": round(us / total, 4),
            }
            for name, us in by_name.most_common(TOP_KERNELS)
        ],
    }


def profile_point(runner: Any, ids: np.ndarray, new_tokens: int) -> dict[str, Any]:
    """Wall ms per step (plain run), then one profiled decode's kernel summary (in the runner's
    decode blocks where it has them)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.attnserve_runner import fixed_greedy

    block = runner.decode_block > 0
    for _ in range(2):  # the CUDA graphs of this batch's shapes are captured here
        runner.run(ids)
    encoded = runner.runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    started = time.perf_counter()
    fixed_greedy(runner.cache, encoded, runner.spec, new_tokens, [runner.spec.eos_id], block)
    wall = time.perf_counter() - started
    encoded = runner.runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fixed_greedy(runner.cache, encoded, runner.spec, new_tokens, [runner.spec.eos_id], block)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    return {"wall_ms_per_step": round(wall / new_tokens * 1000, 3)} | kernel_summary(
        events, new_tokens
    )


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from benchmarks.attnserve_runner import AttnServeRunner, export_attnserve
    from benchmarks.block_entry import with_decode_block
    from benchmarks.marian import BASE, build_marian, default_cache, source_ids

    cache = args.cache or default_cache()
    marian = build_marian(cache, BASE)
    points = []
    combinations = itertools.product(args.precisions, args.decode_attentions, args.decode_blocks)
    for precision, attention, steps in combinations:
        entry = export_attnserve(marian, cache, BASE, precision, False, decode_attention=attention)
        if steps:
            with_decode_block(entry, steps)
        for batch in args.batches:
            runner = AttnServeRunner(
                entry,
                precision,
                args.new_tokens,
                threads=1,
                device="cuda",
                max_batch=batch,
                cuda_graph=not args.no_cuda_graphs,
                decode_attention=attention,
                decode_block=steps,
            )
            ids = source_ids(np.random.default_rng(0), batch, 32, BASE)
            point = {"precision": precision, "decode_attention": attention, "batch": batch}
            point["decode_block"] = steps
            point |= profile_point(runner, ids, args.new_tokens)
            print(json.dumps(point), file=sys.stderr, flush=True)  # progress
            points.append(point)
            runner.close()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kernels")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--precisions", nargs="+", choices=("fp32", "fp16"), default=["fp32", "fp16"]
    )
    parser.add_argument(
        "--decode-attentions",
        nargs="+",
        choices=DECODE_ATTENTIONS,
        default=["fused"],
        help="the in-place decoder's attention: the fused op (the GPU default) and/or MatMuls",
    )
    parser.add_argument(
        "--decode-blocks",
        nargs="+",
        type=int,
        default=[0],
        help="greedy steps per decode block (batching.decode_block): 0 single steps, K >= 2 "
        "blocks of K (e.g. 0 4)",
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        import onnxruntime
        import torch
    except ImportError as err:
        print(f"gpu_kernels needs torch and onnxruntime-gpu: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or (
        "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
    ):
        print(
            "gpu_kernels needs a CUDA GPU: torch.cuda.is_available() and onnxruntime's "
            "CUDAExecutionProvider (install onnxruntime-gpu)",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    points = measure(args)
    write_probe(
        "gpu-kernels",
        points,
        args.out,
        tiny=False,
        duration_s=round(time.perf_counter() - started, 1),
        device="cuda",
        model="Marian-base (bench engine's), source 32 tokens",
        new_tokens=args.new_tokens,
        cuda_graphs=not args.no_cuda_graphs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
