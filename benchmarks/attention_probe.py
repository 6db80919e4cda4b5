"""ONNX Runtime's CPU ``Attention`` alone, against the same attention as plain operators.

    python -m benchmarks.attention_probe [--batches 16 32] [--positions 32 64] [--threads 2]
                                         [--layers 12]

One decode step's attention of the engine benchmark's model (8 heads of 64, one query per row)
over a float cache of ``--positions`` keys and values per row, laid out as the in-place cache is
([batch, heads, positions, 64]), in three forms that compute the same values:

- ``attention``: ONNX's ``Attention`` op (opset 24, ``nonpad_kv_seqlen``), as the exported
  decoders with ``--decode-attention fused`` run it;
- ``query_keys``: ``FusedMatMul`` of the query by the transposed keys, ``Softmax``, ``MatMul`` by
  the values (what the op computes, as plain operators);
- ``keys_query``: the keys by the query as a column, then the same: the in-place decoder's
  ``--decode-attention matmul`` (``export.matmul_attention``, the int8 default), its mask made
  from the lengths in the graph.

Each form runs over ``--layers`` caches in turn (12: a Marian-base step's self- and
cross-attentions, whose caches together outgrow a 32 MB L3 from batch 16 × 64 positions, as in
a decode step; 1: one cache, read from the CPU's caches), timed as the median of ``--calls``
passes after a warm-up, alternated twice. Writes ``benchmarks/results/attention-probe-*.json``:
µs per attention per form and round, and the largest difference from the op's output.
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
from export.matmul_attention import (
    PREFIX,
    attention_constants,
    length_mask,
    matmul_decode_attention,
)

HEADS, HEAD_SIZE = 8, 64
FORMS = ("attention", "query_keys", "keys_query")


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _models(batch: int, positions: int) -> dict[str, onnx.ModelProto]:
    """Each form over the same shapes; inputs q, k, v, lengths; output y."""

    def value(name: str, kind: int, dims: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, kind, dims)

    scale = float(1 / np.sqrt(HEAD_SIZE))
    inputs = [
        value("q", TensorProto.FLOAT, [batch, HEADS, 1, HEAD_SIZE]),
        value("k", TensorProto.FLOAT, [batch, HEADS, positions, HEAD_SIZE]),
        value("v", TensorProto.FLOAT, [batch, HEADS, positions, HEAD_SIZE]),
        value("lengths", TensorProto.INT64, [batch]),
    ]
    y = [value("y", TensorProto.FLOAT, [batch, HEADS, 1, HEAD_SIZE])]
    mask = length_mask("k", "lengths", "mask", 2, PREFIX)
    nodes = {
        "attention": [helper.make_node("Attention", ["q", "k", "v", "", "", "", "lengths"], ["y"])],
        "query_keys": [
            *mask,
            helper.make_node(
                "FusedMatMul", ["q", "k"], ["s"], domain="com.microsoft", transB=1, alpha=scale
            ),
            helper.make_node("Add", ["s", "mask"], ["m"]),
            helper.make_node("Softmax", ["m"], ["w"], axis=-1),
            helper.make_node("MatMul", ["w", "v"], ["y"]),
        ],
        "keys_query": [*mask, *matmul_decode_attention("q", "k", "v", "mask", "y")],
    }
    opsets = [helper.make_opsetid("", 24), helper.make_opsetid("com.microsoft", 1)]
    return {
        form: helper.make_model(
            helper.make_graph(graph, form, inputs, y, initializer=attention_constants(scale)),
            opset_imports=opsets,
        )
        for form, graph in nodes.items()
    }


def _median_us(session: ort.InferenceSession, caches: list[dict], calls: int) -> float:
    """µs per attention: the median pass over every cache, divided by their number."""
    for feeds in caches * 2:
        session.run(None, feeds)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        for feeds in caches:
            session.run(None, feeds)
        times.append((time.perf_counter() - started) / len(caches))
    return statistics.median(times) * 1e6


def probe(batch: int, positions: int, threads: int, calls: int, layers: int) -> dict[str, object]:
    """One shape's point: µs per attention of each form (two alternated rounds)."""
    rng = np.random.default_rng(0)
    caches = [
        {
            "q": rng.standard_normal((batch, HEADS, 1, HEAD_SIZE), dtype=np.float32),
            "k": rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32),
            "v": rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32),
            "lengths": rng.integers(1, positions + 1, batch).astype(np.int64),
        }
        for _ in range(layers)
    ]
    sessions = {form: _session(model, threads) for form, model in _models(batch, positions).items()}
    expected = sessions["attention"].run(None, caches[0])[0]
    difference = max(
        float(np.abs(s.run(None, caches[0])[0] - expected).max()) for s in sessions.values()
    )
    rounds = [{form: _median_us(sessions[form], caches, calls) for form in FORMS} for _ in range(2)]
    cache_mb = 2 * batch * HEADS * positions * HEAD_SIZE * 4 / 1e6
    return {
        "batch": batch,
        "positions": positions,
        "threads": threads,
        "layers": layers,
        "cache_mb_per_layer": round(cache_mb, 2),
        "max_abs_difference": difference,
        **{f"{form}_us": [round(r[form], 1) for r in rounds] for form in FORMS},
        "keys_query_vs_attention": [round(r["keys_query"] / r["attention"], 3) for r in rounds],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_probe")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--positions", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--layers", type=int, default=12, help="caches attended in turn")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    points = [
        probe(batch, positions, threads, args.calls, args.layers)
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
