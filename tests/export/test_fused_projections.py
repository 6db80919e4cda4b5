"""Projections sharing an input become one MatMul, bias Add and Split, and compute the same."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from export.exporter import ExportResult
from export.fused_projections import fuse_projections, unfuse_projections

WIDTH = 8


def projections_model(
    widths: list[int], bias_first: list[bool], dtype: type = np.float32, seed: int = 0
) -> onnx.ModelProto:
    """``x`` (2, 3, WIDTH) projected by one MatMul + bias Add per width (the bias on the Add's
    left where ``bias_first``), plus a projection of another input and a MatMul whose product
    two nodes read: neither of those is fusable."""
    rng = np.random.default_rng(seed)
    inits, nodes, outputs = [], [], []
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for i, (n, first) in enumerate(zip(widths, bias_first, strict=True)):
        inits += [
            numpy_helper.from_array(rng.standard_normal((WIDTH, n)).astype(dtype), f"w{i}"),
            numpy_helper.from_array(rng.standard_normal(n).astype(dtype), f"b{i}"),
        ]
        adds = [f"b{i}", f"p{i}"] if first else [f"p{i}", f"b{i}"]
        nodes += [
            helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]),
            helper.make_node("Add", adds, [f"y{i}"]),
        ]
        outputs.append(f"y{i}")
    inits += [numpy_helper.from_array(rng.standard_normal((WIDTH, 4)).astype(dtype), "w_other")]
    inits += [numpy_helper.from_array(rng.standard_normal(4).astype(dtype), "b_other")]
    nodes += [
        helper.make_node("MatMul", ["z", "w_other"], ["p_other"]),
        helper.make_node("Add", ["p_other", "b_other"], ["y_other"]),
        helper.make_node("MatMul", ["x", "w_other"], ["p_shared"]),
        helper.make_node("Add", ["p_shared", "b_other"], ["y_shared"]),
        helper.make_node("Relu", ["p_shared"], ["y_relu"]),
    ]
    outputs += ["y_other", "y_shared", "y_relu"]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", elem, [2, 3, WIDTH]),
            helper.make_tensor_value_info("z", elem, [2, 3, WIDTH]),
        ],
        [helper.make_tensor_value_info(name, elem, [2, 3, "n"]) for name in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def run(model: onnx.ModelProto) -> list[np.ndarray]:
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    dtype = np.float16 if "float16" in session.get_inputs()[0].type else np.float32
    feeds = {name: rng.standard_normal((2, 3, WIDTH)).astype(dtype) for name in ("x", "z")}
    return session.run(None, feeds)


def census(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in model.graph.node)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=5),
    st.sampled_from([np.float32, np.float16]),
)
def test_fusing_computes_the_same_and_unfusing_restores_the_graph(
    projections: list[tuple[int, bool]], dtype: type
) -> None:
    widths = [n for n, _ in projections]
    first = [f for _, f in projections]
    before = projections_model(widths, first, dtype)
    fused = projections_model(widths, first, dtype)
    groups = fuse_projections(fused)
    assert fuse_projections(fused) == 0  # nothing left to fuse
    # the x projections and the one reading x whose product is also read elsewhere: only the
    # first are one group, when there are two or more of them
    assert groups == (1 if len(widths) > 1 else 0)
    ops = census(fused)
    assert ops["MatMul"] == census(before)["MatMul"] - (len(widths) - 1) * groups
    assert ops["Split"] == groups
    expected = run(before)
    tolerance = 1e-2 if dtype is np.float16 else 1e-5
    for ours, theirs in zip(run(fused), expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)
    assert unfuse_projections(fused) == groups
    assert census(fused) == census(before)
    names = {i.name for i in fused.graph.initializer}
    assert not any(name.endswith(("_widths", "fused_0_weight")) for name in names)
    for ours, theirs in zip(run(fused), expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_weights_of_other_widths_or_types_are_not_grouped() -> None:
    model = projections_model([4, 4], [False, False])
    weights = {init.name: init for init in model.graph.initializer}
    wide = np.ones((WIDTH * 2, 4), dtype=np.float32)
    weights["w1"].CopyFrom(numpy_helper.from_array(wide, "w1"))  # another input width
    assert fuse_projections(model) == 0


def test_the_exported_translator_projects_once_per_input(
    tiny_translator_fp32: ExportResult, int8_repository: Path
) -> None:
    """fp32 export: each self-attention's q, k, v is one MatMul and the encoder's output one
    MatMul for every decoder layer's cross keys and values; the in-place decoder splits and
    merges heads without a Transpose; parity (checked by the export) holds. The int8 export
    quantises each projection on its own (fused_projections 0, a MatMulInteger each)."""
    fp32 = tiny_translator_fp32
    graphs = fp32.manifest["graphs"]
    layers = sum(
        i.name.startswith("past_key.")
        for i in onnx.load(str(fp32.version_dir / "decoder_inplace.onnx")).graph.input
    )
    encoder_layers = graphs["encoder"]["op_types"]["Attention"]
    assert graphs["decoder_inplace"]["fused_projections"] == layers
    assert graphs["decoder"]["fused_projections"] == layers
    assert graphs["encoder"]["fused_projections"] == encoder_layers + 1
    inplace = graphs["decoder_inplace"]["op_types"]
    assert inplace["Split"] == layers
    # q, k, v once, the cross query, the two outputs, fc1, fc2, the LM head
    assert inplace["MatMul"] == 6 * layers + 1
    # only the tied LM head's weight transpose (folded by the runtime) is left
    assert inplace.get("Transpose", 0) <= 1
    assert fp32.manifest["parity"]["greedy_agreement"] >= 0.98

    manifest8 = json.loads((int8_repository / "float" / "1" / "manifest.json").read_text())
    graphs8 = manifest8["graphs"]
    assert all(g["fused_projections"] == 0 for g in graphs8.values())
    assert "Split" not in graphs8["decoder_inplace"]["op_types"]
    assert graphs8["decoder_inplace"]["op_types"]["MatMulInteger"] >= 8 * layers


def test_int8_quantisation_of_a_fused_graph_gives_each_projection_its_scale(
    tmp_path: Path,
) -> None:
    """``quantize_int8`` of a fused fp32 graph (``bench engine --fast-int8`` quantises the fp32
    export): the projections are separate again, each its own quantised weight."""
    from export.precision import quantize_int8

    model = projections_model([4, 4, 4], [False, False, False])
    assert fuse_projections(model) == 1
    onnx.save(model, str(tmp_path / "fused.onnx"))
    quantize_int8(tmp_path / "fused.onnx", tmp_path / "int8.onnx")
    ops = census(onnx.load(str(tmp_path / "int8.onnx")))
    assert "Split" not in ops and "MatMul" not in ops
    assert ops["MatMulInteger"] == 3 + 2  # the three projections, w_other twice
