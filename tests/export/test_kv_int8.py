"""The int8 KV cache at export: the option's rules, the rewritten decoder graph, its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from contract.graphs import DECODER_FILE, DECODER_INPLACE_FILE, cache_buffer_names
from contract.repository import read_model_config
from export.errors import ExportError
from export.exporter import ExportOptions, export
from export.kv_int8 import int8_kv_cache
from tests.repositories import tiny_sources
from tests.serving.test_inplace_cache import load


def graph_types(path: Path) -> dict[str, tuple[int, list]]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        v.name: (
            v.type.tensor_type.elem_type,
            [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
        )
        for v in [*model.graph.input, *model.graph.output]
    }


def manifest(entry: Path) -> dict:
    return json.loads((entry / "1" / "manifest.json").read_text())


def test_export_writes_an_int8_cache_decoder(int8_repository: Path) -> None:
    entry = int8_repository / "kv8"
    spec = read_model_config(entry).decoder
    version = entry / "1"
    facts = manifest(entry)
    assert facts["decoders"]["inplace"]["kv_dtype"] == "int8"
    assert manifest(int8_repository / "float")["decoders"]["inplace"]["kv_dtype"] == "float"
    ops = facts["graphs"]["decoder_inplace"]["op_types"]
    float_ops = manifest(int8_repository / "float")["graphs"]["decoder_inplace"]["op_types"]
    # the float cache's attention: float MatMuls (int8 exports' default decode attention)
    assert "Attention" not in ops and float_ops["Softmax"] == 2 * spec.num_layers
    assert float_ops["MatMul"] == 4 * spec.num_layers and "MatMul" not in ops
    # two integer GEMMs per attention, beside the quantised weights' own
    assert ops["MatMulInteger"] - float_ops["MatMulInteger"] == 4 * spec.num_layers
    parity = facts["parity"]
    assert parity["greedy_identical_by_decoder"]["inplace"] >= 0.95 * parity["greedy_examples"]
    heads, dim = spec.num_heads, spec.head_dim
    types = graph_types(version / DECODER_INPLACE_FILE)
    assert types["past_key.0"] == (TensorProto.INT8, ["batch", heads, dim, "capacity"])
    assert types["past_key.0_scale"] == (TensorProto.FLOAT, ["batch", heads, 1, "capacity"])
    assert types["present_value.1"] == (TensorProto.INT8, ["batch", heads, "capacity", dim])
    assert types["cross_value.0_scale"] == (TensorProto.FLOAT, ["batch", heads, "source_length", 1])
    assert types["logits"][0] == TensorProto.FLOAT
    # the growing-cache fallback keeps its float cache
    assert graph_types(version / DECODER_FILE)["past_key.0"][0] == TensorProto.FLOAT


def test_an_int8_cache_goes_with_int8_weights(tmp_path: Path) -> None:
    source = tiny_sources()[0]
    with pytest.raises(ExportError, match="--kv-cache-dtype int8 goes with --precision int8"):
        export(source, tmp_path, ExportOptions(kv_cache_dtype="int8"))
    with pytest.raises(ExportError, match="unknown KV cache dtype 'int4'"):
        export(source, tmp_path, ExportOptions(precision="int8", kv_cache_dtype="int4"))
    assert not any(tmp_path.iterdir())  # nothing left behind


def test_the_rewrite_needs_the_in_place_decoder(
    int8_repository: Path, tiny_translator_fp32
) -> None:
    spec = read_model_config(int8_repository / "float").decoder
    growing = onnx.load(str(int8_repository / "float" / "1" / DECODER_FILE))
    with pytest.raises(ExportError, match="TensorScatter and Attention nodes"):
        int8_kv_cache(growing, spec.num_layers, spec.head_dim)
    in_place = onnx.load(str(tiny_translator_fp32.version_dir / DECODER_INPLACE_FILE))
    rewritten = int8_kv_cache(in_place, spec.num_layers, spec.head_dim)
    with pytest.raises(ExportError, match="TensorScatter and Attention nodes"):
        int8_kv_cache(rewritten, spec.num_layers, spec.head_dim)  # not twice
    # nor over the float cache's attention written as MatMuls (int8 exports' default)
    matmuls = onnx.load(str(int8_repository / "float" / "1" / DECODER_INPLACE_FILE))
    with pytest.raises(ExportError, match="TensorScatter and Attention nodes"):
        int8_kv_cache(matmuls, spec.num_layers, spec.head_dim)


def decode_steps(entry: Path, steps: int = 6) -> tuple[list[np.ndarray], object]:
    """Logits of ``steps`` fixed tokens for three ragged sources through the in-place cache."""
    _, runner, cache = load(entry)
    ids = np.array([[9, 10, 11, 12, 2], [13, 14, 2, 0, 0], [15, 16, 17, 2, 0]])
    encoded = runner.encode({"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)})
    rows = np.concatenate(cache.admit(encoded, [1, 1, 1]))
    logits = []
    for position in range(steps):
        tokens = np.array([5 + position, 20 + position, 40 + position])
        logits.append(cache.step(rows, tokens, np.full(3, position)).copy())
    return logits, cache


def test_int8_cache_logits_follow_the_float_cache(int8_repository: Path) -> None:
    """Same weights, same tokens: the int8 cache's logits stay within a small fraction of the
    float cache's (its error is the cache's and the attention weights' rounding)."""
    floats, _ = decode_steps(int8_repository / "float")
    int8s, cache = decode_steps(int8_repository / "kv8")
    for ours, reference in zip(int8s, floats, strict=True):
        spread = reference.max() - reference.min()
        assert np.abs(ours - reference).max() <= 0.02 * spread  # measured: 0.24-0.44% (AVX2)
        assert (ours.argmax(-1) == reference.argmax(-1)).mean() >= 2 / 3
    names = cache_buffer_names("past", 2, "int8")
    assert list(cache.decoder.past) == names
    assert cache.decoder.past["past_key.0"].dtype == np.int8


def test_the_cli_takes_the_kv_cache_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    import attnserve_cli

    parser = attnserve_cli.build_parser()
    base = ["export", "translator", "--out", "repo", "--precision", "int8"]
    assert parser.parse_args(base).kv_cache_dtype == "float"
    assert parser.parse_args([*base, "--kv-cache-dtype", "int8"]).kv_cache_dtype == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--kv-cache-dtype", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_eval_reports_the_cache_it_decoded_through(int8_repository: Path) -> None:
    from export.evaluate import evaluate_repository

    for name, dtype in (("float", "float32"), ("kv8", "int8")):
        result = evaluate_repository("translator", int8_repository / name, examples=20)
        assert (result["kv_cache"], result["kv_dtype"]) == ("inplace", dtype)
        assert 0 <= result["exact_match"] <= 1
