"""``python -m benchmarks.block_memory``: a translation entry loaded in fresh processes with and
without its decode block, the RSS each adds recorded."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import block_memory


def test_rss_is_recorded_with_and_without_the_block(tiny_repository: Path, tmp_path: Path) -> None:
    entry = tiny_repository / "translator"
    args = ["--entry", str(entry), "--batch", "2", "--new-tokens", "6", "--tiny"]
    assert block_memory.main([*args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("block-memory-*-tiny.json")
    result = json.loads(path.read_text())
    without, with_block = result["points"]
    assert (without["decode_block"], with_block["decode_block"]) == (False, True)
    assert without["block_steps"] == 0 and with_block["block_steps"] >= 2  # the setting took
    assert set(with_block["graph_mb"]) == {"decoder_inplace.onnx", "decoder_block.onnx"}
    for point in (without, with_block):
        assert point["entry"] == "translator" and point["load_mb"] > 0
        assert point["load_and_decode_mb"] >= point["load_mb"] - 1  # RSS rarely shrinks
    assert result["machine"]["logical_cpus"] >= 1


def test_rss_is_read_from_proc() -> None:
    before = block_memory.rss_bytes()
    held = bytearray(64 * block_memory.MB)  # touched: resident
    assert block_memory.rss_bytes() - before >= 60 * block_memory.MB
    del held
