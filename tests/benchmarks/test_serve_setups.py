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
from export.decoder_block import BLOCK_REVISION


def test_exports_from_before_todays_graphs_are_told_apart() -> None:
    """A cached entry whose manifest has no ``fused_projections`` (exported before 2026-11-27),
    whose in-place decoder's cache graphs scatter whole rows (before that evening: slow joins on
    CUDA) or that has no decode block of today's revision, is exported again by the
    benchmarks; one of today's exports is reused, and a model without decoders (the ViT) needs
    only the first."""
    graphs = {"encoder": {"fused_projections": 3}, "decoder": {"fused_projections": 0}}
    block = {"revision": BLOCK_REVISION}
    decoders = {"inplace": {"cache_scatter": CACHE_SCATTER, "decode_block": block}}
    assert is_current_export({"graphs": graphs, "decoders": decoders})
    # without today's decode block (written by default since 2026-11-28): exported again
    for old_block in ({}, {"decode_block": {"revision": 1}}):
        inplace = {"cache_scatter": CACHE_SCATTER, **old_block}
        assert not is_current_export({"graphs": graphs, "decoders": {"inplace": inplace}})
    assert is_current_export({"graphs": {"model": {"fused_projections": 0}}})  # a ViT
    older = {"graphs": {"encoder": {"fused_projections": 3}, "decoder": {"op_types": {}}}}
    assert not is_current_export(older | {"decoders": decoders})
    assert not is_current_export({"graphs": graphs, "decoders": {"inplace": {}}})
    assert not is_current_export({})  # no graphs: nothing to reuse


def test_the_block_setups_give_the_translator_its_block(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """``eight_frontends_block``: a source translator without a decode block graph gets one of
    ``BLOCK_STEPS`` steps (the setups' versions are its symlinks) and the setup's config turns
    it on wherever it runs; ``single_steps`` turns it off; ``block_joins`` turns it on with joins
    between blocks. The ViT is served in none."""
    source = tmp_path / "source"
    shutil.copytree(tiny_repository / "translator", source / "translator")
    version = resolve_version(source / "translator")
    (version / DECODER_BLOCK_FILE).unlink()  # as exports with --decode-block 0 write it
    root = tmp_path / "setups"
    for setup, block in (("single_steps", False), ("eight_frontends_block", True)):
        repository, variants = setup_repository(
            source, setup, ("translator", "vit"), 2, "cpu", root
        )
        assert [v["model"] for v in variants] == ["translator"]
        assert variants[0]["batching"]["decode_block"] is block
        assert read_model_config(repository / "translator").batching.decode_block is block
        assert (version / DECODER_BLOCK_FILE).is_file() == block
    assert read_manifest(version)["decoders"]["inplace"]["decode_block"]["steps"] == BLOCK_STEPS
    assert variants[0]["frontend_workers"] == 8
    repository, variants = setup_repository(source, "block_joins", ("translator",), 2, "cpu", root)
    batching = read_model_config(repository / "translator").batching
    assert batching.decode_block is True and batching.join_interval_steps == BLOCK_STEPS + 1
    assert variants[0]["frontend_workers"] == 1
