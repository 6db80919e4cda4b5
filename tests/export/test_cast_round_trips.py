"""fp16 graphs lose their exact fp16 -> fp32 -> fp16 round trips and compute the same bits."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export.cast_round_trips import drop_cast_round_trips
from export.exporter import ExportResult

HALF, FLOAT = TensorProto.FLOAT16, TensorProto.FLOAT


def cast(source: str, target: str, to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [target], to=to)


def graph_model(nodes: list[onnx.NodeProto], outputs: dict[str, int]) -> onnx.ModelProto:
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], np.array([2, 3, 4], dtype=np.int64))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", HALF, [2, 12])],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs.items()],
        [shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


CASES = {
    # name: (nodes, outputs, Cast pairs that go)
    "layout chain": (
        [
            cast("x", "x32", FLOAT),
            helper.make_node("Reshape", ["x32", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
            cast("t", "y", HALF),
        ],
        {"y": HALF},
        1,
    ),
    "cast after cast": (
        [cast("x", "x32", FLOAT), cast("x32", "h", HALF), helper.make_node("Neg", ["h"], ["y"])],
        {"y": HALF},
        1,
    ),
    "fp32 value read elsewhere": (
        [
            cast("x", "x32", FLOAT),
            helper.make_node("Reshape", ["x32", "shape"], ["r"]),
            cast("r", "y", HALF),
            helper.make_node("Neg", ["x32"], ["z"]),
        ],
        {"y": HALF, "z": FLOAT},
        0,
    ),
    "computation in between": (
        [cast("x", "x32", FLOAT), helper.make_node("Exp", ["x32"], ["e"]), cast("e", "y", HALF)],
        {"y": HALF},
        0,
    ),
    "fp32 -> fp16 -> fp32 rounds": (
        [
            cast("x", "x32", FLOAT),
            helper.make_node("Neg", ["x32"], ["n"]),
            cast("n", "h", HALF),
            cast("h", "y", FLOAT),
        ],
        {"y": FLOAT},
        0,
    ),
    "the fp32 value is a graph output": (
        [cast("x", "x32", FLOAT), cast("x32", "y", HALF)],
        {"y": HALF, "x32": FLOAT},
        0,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_only_exact_round_trips_go_and_results_stay_bit_identical(case: str) -> None:
    nodes, outputs, pairs = CASES[case]
    before = graph_model(nodes, outputs)
    after = graph_model(nodes, outputs)
    assert drop_cast_round_trips(after) == pairs
    casts = [sum(n.op_type == "Cast" for n in m.graph.node) for m in (before, after)]
    assert casts[1] == casts[0] - 2 * pairs
    x = (np.random.default_rng(0).standard_normal((2, 12)) * 300).astype(np.float16)
    for ours, theirs in zip(run(after, x), run(before, x), strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_the_fp16_decoder_has_no_round_trip_left(tiny_translator_fp16: ExportResult) -> None:
    """The exported fp16 in-place decoder: one fewer pair per head split and merge, and the
    export's parity checks (run on the graph as written) still pass."""
    result = tiny_translator_fp16
    decoder = onnx.load(str(result.version_dir / "decoder_inplace.onnx"))
    assert drop_cast_round_trips(decoder) == 0
    layers = sum(i.name.startswith("past_key.") for i in decoder.graph.input)
    # per layer: the self-attention's q, k, v and the cross-attention's q each went fp16 -> fp32
    # -> fp16 around their head split, the two attention outputs around their merge
    facts = result.manifest["graphs"]["decoder_inplace"]
    assert facts["cast_round_trips_removed"] == 6 * layers
    census = collections.Counter(n.op_type for n in decoder.graph.node)
    assert census["Cast"] == facts["op_types"]["Cast"]
    # the feed-forward's activation runs in fp16 between fc1 and fc2: no Cast on either side
    producer = {out: node for node in decoder.graph.node for out in node.output}
    readers = collections.defaultdict(list)
    for node in decoder.graph.node:
        for name in node.input:
            readers[name].append(node.op_type)
    activations = [n for n in decoder.graph.node if n.op_type in ("Relu", "Gelu", "Sigmoid")]
    assert len(activations) == layers
    for node in activations:
        assert producer[node.input[0]].op_type == "Add"  # fc1's bias, in fp16
        assert "Cast" not in readers[node.output[0]]
    # the layers that join the fp32 residual stream (both attentions' outputs, fc2) add their
    # bias in fp32 after the product's Cast, where the runtime folds it into SkipLayerNorm
    fp32_biases = {
        i.name for i in decoder.graph.initializer if i.data_type == TensorProto.FLOAT and i.dims
    }
    late_biases = [
        n
        for n in decoder.graph.node
        if n.op_type == "Add"
        and n.input[0] in producer
        and producer[n.input[0]].op_type == "Cast"
        and n.input[1] in fp32_biases
    ]
    assert len(late_biases) == 3 * layers
    assert result.manifest["parity"]["greedy_agreement"] >= 0.98
