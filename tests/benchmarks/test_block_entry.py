"""``bench engine --decode-block K``: an entry given its decode block once (manifest and file),
the runners it adds per device, and the benchmark's fixed-length greedy decoding in blocks giving
the tokens of single steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import runners
from benchmarks.attnserve_runner import AttnServeRunner
from benchmarks.block_entry import with_decode_block
from benchmarks.engine_settings import EngineSettings
from benchmarks.marian import TINY
from contract.graphs import DECODER_BLOCK_FILE


@pytest.fixture
def entry(tiny_repository: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "translator"
    shutil.copytree(tiny_repository / "translator", copy)
    return copy


def test_an_entry_gets_its_block_once(entry: Path) -> None:
    with_decode_block(entry, 3)
    manifest_path = entry / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["decoders"]["inplace"]["decode_block"]["steps"] == 3
    assert manifest["files"].count(DECODER_BLOCK_FILE) == 1
    written = (entry / "1" / DECODER_BLOCK_FILE).stat().st_mtime_ns
    with_decode_block(entry, 3)  # kept
    assert (entry / "1" / DECODER_BLOCK_FILE).stat().st_mtime_ns == written
    manifest = json.loads(manifest_path.read_text())
    del manifest["decoders"]["inplace"]["decode_block"]["revision"]  # an older block's
    manifest_path.write_text(json.dumps(manifest))
    with_decode_block(entry, 3)  # written again
    assert (entry / "1" / DECODER_BLOCK_FILE).stat().st_mtime_ns > written
    with_decode_block(entry, 5)  # another size: written again
    manifest = json.loads(manifest_path.read_text())
    assert manifest["decoders"]["inplace"]["decode_block"]["steps"] == 5
    assert manifest["files"].count(DECODER_BLOCK_FILE) == 1


def test_fixed_length_decoding_in_blocks_gives_the_single_steps_tokens(entry: Path) -> None:
    """10 tokens per row in blocks of 3 (three blocks and a single step) at batch 1 and 3: the
    tokens of ten single steps; the runner says how it decodes."""
    with_decode_block(entry, 3)
    ids = np.random.default_rng(1).integers(4, 60, (3, 6))
    single = AttnServeRunner(entry, "fp32", 10, 1)
    blocks = AttnServeRunner(entry, "fp32", 10, 1, decode_block=3)
    assert blocks.name == "attnserve-fp32-block3" and blocks.config["decode_block"] == 3
    assert blocks.cache.block_steps == 3 and single.cache.block_steps == 0
    ran = []
    step_block = blocks.cache.step_block
    blocks.cache.step_block = lambda *args: ran.append(1) or step_block(*args)
    for batch in (1, 3):
        assert np.array_equal(blocks.run(ids[:batch]), single.run(ids[:batch]))
    assert len(ran) == 6  # three blocks per run, the tenth token a single step
    assert blocks.cache.rows == 0


def test_block_runners_per_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runners, "export_attnserve", lambda *a: tmp_path / a[3])
    given: list[tuple[Path, int]] = []
    monkeypatch.setattr(runners, "with_decode_block", lambda e, k: given.append((e, k)))

    def names(**overrides: Any) -> list[str]:
        base = EngineSettings(shape=TINY, engines=("attnserve",), threads=2, decode_block=4)
        specs, _ = runners.runner_specs(
            base.__class__(**{**base.__dict__, **overrides}), tmp_path / "marian", tmp_path
        )
        return [s.name for s in specs if "block" in s.name]

    assert names(device="cuda", precisions=("fp16",)) == [
        "attnserve-fp16-block4",
        "attnserve-fp16-cudagraph-block4",
    ]
    assert names(device="cpu", precisions=("fp32",), decode_attentions=("fused",)) == [
        "attnserve-fp32-block4"
    ]
    assert (tmp_path / "fp16", 4) in given
    with pytest.raises(ValueError, match="--decode-block takes 2-16"):
        EngineSettings(decode_block=1).check()
