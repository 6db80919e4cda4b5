"""export.tensorrt: profiles, structure checks, ORT TensorRT EP options, engine builds.

Tiny random models are exported once per module (each export takes seconds). What needs no
TensorRT (Attention nodes, head sizes, profiles against the graphs, provider options) runs
everywhere; real engine builds run where a TensorRT flavour can build: TensorRT-RTX (pip, builds
without a GPU) or TensorRT with its GPU. Flavour selection: test_tensorrt_flavour.py;
TensorRT-RTX's own API and builds: test_tensorrt_rtx.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import onnx
import pytest
import torch

from contract.graphs import graph_files
from contract.model_config import ModelConfig
from contract.repository import read_model_config
from export.errors import ExportError
from export.exporter import ExportOptions, ExportResult, export
from export.sources import LoadedSource
from export.tensorrt import (
    TensorRTError,
    build_engines,
    check_structure,
    count_fused_attention,
    load_library,
    ort_tensorrt_provider_options,
    parse_profile_shapes,
    profile_shapes_string,
    profiles_for,
    structure,
    validate_profile,
)
from models import vit as vit_models
from tests.repositories import tiny_sources

requires_tensorrt = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is None
    and importlib.util.find_spec("tensorrt_rtx_bindings") is None,
    reason="no TensorRT flavour to build with: TensorRT-RTX is not installed (pip install "
    "tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs, into the environment that runs the "
    "tests), and TensorRT needs NVIDIA's package index and a GPU",
)

Exported = tuple[LoadedSource, ExportResult, ModelConfig]


def _export(tmp: Path, kind: str, model: torch.nn.Module, **options) -> Exported:
    loaded = LoadedSource(kind=kind, model=model, tokenizer=None, origin="test", checksum="0")
    result = export(loaded, tmp, ExportOptions(parity_examples=100, **options))
    return loaded, result, read_model_config(result.entry)


def _tiny_vit(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)  # 32x32 inputs: the parity check feeds 32x32 digits
    return vit_models.ViT(vit_models.preset("tiny", image_size=32, patch_size=8, **overrides))


@pytest.fixture
def translator(tiny_translator_fp32: ExportResult) -> Exported:
    """The session's tiny translator export (read only)."""
    result = tiny_translator_fp32
    return tiny_sources()[0], result, read_model_config(result.entry)


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return _export(tmp_path_factory.mktemp("vit"), "vit", _tiny_vit())


def _graph_inputs(path: Path) -> dict[str, list[int | str]]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        v.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in v.type.tensor_type.shape.dim
        ]
        for v in model.graph.input
    }


def _assert_ordered(profile: dict) -> None:
    for name, (low, opt, high) in profile.items():
        assert len(low) == len(opt) == len(high), name
        assert all(0 <= a <= b <= c for a, b, c in zip(low, opt, high, strict=True)), name


# ---------------------------------------------------------------------------------------------
# check_structure on good exports
# ---------------------------------------------------------------------------------------------


def test_translator_structure_passes(translator: Exported) -> None:
    _, result, config = translator
    report = check_structure(result.version_dir, config)
    graphs = report["graphs"]
    assert set(graphs) == {"encoder", "decoder"}
    layers = config.decoder.num_layers
    assert graphs["encoder"]["attention_nodes"] == 2  # tiny preset: 2 encoder layers
    assert graphs["decoder"]["attention_nodes"] == 2 * layers  # self + cross per layer
    for graph, facts in graphs.items():
        assert facts["attention_nodes"] == result.manifest["graphs"][graph]["attention_nodes"]
        assert facts["opset"] >= 23
        assert facts["head_dims"] == [config.decoder.head_dim]
    assert set(report["profiles"]["decoder"]) == set(
        _graph_inputs(result.version_dir / "decoder.onnx")
    )


def test_vit_structure_passes(vit: Exported) -> None:
    _, result, config = vit
    report = check_structure(result.version_dir, config)
    assert report["graphs"]["model"]["attention_nodes"] == 2  # tiny preset: 2 layers
    assert report["graphs"]["model"]["head_dims"] == [8]  # d_model 32 / 4 heads
    assert report["profiles"]["model"]["pixel_values"] == {
        "min": [1, 3, 32, 32],
        "opt": [8, 3, 32, 32],
        "max": [config.limits.max_batch_size, 3, 32, 32],
    }


# ---------------------------------------------------------------------------------------------
# profiles_for
# ---------------------------------------------------------------------------------------------


