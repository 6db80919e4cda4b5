"""The benchmarks' cached exports: which are exported again."""

from __future__ import annotations

from benchmarks.attnserve_runner import is_current_export
from export.cache_graphs import CACHE_SCATTER


def test_exports_from_before_todays_graphs_are_told_apart() -> None:
    """A cached entry whose manifest has no ``fused_projections`` (exported before 2026-11-27),
    or whose in-place decoder's cache graphs scatter whole rows (before that evening: slow
    joins on CUDA), is exported again by the benchmarks; one of today's exports is reused, and
    a model without decoders (the ViT) needs only the first."""
    graphs = {"encoder": {"fused_projections": 3}, "decoder": {"fused_projections": 0}}
    decoders = {"inplace": {"cache_scatter": CACHE_SCATTER}, "fallback": {}}
    assert is_current_export({"graphs": graphs, "decoders": decoders})
    assert is_current_export({"graphs": {"model": {"fused_projections": 0}}})  # a ViT
    older = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"op_types": {}}}}
    assert not is_current_export(older | {"decoders": decoders})
    assert not is_current_export({"graphs": graphs, "decoders": {"inplace": {}}})
    assert not is_current_export({})  # no graphs: nothing to reuse
