"""The benchmark's shipped repository: which cached entries are exported again."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from benchmarks.serve_setups import _has_conv


def _graph_with(op: str, path: Path) -> None:
    """A one-node graph (op over x and w) saved at ``path``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x", "w"], ["y"])
    path.parent.mkdir(parents=True)
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x, w], [y])), str(path))


def test_a_vit_with_a_convolution_is_found_in_any_version(tmp_path: Path) -> None:
    """A cached ViT from before the matmul patch embedding is told apart (then re-exported)."""
    entry = tmp_path / "vit"
    _graph_with("MatMul", entry / "1" / "model.onnx")
    assert not _has_conv(entry)
    _graph_with("Conv", entry / "2" / "model.onnx")
    assert _has_conv(entry)
    assert not _has_conv(tmp_path / "missing")  # no versions: nothing to re-export for this


def test_exports_from_before_the_fused_projections_are_told_apart() -> None:
    """A cached entry whose manifest has no ``fused_projections`` (exported before 2026-11-27)
    is exported again by the benchmarks; one of today's export is reused."""
    from benchmarks.attnserve_runner import has_fused_projections

    today = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"fused_projections": 0}}}
    assert has_fused_projections(today)
    older = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"op_types": {}}}}
    assert not has_fused_projections(older)
    assert not has_fused_projections({})  # no graphs: nothing to reuse
