"""The benchmarks' cached exports: which are exported again; the block setups' entries."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.attnserve_runner import is_current_export
from benchmarks.serve_settings import BLOCK_STEPS
from benchmarks.serve_setups import setup_repository
from contract.graphs import DECODER_BLOCK_FILE
from contract.repository import read_manifest, read_model_config, resolve_version
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


def test_the_block_setups_give_the_translator_its_block(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """``decode_block`` / ``eight_frontends_block``: the source translator gets a decode block
    graph of ``BLOCK_STEPS`` steps once (the setups' versions are its symlinks), the setup's
    config turns it on; the ViT is not served in them."""
    source = tmp_path / "source"
    shutil.copytree(tiny_repository / "translator", source / "translator")
    root = tmp_path / "setups"
    for setup in ("decode_block", "eight_frontends_block"):
        repository, variants = setup_repository(
            source, setup, ("translator", "vit"), 2, "cpu", root
        )
        assert [v["model"] for v in variants] == ["translator"]
        assert variants[0]["batching"]["decode_block"] is True
        assert read_model_config(repository / "translator").batching.decode_block
        version = resolve_version(repository / "translator")
        assert (version / DECODER_BLOCK_FILE).is_file()
        block = read_manifest(version)["decoders"]["inplace"]["decode_block"]
        assert block["steps"] == BLOCK_STEPS
    assert variants[0]["frontend_workers"] == 8