def test_translator_profiles_follow_config(translator: Exported) -> None:
    _, result, config = translator
    limits, decoder = config.limits, config.decoder
    batch, source = limits.max_batch_size, limits.max_source_length
    past_max = min(decoder.max_positions - 1, limits.max_new_tokens)

    encoder = profiles_for(config, "encoder")
    assert list(encoder) == list(_graph_inputs(result.version_dir / "encoder.onnx"))
    assert encoder["input_ids"] == ((1, 1), (min(8, batch), (1 + source) // 2), (batch, source))
    assert encoder["attention_mask"] == encoder["input_ids"]

    profile = profiles_for(config, "decoder")
    assert list(profile) == list(_graph_inputs(result.version_dir / "decoder.onnx"))
    _assert_ordered(profile)
    heads, head_dim = decoder.num_heads, decoder.head_dim
    low, opt, high = profile["past_key.0"]
    assert low == (1, heads, 0, head_dim)
    assert high == (batch, heads, past_max, head_dim)
    assert opt[1::2] == (heads, head_dim) and 0 < opt[2] < past_max
    assert profile["cross_value.1"][2] == (batch, heads, source, head_dim)
    assert profile["input_ids"] == ((1, 1), (min(8, batch), 1), (batch, 1))
    for corner in range(3):  # the self mask spans past + new at every corner
        past = profile["past_value.1"][corner][2]
        new = profile["position_ids"][corner][1]
        assert profile["self_attention_mask"][corner] == (
            profile["input_ids"][corner][0],
            past + new,
        )
        assert profile["cross_attention_mask"][corner][1] == profile["cross_key.0"][corner][2]


def test_prefill_profile_keeps_positions_in_table(translator: Exported) -> None:
    _, _, config = translator
    profile = profiles_for(config, "decoder", new_tokens=8)
    _assert_ordered(profile)
    assert profile["input_ids"][2][1] == 8
    assert profile["self_attention_mask"][2][1] <= config.decoder.max_positions
    with pytest.raises(ValueError, match="new_tokens"):
        profiles_for(config, "decoder", new_tokens=config.decoder.max_positions)


def test_vit_profile_and_unknown_graphs(vit: Exported, translator: Exported) -> None:
    _, _, config = vit
    assert graph_files(config.kind) == {"model": "model.onnx"}
    batch = config.limits.max_batch_size
    assert profiles_for(config, "model") == {
        "pixel_values": ((1, 3, 32, 32), (min(8, batch), 3, 32, 32), (batch, 3, 32, 32))
    }
    with pytest.raises(ValueError, match="'model'"):
        profiles_for(config, "encoder")
    with pytest.raises(ValueError, match="'encoder', 'decoder' and 'decoder_inplace'"):
        profiles_for(translator[2], "model")


def test_inplace_decoder_profile_matches_the_graph(translator: Exported) -> None:
    _, result, config = translator
    profile = profiles_for(config, "decoder_inplace")
    inputs = _graph_inputs(result.version_dir / "decoder_inplace.onnx")
    assert list(profile) == list(inputs)
    _assert_ordered(profile)
    for name, dims in inputs.items():
        for axis, dim in enumerate(dims):
            if isinstance(dim, int):  # fixed in the graph: fixed at every corner
                assert {corner[axis] for corner in profile[name]} == {dim}, (name, axis)
    decoder, batch = config.decoder, config.limits.max_batch_size
    past = (batch, decoder.num_heads, decoder.max_positions, decoder.head_dim)
    assert profile["past_value.0"][2] == past and profile["past_value.0"][0][2] == 1
    assert profile["cache_lengths"] == ((1,), (min(8, batch),), (batch,))


def test_validate_profile_names_the_bad_input() -> None:
    validate_profile({"x": ((1, 2), (2, 2), (4, 2))})
    with pytest.raises(TensorRTError, match=r"'x' axis 0 .* 4 / 2 / 8"):
        validate_profile({"x": ((4, 2), (2, 2), (8, 2))}, "model.onnx")
    with pytest.raises(TensorRTError, match="different ranks"):
        validate_profile({"y": ((1,), (1, 2), (1, 2))})


# ---------------------------------------------------------------------------------------------
# ONNX Runtime TensorRT execution provider options
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph", ["encoder", "decoder"])
def test_ort_options_parse_back_into_the_profiles(
    translator: Exported, tmp_path: Path, graph: str
) -> None:
    _, _, config = translator
    providers = ort_tensorrt_provider_options(config, tmp_path, fp16=True, graph=graph)
    assert [name for name, _ in providers] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    options = providers[0][1]
    assert options["trt_fp16_enable"] is True
    assert options["trt_engine_cache_enable"] and options["trt_timing_cache_enable"]
    assert options["trt_engine_cache_path"] == options["trt_timing_cache_path"] == str(tmp_path)
    assert options["trt_max_workspace_size"] > 0
    profile = profiles_for(config, graph)
    for corner, key in enumerate(("min", "opt", "max")):
        text = options[f"trt_profile_{key}_shapes"]
        assert text == profile_shapes_string(profile, corner)
        assert parse_profile_shapes(text) == {name: s[corner] for name, s in profile.items()}
    assert providers[1][1]["device_id"] == 0


def test_ort_options_graph_choice(translator: Exported, vit: Exported, tmp_path: Path) -> None:
    options = ort_tensorrt_provider_options(vit[2], tmp_path, fp16=False)
    assert options[0][1]["trt_fp16_enable"] is False
    assert options[0][1]["trt_profile_max_shapes"] == "pixel_values:32x3x32x32"
    with pytest.raises(ValueError, match="graph="):
        ort_tensorrt_provider_options(translator[2], tmp_path, fp16=False)
    assert parse_profile_shapes("a:1x2,b.0:3") == {"a": (1, 2), "b.0": (3,)}
    with pytest.raises(ValueError, match="NAME"):
        parse_profile_shapes("1x2")


# ---------------------------------------------------------------------------------------------
# check_structure: what it refuses
# ---------------------------------------------------------------------------------------------


def test_opset_18_graph_has_no_fused_attention(tmp_path_factory: pytest.TempPathFactory) -> None:
    _, result, config = _export(tmp_path_factory.mktemp("vit18"), "vit", _tiny_vit(), opset=18)
    assert result.manifest["graphs"]["model"]["attention_nodes"] == 0
    with pytest.raises(TensorRTError, match=r"no ONNX Attention nodes .*opset 18.*opset >= 23"):
        check_structure(result.version_dir, config)


def test_head_dim_not_multiple_of_8_in_graph(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = _tiny_vit(d_model=36, num_heads=3)  # head_dim 12
    _, result, config = _export(tmp_path_factory.mktemp("vit12"), "vit", model)
    with pytest.raises(TensorRTError, match=r"head_dim 12 .*not a multiple of 8"):
        check_structure(result.version_dir, config)


def test_head_dim_not_multiple_of_8_in_config(translator: Exported) -> None:
    _, result, config = translator
    decoder = dataclasses.replace(config.decoder, num_heads=3, head_dim=12)
    with pytest.raises(TensorRTError, match=r"head_dim 12 \(config.yaml .*multiple of 8"):
        check_structure(result.version_dir, dataclasses.replace(config, decoder=decoder))


def _replace_limits(config: ModelConfig, **changes) -> ModelConfig:
    return dataclasses.replace(config, limits=dataclasses.replace(config.limits, **changes))


def test_source_limit_beyond_position_table(translator: Exported) -> None:
    _, result, config = translator
    edited = _replace_limits(config, max_source_length=config.decoder.max_positions + 1)
    with pytest.raises(TensorRTError, match=r"encoder.onnx: input 'input_ids' axis 1 .*position"):
        check_structure(result.version_dir, edited)


def test_batch_limit_beyond_export_range(vit: Exported) -> None:
    _, result, config = vit
    with pytest.raises(TensorRTError, match=r"'pixel_values' axis 0 \(batch\) spans 1..100000"):
        check_structure(result.version_dir, _replace_limits(config, max_batch_size=100_000))


def test_heads_mismatch_names_the_input(translator: Exported) -> None:
    _, result, config = translator
    decoder = dataclasses.replace(config.decoder, num_heads=2, head_dim=16)
    with pytest.raises(TensorRTError, match=r"'past_key.0' axis 1 is fixed at 4 .*num_heads"):
        check_structure(result.version_dir, dataclasses.replace(config, decoder=decoder))


def test_image_size_mismatch_names_pixel_values(vit: Exported) -> None:
    _, result, config = vit
    edited = dataclasses.replace(config, image=dataclasses.replace(config.image, size=64))
    with pytest.raises(TensorRTError, match=r"'pixel_values' axis 2 is fixed at 32 .*image.size"):
        check_structure(result.version_dir, edited)


@pytest.mark.parametrize(
    ("name", "axis", "message"),
    [
        ("self_attention_mask", 1, r"'self_attention_mask' \(total_length\) must equal past"),
        ("cross_attention_mask", 1, r"'source_length' is shared by input 'cross_attention_mask'"),
    ],
)
def test_inconsistent_profile_is_refused(
    translator: Exported, monkeypatch: pytest.MonkeyPatch, name: str, axis: int, message: str
) -> None:
    _, result, config = translator
    original = profiles_for

    def skewed(config: ModelConfig, graph: str, **kwargs) -> dict:
        profile = original(config, graph, **kwargs)
        if graph == "decoder":
            low, opt, high = profile[name]
            profile[name] = (low, opt, (*high[:axis], high[axis] - 1, *high[axis + 1 :]))
        return profile

    monkeypatch.setattr(structure, "profiles_for", skewed)  # the name check_structure calls
    with pytest.raises(TensorRTError, match=message):
        check_structure(result.version_dir, config)


def test_missing_graph(translator: Exported, tmp_path: Path) -> None:
    with pytest.raises(TensorRTError, match=r"encoder\.onnx is missing"):
        check_structure(tmp_path, translator[2])


# ---------------------------------------------------------------------------------------------
# build_engines
# ---------------------------------------------------------------------------------------------


def test_build_engines_without_tensorrt_says_what_to_do(
    translator: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, result, _ = translator
    for module in ("tensorrt", "tensorrt_rtx_bindings"):  # imports fail as where absent
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delenv("ATTNSERVE_TENSORRT_FLAVOUR", raising=False)
    with pytest.raises(ExportError) as info:
        build_engines(result.version_dir, loaded, ExportOptions(tensorrt=True))
    message = str(info.value)
    assert not isinstance(info.value, ImportError)
    assert "pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs" in message
    assert "NVIDIA's TensorRT container" in message and "without --tensorrt" in message
    assert "tensorrt: " in message and "tensorrt_rtx_bindings: " in message  # what was tried


def test_flavour_option_overrides_the_environment(
    translator: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, result, _ = translator
    for module in ("tensorrt", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setenv("ATTNSERVE_TENSORRT_FLAVOUR", "tensorrt")
    options = ExportOptions(tensorrt=True, tensorrt_flavour="rtx")  # --tensorrt-flavour rtx
    with pytest.raises(ExportError) as info:
        build_engines(result.version_dir, loaded, options)
    message = str(info.value)
    assert message.startswith("TensorRT-RTX was asked for (--tensorrt-flavour")
    assert "tensorrt_rtx_bindings: " in message and "tensorrt: " not in message  # only RTX tried


def test_count_fused_attention() -> None:
    layers = [
        "myelin_fmha_0",
        {"Name": "/layers.0/Attention", "LayerType": "kATTENTION"},
        {"Name": "gemm", "LayerType": "Myelin", "TacticName": "sm90_xmma_mha_v2"},
        {"Name": "/fc1/MatMul", "LayerType": "MatrixMultiply"},
    ]
    assert count_fused_attention(layers) == 3


def _check_engines(loaded: LoadedSource, result: ExportResult, config: ModelConfig) -> None:
    library = load_library()
    built = build_engines(result.version_dir, loaded, ExportOptions(tensorrt=True))
    assert built["tensorrt_version"] == library.version_text
    assert built["flavour"] == library.flavour.name
    assert [e["graph"] for e in built["engines"]] == list(graph_files(config.kind))
    cache = result.version_dir / "timing.cache"
    assert cache.is_file() == library.flavour.timing_cache == (built["timing_cache"] is not None)
    runtime = library.trt.Runtime(library.trt.Logger(library.trt.Logger.WARNING))
    for entry in built["engines"]:
        plan = result.version_dir / entry["file"]
        assert plan.stat().st_size == entry["bytes"] > 0
        layers = json.loads((result.version_dir / entry["layers_file"]).read_text())
        assert len(layers) == entry["layers"] > 0
        nodes = result.manifest["graphs"][entry["graph"]]["attention_nodes"]
        assert entry["attention_layers"] == nodes
        assert len(entry["fused_attention"]) + len(entry["decomposed_attention"]) == nodes
        if entry["layers_source"] != "engine inspector":  # TensorRT-RTX on a GPU it cannot use
            assert not library.flavour.needs_gpu_to_build
            continue
        engine = runtime.deserialize_cuda_engine(plan.read_bytes())
        for name, (low, opt, high) in profiles_for(config, entry["graph"]).items():
            shapes = engine.get_tensor_profile_shape(name, 0)
            assert [tuple(s) for s in shapes] == [low, opt, high], name


@requires_tensorrt
@pytest.mark.requires_tensorrt
def test_translator_engines(translator: Exported) -> None:
    _check_engines(*translator)


@requires_tensorrt
@pytest.mark.requires_tensorrt
def test_vit_engines(vit: Exported) -> None:
    _check_engines(*vit)


@requires_tensorrt
@pytest.mark.requires_tensorrt
def test_export_with_tensorrt_records_engines(tmp_path: Path) -> None:
    _, result, _ = _export(tmp_path, "vit", _tiny_vit(), tensorrt=True, precision="fp16")
    manifest = json.loads((result.version_dir / "manifest.json").read_text())
    assert "model.plan" in manifest["files"] and "model.layers.json" in manifest["files"]
    report = manifest["tensorrt"]
    assert report["flavour"] in ("tensorrt", "rtx") and report["precision"] == "fp16"
    (engine,) = report["engines"]
    assert engine["attention_layers"] == manifest["graphs"]["model"]["attention_nodes"]
    assert engine["bytes"] == (result.version_dir / "model.plan").stat().st_size
    assert engine["build_seconds"] <= engine["total_build_seconds"]
