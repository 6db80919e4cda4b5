"""ONNX Runtime's CPU ``Attention`` alone, against the same attention as plain operators.

    python -m benchmarks.attention_probe [--batches 16 32] [--positions 32 64] [--threads 2]

One decode step's attention of the engine benchmark's model (8 heads of 64, one query per row)
over a float cache of ``--positions`` keys and values per row, laid out as the in-place cache is
([batch, heads, positions, 64]): ONNX's ``Attention`` (opset 24, ``nonpad_kv_seqlen``), as the
exported decoders run it, and ``FusedMatMul`` (keys transposed in the kernel) / ``Softmax`` /
``MatMul`` with an additive mask. Both run on the same inputs (their outputs are compared), each
timed as the median of ``--calls`` runs after 20, alternated twice. The cache stays in the CPU's
caches between calls, so this is the kernels' speed, not a decode step's (which reads every
layer's cache from memory). Writes ``benchmarks/results/attention-probe-*.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from benchmarks.output import DEFAULT_RESULTS, write_probe

HEADS, HEAD_SIZE = 8, 64
WARMUP_CALLS = 20


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _models(batch: int, positions: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(the ``Attention`` node, the plain operators) over the same shapes."""

    def value(name: str, kind: int, dims: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, kind, dims)

    q = value("q", TensorProto.FLOAT, [batch, HEADS, 1, HEAD_SIZE])
    k = value("k", TensorProto.FLOAT, [batch, HEADS, positions, HEAD_SIZE])
    v = value("v", TensorProto.FLOAT, [batch, HEADS, positions, HEAD_SIZE])
    y = value("y", TensorProto.FLOAT, [batch, HEADS, 1, HEAD_SIZE])
    lengths = value("lengths", TensorProto.INT64, [batch])
    mask = value("mask", TensorProto.FLOAT, [batch, 1, 1, positions])
    fused = helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v", "", "", "", "lengths"], ["y"])],
        "attention",
        [q, k, v, lengths],
        [y],
    )
    plain = helper.make_graph(
        [
            helper.make_node(
                "FusedMatMul",
                ["q", "k"],
                ["scores"],
                domain="com.microsoft",
                transB=1,
                alpha=float(1 / np.sqrt(HEAD_SIZE)),
            ),
            helper.make_node("Add", ["scores", "mask"], ["masked"]),
            helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
            helper.make_node("MatMul", ["weights", "v"], ["y"]),
        ],
        "plain",
        [q, k, v, mask],
        [y],
    )
    return (
        helper.make_model(fused, opset_imports=[helper.make_opsetid("", 24)]),
        helper.make_model(
            plain,
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ),
    )


def _median_us(session: ort.InferenceSession, feeds: dict[str, np.ndarray], calls: int) -> float:
    for _ in range(WARMUP_CALLS):
        session.run(None, feeds)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def probe(batch: int, positions: int, threads: int, calls: int) -> dict[str, object]:
    """One shape's point: microseconds per call of each form (two alternated rounds)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, HEADS, 1, HEAD_SIZE), dtype=np.float32)
    k = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    v = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    fused_model, plain_model = _models(batch, positions)
    fused, plain = _session(fused_model, threads), _session(plain_model, threads)
    fused_feeds = {"q": q, "k": k, "v": v, "lengths": np.full(batch, positions, dtype=np.int64)}
    plain_feeds = {"q": q, "k": k, "v": v, "mask": np.zeros((batch, 1, 1, positions), np.float32)}
    difference = np.abs(fused.run(None, fused_feeds)[0] - plain.run(None, plain_feeds)[0]).max()
    rounds = [
        (_median_us(fused, fused_feeds, calls), _median_us(plain, plain_feeds, calls))
        for _ in range(2)
    ]
    cache_mb = (k.nbytes + v.nbytes) / 1e6
    return {
        "batch": batch,
        "positions": positions,
        "threads": threads,
        "cache_mb": round(cache_mb, 2),
        "max_abs_difference": float(difference),
        "attention_us": [round(a, 1) for a, _ in rounds],
        "plain_us": [round(p, 1) for _, p in rounds],
        "attention_gb_per_s": [round(cache_mb / a * 1e3, 1) for a, _ in rounds],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_probe")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--positions", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    points = [
        probe(batch, positions, threads, args.calls)
        for threads in args.threads
        for batch in args.batches
        for positions in args.positions
    ]
    write_probe(
        "attention-probe",
        points,
        args.out,
        tiny=False,
        duration_s=round(time.perf_counter() - started, 1),
        heads=HEADS,
        head_size=HEAD_SIZE,
        onnxruntime=ort.__version__,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
