"""The in-place decoder's attention as MatMuls (``--decode-attention matmul``): the rewrite
against ONNX's fused ``Attention`` op, the export option, and decoding through it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.graphs import DECODER_FILE, DECODER_INPLACE_FILE, default_decode_attention
from contract.repository import read_model_config
from export.cli import summary
from export.errors import ExportError
from export.exporter import ExportOptions, export
from export.matmul_attention import matmul_attention
from serving.engine.requests import GenerationRequest
from tests.repositories import tiny_sources
from tests.serving.test_inplace_cache import decode_all, load, translator_jobs


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def step_feeds(
    model: onnx.ModelProto,
    lengths: list[int],
    sources: list[int],
    width: int,
    seed: int,
    dtype: type = np.float32,
) -> dict[str, np.ndarray]:
    """One step's inputs: caches of ``width`` positions (sources as wide as the longest), random
    contents past every row's length too (what freed rows leave behind)."""
    rng = np.random.default_rng(seed)
    batch = len(lengths)
    feeds = {
        "input_ids": rng.integers(3, 60, (batch, 1)).astype(np.int64),
        "cache_lengths": np.array(lengths, dtype=np.int64),
        "cross_lengths": np.array(sources, dtype=np.int64),
    }
    for value in model.graph.input:
        if value.name in feeds:
            continue
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        positions = width if value.name.startswith("past") else max(sources)
        shape = (batch, dims[1], positions, dims[3])
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.fixture(scope="module")
def decoders(tiny_translator_fp32) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(the exported fp32 in-place decoder, its matmul rewrite)."""
    fused = onnx.load(str(tiny_translator_fp32.version_dir / DECODER_INPLACE_FILE))
    spec = read_model_config(tiny_translator_fp32.entry).decoder
    return fused, matmul_attention(fused, spec.num_layers, spec.head_dim)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(st.integers(0, 15), st.integers(1, 12)), min_size=1, max_size=6),
    seed=st.integers(0, 1000),
)
def test_the_rewrite_computes_what_the_attention_op_computes(
    decoders: tuple[onnx.ModelProto, onnx.ModelProto], rows: list[tuple[int, int]], seed: int
) -> None:
    """Ragged self-attention lengths (0: an idle row) and source lengths over one step: the
    same logits and cache writes, to float rounding (a layer's keys come from the attention
    of the layers below)."""
    fused, rewritten = decoders
    lengths, sources = [r[0] for r in rows], [r[1] for r in rows]
    feeds = step_feeds(fused, lengths, sources, width=16, seed=seed)
    expected = session(fused).run(None, feeds)
    got = session(rewritten).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-4)
    assert (got[0].argmax(-1) == expected[0].argmax(-1)).all()
    for present_got, present_expected in zip(got[1:], expected[1:], strict=True):
        np.testing.assert_allclose(present_got, present_expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[1], expected[1])  # the first layer's keys: the same


def test_an_fp16_decoder_attends_in_fp16(tiny_translator_fp16) -> None:
    """The mask and the scale are cast to the graph's type; the logits match the op's to fp16
    rounding."""
    fused = onnx.load(str(tiny_translator_fp16.version_dir / DECODER_INPLACE_FILE))
    spec = read_model_config(tiny_translator_fp16.entry).decoder
    rewritten = matmul_attention(fused, spec.num_layers, spec.head_dim)
    feeds = step_feeds(fused, [0, 5, 11], [3, 12, 7], width=16, seed=3, dtype=np.float16)
    expected = session(fused).run(None, feeds)[0].astype(np.float32)
    got = session(rewritten).run(None, feeds)[0].astype(np.float32)
    assert "CastLike" in [n.op_type for n in rewritten.graph.node]  # the scale, to fp16
    assert "CastLike" not in [n.op_type for n in fused.graph.node]
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-2 * np.abs(expected).max())


def test_the_rewrite_keeps_the_graphs_interface(
    decoders: tuple[onnx.ModelProto, onnx.ModelProto],
) -> None:
    fused, rewritten = decoders

    def interface(model: onnx.ModelProto) -> list:
        return [
            (v.name, v.type.tensor_type.elem_type, str(v.type.tensor_type.shape))
            for v in [*model.graph.input, *model.graph.output]
        ]

    ops = [n.op_type for n in rewritten.graph.node]
    assert interface(rewritten) == interface(fused)
    assert "Attention" not in ops and "Attention" in [n.op_type for n in fused.graph.node]
    assert ops.count("Softmax") == 2 * read_layers(fused)
    assert ops.count("Range") == 2  # one mask per lengths input: self and cross
    assert {n.domain for n in rewritten.graph.node} <= {"", "ai.onnx"}


def read_layers(model: onnx.ModelProto) -> int:
    return sum(v.name.startswith("past_key.") for v in model.graph.input)


def test_graphs_the_rewrite_does_not_know_are_refused(tiny_translator_fp32) -> None:
    version = tiny_translator_fp32.version_dir
    layers = read_layers(onnx.load(str(version / DECODER_INPLACE_FILE)))
    growing = onnx.load(str(version / DECODER_FILE))  # Attention nodes, but no cache lengths
    with pytest.raises(ExportError, match="Attention"):
        matmul_attention(growing, layers, 16)
    with pytest.raises(ExportError, match=f"needs {2 * (layers + 1)} Attention nodes"):
        matmul_attention(onnx.load(str(version / DECODER_INPLACE_FILE)), layers + 1, 16)


def test_int8_exports_take_the_matmul_attention_by_default() -> None:
    assert default_decode_attention("int8", "float") == "matmul"
    assert default_decode_attention("fp32", "float") == "fused"
    assert default_decode_attention("fp16", "float") == "fused"
    assert default_decode_attention("int8", "int8") == "int8"  # the int8 cache's own


def test_the_int8_export_decodes_through_matmul_attention(int8_repository: Path) -> None:
    version = int8_repository / "float" / "1"
    manifest = json.loads((version / "manifest.json").read_text())
    ops = [n.op_type for n in onnx.load(str(version / DECODER_INPLACE_FILE)).graph.node]
    assert manifest["decoders"]["inplace"]["decode_attention"] == "matmul"
    assert manifest["graphs"]["decoder_inplace"]["decode_attention"] == "matmul"
    assert "Attention" not in ops and "MatMul" in ops
    assert manifest["graphs"]["encoder"]["attention_nodes"] > 0  # only the decoder's step
    assert manifest["fused_attention"]
    assert summary(manifest, version)["decode_attention"] == "matmul"  # `attnserve export`'s line
    # the int8 KV cache keeps its own attention
    kv8 = json.loads((int8_repository / "kv8" / "1" / "manifest.json").read_text())
    assert kv8["decoders"]["inplace"]["decode_attention"] == "int8"


def test_fp32_exports_keep_the_attention_op(tiny_translator_fp32) -> None:
    manifest = tiny_translator_fp32.manifest
    assert manifest["decoders"]["inplace"]["decode_attention"] == "fused"
    assert manifest["graphs"]["decoder_inplace"]["attention_nodes"] > 0
    assert summary(manifest, tiny_translator_fp32.version_dir)["decode_attention"] == "fused"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ExportOptions(decode_attention="flash"), "unknown decode attention 'flash'"),
        (
            ExportOptions(precision="int8", kv_cache_dtype="int8", decode_attention="matmul"),
            "goes with a float KV cache",
        ),
    ],
)
def test_export_refuses_decode_attentions_it_cannot_build(
    tmp_path: Path, options: ExportOptions, message: str
) -> None:
    with pytest.raises(ExportError, match=message):
        export(tiny_sources()[0], tmp_path, options)
    assert not any(tmp_path.iterdir())


def test_in_flight_decoding_is_token_identical_through_either_attention(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """The fp32 translator's entry and a copy whose in-place decoder is rewritten: every greedy
    and beam request of a mixed in-flight batch gets the same tokens (sampling, seeded, too)."""
    entry = tmp_path / "translator"
    shutil.copytree(tiny_repository / "translator", entry)
    graph = entry / "1" / DECODER_INPLACE_FILE
    spec = read_model_config(entry).decoder
    onnx.save(matmul_attention(onnx.load(str(graph)), spec.num_layers, spec.head_dim), str(graph))
    results = {}
    for name, path in (("fused", tiny_repository / "translator"), ("matmul", entry)):
        config, runner, cache = load(path)
        requests = [
            GenerationRequest(options=options, source_ids=ids) for ids, options in translator_jobs()
        ]
        results[name] = decode_all(config, runner, cache, requests, together=3)
    assert [e.tokens for e in results["matmul"]] == [e.tokens for e in results["fused"]]
    assert all(e.tokens for e in results["fused"])
