"""The benchmarks' cached exports: which are exported again."""

from __future__ import annotations

from benchmarks.attnserve_runner import has_fused_projections


def test_exports_from_before_the_fused_projections_are_told_apart() -> None:
    """A cached entry whose manifest has no ``fused_projections`` (exported before 2026-11-27)
    is exported again by the benchmarks (it also predates the greedy pick graph and the ViT
    without Conv, which that rule covered before); one of today's export is reused."""
    today = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"fused_projections": 0}}}
    assert has_fused_projections(today)
    older = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"op_types": {}}}}
    assert not has_fused_projections(older)
    assert not has_fused_projections({})  # no graphs: nothing to reuse
