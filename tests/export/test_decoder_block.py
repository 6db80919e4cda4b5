"""The decode block graph (``export/decoder_block.py``): written by ``export --decode-block K``
and named in the manifest, the decoder's nodes K times over one copy of its weights; K outside
2-16 refused. What it decodes is checked against single steps in
``tests/serving/test_decode_block.py``."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from contract.graphs import (
    BLOCK_IDS,
    DECODER_BLOCK_FILE,
    DECODER_INPLACE_FILE,
    block_present_name,
    kv_names,
)
from export.decoder_block import decoder_block_model
from export.errors import ExportError
from export.exporter import export
from tests.repositories import FAST, tiny_sources


def test_export_writes_the_block_over_one_copy_of_the_weights(tmp_path: Path) -> None:
    result = export(tiny_sources()[0], tmp_path, dataclasses.replace(FAST, decode_block=3))
    version, manifest = result.version_dir, result.manifest
    assert DECODER_BLOCK_FILE in manifest["files"]
    assert manifest["decoders"]["inplace"]["decode_block"]["steps"] == 3
    assert json.loads((version / "manifest.json").read_text())["files"] == manifest["files"]
    decoder = onnx.load(str(version / DECODER_INPLACE_FILE))
    block = onnx.load(str(version / DECODER_BLOCK_FILE))
    ops, block_ops = (
        Counter(n.op_type for n in decoder.graph.node),
        Counter(n.op_type for n in block.graph.node),
    )
    for op in ("Attention", "TensorScatter", "MatMul"):
        assert block_ops[op] == 3 * ops[op], op
    assert block_ops["ArgMax"] == 3
    assert len(block.graph.initializer) <= len(decoder.graph.initializer) + 8  # + the constants
    weights = sum(len(t.raw_data) for t in decoder.graph.initializer)
    assert (version / DECODER_BLOCK_FILE).stat().st_size < 1.2 * weights + 200_000
    outputs = [o.name for o in block.graph.output]
    assert outputs[0] == BLOCK_IDS
    assert block.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 3
    pasts = [i.name for i in block.graph.input if i.name.startswith("past_")]
    assert pasts == kv_names("past", len(pasts) // 2)
    for step in range(3):
        for past in pasts:
            assert block_present_name(past, step) in outputs
    onnx.checker.check_model(block)


@pytest.mark.parametrize("steps", [1, 17])
def test_block_sizes_outside_2_to_16_are_refused(tmp_path: Path, steps: int) -> None:
    with pytest.raises(ExportError, match="--decode-block"):
        export(tiny_sources()[0], tmp_path, dataclasses.replace(FAST, decode_block=steps))
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_decoder_with_subgraphs_is_refused(tiny_translator_fp32) -> None:
    decoder = onnx.load(str(tiny_translator_fp32.version_dir / DECODER_INPLACE_FILE))
    with pytest.raises(ValueError, match="2-16"):
        decoder_block_model(decoder, 1)
    branch = onnx.helper.make_graph([], "branch", [], [])
    decoder.graph.node.append(
        onnx.helper.make_node("If", ["x"], [], then_branch=branch, else_branch=branch)
    )
    with pytest.raises(ValueError, match="subgraphs"):
        decoder_block_model(decoder, 4)
