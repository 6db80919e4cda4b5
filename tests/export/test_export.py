"""Export round trips: graphs, fused attention, parity figures, variants, --force, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnserve_cli import main
from contract.graphs import DECODER_INPLACE_FILE
from contract.repository import REPOSITORY_FORMAT, read_model_config
from contract.tokenizer import SubwordTokenizer
from export.cache_graphs import CACHE_SCATTER
from export.errors import DestinationError, ExportError, SourceError
from export.exporter import ExportOptions, ExportResult, export
from export.precision import fold_weight_transposes
from export.sources import LoadedSource
from models import captioner, vit
from models.checkpoint import save_checkpoint
from models.data.translation import LANGUAGES
from tests.repositories import FAST, tiny_sources


@pytest.fixture
def tiny_translator_entry(tiny_translator_fp32: ExportResult) -> Path:
    return tiny_translator_fp32.entry


def test_translator_entry_layout_and_manifest(tiny_translator_entry: Path) -> None:
    version = tiny_translator_entry / "1"
    names = sorted(p.name for p in version.iterdir())
    assert names == [
        "cache_copy.onnx",
        "cache_resize.onnx",
        "cache_write.onnx",
        "decoder.onnx",
        "decoder_block.onnx",  # export --decode-block's default: 4 steps
        "decoder_inplace.onnx",
        "encoder.onnx",
        "greedy_pick.onnx",
        "manifest.json",
        "tokenizer.json",
    ]
    manifest = json.loads((version / "manifest.json").read_text())
    parity = manifest["parity"]
    assert parity["greedy_examples"] >= 100 and parity["greedy_agreement"] == 1.0
    by_decoder = parity["greedy_identical_by_decoder"]
    assert by_decoder == {"growing": parity["greedy_examples"], "inplace": by_decoder["growing"]}
    decoders = manifest["decoders"]
    assert (
        decoders["inplace"]["file"] == "decoder_inplace.onnx" and decoders["inplace"]["opset"] == 24
    )
    assert decoders["inplace"]["cache_scatter"] == CACHE_SCATTER
    assert decoders["fallback"] == {**decoders["fallback"], "file": "decoder.onnx", "opset": 23}
    assert max(parity["max_abs_diff"].values()) <= 1e-4
    assert max(parity["real_max_abs_diff"].values()) <= 1e-4
    assert manifest["opset"] == 23 and manifest["fused_attention"] is True
    assert manifest["format"] == REPOSITORY_FORMAT
    assert set(manifest["libraries"]) >= {"torch", "onnx", "onnxruntime"}
    config = read_model_config(tiny_translator_entry)
    assert config.kind == "seq2seq" and config.languages == LANGUAGES
    assert config.decoder is not None and config.decoder.num_layers == 2


def test_inplace_decoder_writes_a_fixed_capacity_cache(tiny_translator_entry: Path) -> None:
    graph = onnx.load(str(tiny_translator_entry / "1" / "decoder_inplace.onnx"))
    nodes = graph.graph.node
    scatters = [n for n in nodes if n.op_type == "TensorScatter"]
    attention = [n for n in nodes if n.op_type == "Attention"]
    assert len(scatters) == 4 and len(attention) == 4  # K and V per layer; self + cross per layer
    assert all(list(n.output) == [n.output[0]] for n in attention)  # no present copies
    assert {n.input[6] for n in attention if n.input[1].startswith("cross")} == {"cross_lengths"}
    assert {n.output[0] for n in scatters} == {
        f"present_{p}.{i}" for p in ("key", "value") for i in (0, 1)
    }
    assert "Concat" not in {n.op_type for n in nodes}  # the cache never grows
    inputs = {value.name: value for value in graph.graph.input}
    dims = [d.dim_param or d.dim_value for d in inputs["past_key.0"].type.tensor_type.shape.dim]
    assert dims == ["batch", 4, "capacity", 8]
    assert [o.version for o in graph.opset_import if o.domain == ""] == [24]


def test_decoder_graph_holds_attention_and_kv_cache(tiny_translator_entry: Path) -> None:
    decoder = onnx.load(str(tiny_translator_entry / "1" / "decoder.onnx"))
    ops = [node.op_type for node in decoder.graph.node]
    assert ops.count("Attention") == 4  # self + cross in each of 2 layers
    inputs = {value.name: value for value in decoder.graph.input}
    dims = [d.dim_param or d.dim_value for d in inputs["past_key.0"].type.tensor_type.shape.dim]
    assert dims == ["batch", 4, "past_length", 8]
    mask = inputs["self_attention_mask"].type.tensor_type.shape.dim
    assert [d.dim_param for d in mask] == ["batch", "total_length"]
    outputs = [value.name for value in decoder.graph.output]
    assert outputs == [
        "logits",
        "present_key.0",
        "present_value.0",
        "present_key.1",
        "present_value.1",
    ]


def test_force_overwrites_and_a_new_version_sits_beside(tmp_path: Path) -> None:
    model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)).eval()
    source = LoadedSource("vit", model, None, "tiny", "0")
    export(source, tmp_path, FAST)
    first = (tmp_path / "vit" / "1" / "model.onnx").stat().st_mtime_ns
    with pytest.raises(DestinationError, match="already exists; pass --force"):
        export(source, tmp_path, FAST)
    export(source, tmp_path, ExportOptions(parity_examples=100, version=2, precision="fp16"))
    manifest = json.loads((tmp_path / "vit" / "2" / "manifest.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["version"] == 2
    assert (tmp_path / "vit" / "1" / "model.onnx").stat().st_mtime_ns == first
    export(source, tmp_path, ExportOptions(parity_examples=100, force=True))
    assert (tmp_path / "vit" / "1" / "model.onnx").stat().st_mtime_ns != first
    assert json.loads((tmp_path / "vit" / "2" / "manifest.json").read_text()) == manifest


def test_int8_translator_quantises_every_matmul(int8_repository: Path) -> None:
    manifest = json.loads((int8_repository / "float" / "1" / "manifest.json").read_text())
    assert manifest["precision"] == "int8"
    assert manifest["graphs"]["decoder"]["attention_nodes"] == 4  # int8 keeps standard Attention
    assert manifest["parity"]["greedy_agreement"] >= 0.95
    ops = manifest["graphs"]["decoder"]["op_types"]  # every MatMul quantised, the LM head too
    assert "MatMul" not in ops and "MatMulInteger" in ops, ops
    # the in-place decoder's float MatMuls are its attention's (keys x query, weights x values),
    # between activations: no weight is left in float
    model = onnx.load(str(int8_repository / "float" / "1" / DECODER_INPLACE_FILE))
    weights = {i.name for i in model.graph.initializer}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 2 * manifest["graphs"]["decoder"]["attention_nodes"]
    assert not any(set(n.input) & weights for n in matmuls)


def test_weight_transposes_fold_into_initializers() -> None:
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "wt"], ["y"]),
            helper.make_node("Gather", ["w", "ids"], ["e"]),  # the embedding still reads w
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 3]),
        ],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph)
    assert fold_weight_transposes(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Gather"]
    folded = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(folded["wt"], weight.T)


def test_legacy_opset_decomposes_attention(tmp_path: Path) -> None:
    result = export(tiny_sources()[0], tmp_path, ExportOptions(parity_examples=100, opset=18))
    assert result.manifest["graphs"]["decoder"]["attention_nodes"] == 0
    assert result.manifest["graphs"]["decoder"]["op_types"]["Softmax"] == 4
    assert result.manifest["parity"]["greedy_agreement"] == 1.0


def test_fp16_variant(tmp_path: Path) -> None:
    model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)).eval()
    source = LoadedSource("vit", model, None, "tiny", "0")
    result = export(source, tmp_path, ExportOptions(parity_examples=100, precision="fp16"))
    graph = onnx.load(str(result.version_dir / "model.onnx"))
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert "Conv" not in {node.op_type for node in graph.graph.node}  # the patches: a MatMul
    assert result.manifest["parity"]["max_abs_diff"]["model"] <= 1e-2
    assert result.manifest["parity"]["top1_identical"] >= 0.98 * 100


def test_captioner_export_from_checkpoint_dir(tmp_path: Path) -> None:
    tokenizer = SubwordTokenizer.train(["a small red circle left of a large blue square"], 140)
    config = captioner.preset("tiny", image_size=48, patch_size=8, vocab_size=tokenizer.vocab_size)
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", "captioner", captioner.Captioner(config), tokenizer
    )
    result = export(str(checkpoint), tmp_path / "repo", FAST)
    assert result.manifest["kind"] == "captioner"
    assert result.manifest["parity"]["greedy_agreement"] == 1.0
    assert result.manifest["graphs"]["encoder"]["attention_nodes"] == 2
    config_yaml = read_model_config(tmp_path / "repo" / "captioner")
    assert config_yaml.image is not None and config_yaml.image.size == 48
    assert config_yaml.limits.max_source_length == config.num_patches + 1


def test_failed_parity_leaves_nothing_behind(tmp_path: Path, monkeypatch) -> None:
    import export.parity as parity

    monkeypatch.setitem(parity.TOLERANCE, "fp32", 0.0)  # nothing can meet a zero tolerance
    model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)).eval()
    with pytest.raises(ExportError, match="parity check failed for fp32"):
        export(LoadedSource("vit", model, None, "tiny", "0"), tmp_path, FAST)
    assert not (tmp_path / "vit" / "1").exists()


def test_bad_sources_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"not a model kind .*translator, vit, captioner"):
        export("resnet", tmp_path, FAST)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{oops")
    with pytest.raises(SourceError, match="not valid JSON"):
        export(str(corrupt), tmp_path / "repo", FAST)
    with pytest.raises(ExportError, match="unknown precision 'int4'"):
        export("vit", tmp_path, ExportOptions(precision="int4"))
    with pytest.raises(ExportError, match="--opset must be between"):
        export("vit", tmp_path, ExportOptions(opset=9))


def test_unwritable_output_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)).eval()
    with pytest.raises(DestinationError, match="cannot create"):
        export(LoadedSource("vit", model, None, "tiny", "0"), blocker, FAST)


def test_cli_export_errors_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["export", "nonexistent-model", "--out", str(tmp_path)]) == 2
    assert "not a model kind" in capsys.readouterr().err


def test_vit_entry_is_a_triton_model(tmp_path: Path) -> None:
    from google.protobuf import text_format

    from serving.proto_gen.inference import grpc_service_pb2

    model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)).eval()
    export(LoadedSource("vit", model, None, "tiny", "0"), tmp_path, FAST)
    text = (tmp_path / "vit" / "config.pbtxt").read_text()
    config = text_format.Parse(text, grpc_service_pb2.ModelConfig())  # Triton's own schema
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 32
    assert list(config.input[0].dims) == [3, 32, 32] and config.input[0].name == "pixel_values"
    assert list(config.output[0].dims) == [10] and config.output[0].name == "logits"
    from contract.repository import read_model_config

    batching = read_model_config(tmp_path / "vit").batching
    assert config.dynamic_batching.max_queue_delay_microseconds == batching.max_queue_delay_us
    assert (tmp_path / "vit" / "1" / "model.onnx").is_file()  # Triton's NAME/VERSION layout
    # no Conv: ONNX Runtime's CUDA Conv re-plans at every new batch size (models.vit)
    graph = onnx.load(str(tmp_path / "vit" / "1" / "model.onnx")).graph
    assert "Conv" not in {node.op_type for node in graph.node}
    assert len((tmp_path / "vit" / "labels.txt").read_text().split()) == 10


def test_fp16_seq2seq_keeps_a_half_cache_and_fp32_logits(
    tiny_translator_fp16: ExportResult,
) -> None:
    result = tiny_translator_fp16
    decoder = onnx.load(str(result.version_dir / "decoder.onnx"))
    types = {
        v.name: v.type.tensor_type.elem_type for v in [*decoder.graph.input, *decoder.graph.output]
    }
    assert types["past_key.0"] == types["present_key.0"] == onnx.TensorProto.FLOAT16
    assert types["cross_value.1"] == onnx.TensorProto.FLOAT16
    assert types["logits"] == onnx.TensorProto.FLOAT  # fp16 cannot resolve large logits
    parity = result.manifest["parity"]
    assert max(parity["real_max_abs_diff"].values()) <= 1e-2
    assert parity["greedy_agreement"] >= 0.98
