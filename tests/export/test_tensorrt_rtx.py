"""The real TensorRT-RTX: its API surface, and engine builds of every exported graph.

TensorRT-RTX (``pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs``) imports, parses
and builds engines ahead of time on machines without a GPU, so everything here runs on a CPU
machine where it is installed; only running the engines needs a GPU it supports (compute
capability 8.0 / 8.6 / 8.9 / 12.x; tests/serving/test_tensorrt_engines.py). Without it every
test here skips.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from contract.graphs import graph_files
from export.exporter import ExportOptions, ExportResult, export
from export.tensorrt import FLAVOUR_ENV, RTX, load_library
from export.tensorrt import attention as attn
from export.tensorrt.build import _build
from export.tensorrt.network import collecting_logger
from tests.repositories import tiny_sources

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_rtx_bindings") is None,
    reason="TensorRT-RTX is not installed in this environment (pip install "
    "tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs: x86-64 Linux / Windows, Python "
    "3.10-3.13; importing it and building engines need no GPU)",
)

# What export.tensorrt and serving.backends.tensorrt_engine call, by owner.
API = {
    "": ("Builder", "OnnxParser", "Runtime", "ILogger", "Logger", "nptype", "IAttention"),
    "Builder": ("create_network", "create_builder_config", "create_optimization_profile"),
    "Builder.build_serialized_network": (),
    "IBuilderConfig": (
        "set_memory_pool_limit",
        "profiling_verbosity",
        "add_optimization_profile",
        "set_flag",
    ),
    "INetworkDefinition": ("num_layers", "get_layer", "num_inputs", "get_input"),
    "OnnxParser": ("parse", "num_errors", "get_error"),
    "IAttentionInputLayer": ("attention",),
    "IAttention": ("decomposable", "name", "get_input", "mask", "causal_kind"),
    "IOptimizationProfile": ("set_shape",),
    "Runtime": ("deserialize_cuda_engine", "get_engine_validity"),
    "ICudaEngine": (
        "num_io_tensors",
        "get_tensor_name",
        "get_tensor_dtype",
        "get_tensor_mode",
        "get_tensor_profile_shape",
        "create_execution_context",
        "create_engine_inspector",
    ),
    "IExecutionContext": (
        "set_input_shape",
        "get_tensor_shape",
        "set_tensor_address",
        "execute_async_v3",
    ),
    "EngineInspector": ("get_engine_information",),
    "ILogger": ("INTERNAL_ERROR", "ERROR", "WARNING"),
    "LayerType": ("ATTENTION_INPUT",),
    "MemoryPoolType": ("WORKSPACE",),
    "ProfilingVerbosity": ("DETAILED",),
    "LayerInformationFormat": ("JSON",),
    "TensorIOMode": ("INPUT",),
    "EngineValidity": ("INVALID", "VALID"),
    "EngineInvalidityDiagnostics": ("UNSUPPORTED_CC",),
}


def test_api_surface_the_code_uses() -> None:
    library = load_library("rtx")
    trt = library.trt
    assert library.flavour is RTX and trt.__name__ == "tensorrt_rtx_bindings"
    assert library.version >= (1, 7) and library.strongly_typed
    missing = []
    for owner, names in API.items():
        obj: Any = trt
        for part in filter(None, owner.split(".")):
            obj = getattr(obj, part)
        missing += [f"{owner}.{name}" for name in names if not hasattr(obj, name)]
    assert missing == []
    assert not hasattr(trt.BuilderFlag, "FP16")  # strongly typed: precision from the graph
    logger = collecting_logger(trt)
    network = trt.Builder(logger).create_network(0)  # no GPU needed
    assert network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert trt.nptype(trt.int64) is np.int64 and trt.nptype(trt.float16) is np.float16


CASES = [
    (kind, precision)
    for kind in ("vit", "translator", "captioner")
    for precision in ("fp32", "fp16")
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], ExportResult]:
    """The tiny models exported with --tensorrt built by TensorRT-RTX, fp32 and fp16."""
    root = tmp_path_factory.mktemp("rtx")
    sources = {source.kind: source for source in tiny_sources()}
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FLAVOUR_ENV, "rtx")
        for kind, precision in CASES:
            options = ExportOptions(
                name=f"{kind}-{precision}", precision=precision, tensorrt=True, parity_examples=100
            )
            results[kind, precision] = export(sources[kind], root, options)
    return results


@pytest.mark.parametrize(("kind", "precision"), CASES)
def test_every_graph_builds(
    exports: dict[tuple[str, str], ExportResult], kind: str, precision: str
) -> None:
    result = exports[kind, precision]
    manifest = json.loads((result.version_dir / "manifest.json").read_text())
    report = manifest["tensorrt"]
    trt = load_library("rtx").trt
    assert report["flavour"] == "rtx" and report["library"] == "TensorRT-RTX"
    assert report["tensorrt_version"] == trt.__version__
    assert report["strongly_typed"] and not report["fp16_flag"]
    assert report["precision"] == precision and report["timing_cache"] is None
    assert report["runs_on"] == list(RTX.runs_on)
    assert not (result.version_dir / "timing.cache").exists()
    graphs = graph_files("classifier" if kind == "vit" else "seq2seq")
    assert [e["graph"] for e in report["engines"]] == list(graphs)
    for entry in report["engines"]:
        _check_entry(result.version_dir, manifest, entry)


def _check_entry(version_dir: Path, manifest: dict[str, Any], entry: dict[str, Any]) -> None:
    plan = version_dir / entry["file"]
    assert plan.stat().st_size == entry["bytes"] > 0
    assert entry["file"] in manifest["files"] and entry["layers_file"] in manifest["files"]
    layers = json.loads((version_dir / entry["layers_file"]).read_text())
    assert len(layers) == entry["layers"] > 0
    nodes = manifest["graphs"][entry["graph"]]["attention_nodes"]
    assert entry["attention_layers"] == nodes > 0
    fused, decomposed = entry["fused_attention"], entry["decomposed_attention"]
    assert len(fused) + len(decomposed) == nodes and not set(fused) & set(decomposed)
    assert entry["fused_attention_layers"] == len(fused)
    first = entry["attempts"][0]
    assert first["decomposable"] == [] and first["built"] == (not decomposed)
    assert entry["attempts"][-1]["built"] or any(a["built"] for a in entry["attempts"])
    assert 0 < entry["build_seconds"] <= entry["total_build_seconds"]
    if entry["layers_source"] != "engine inspector":  # no GPU TensorRT-RTX runs engines on
        assert entry["layers_source"].startswith("network (engine not inspected: ")
        assert entry["layers"] == entry["network_layers"]


def test_fp32_encoder_attention_is_decomposed(
    exports: dict[tuple[str, str], ExportResult],
) -> None:
    """No fused fp32 kernel fits the ViT's attention: without decomposition the build fails."""
    report = json.loads((exports["vit", "fp32"].version_dir / "manifest.json").read_text())
    (entry,) = report["tensorrt"]["engines"]
    assert entry["fused_attention"] == []
    assert [a["built"] for a in entry["attempts"]] == [False, True]  # one kind of attention
    assert entry["attempts"][1]["decomposable"] == entry["decomposed_attention"]


@pytest.mark.parametrize("kind", ["translator", "captioner"])
def test_inplace_decoder_is_skipped_with_the_parsers_reason(
    exports: dict[tuple[str, str], ExportResult], kind: str
) -> None:
    """TensorScatter becomes TensorRT's KV-cache update, which needs a fixed cache length."""
    report = json.loads((exports[kind, "fp16"].version_dir / "manifest.json").read_text())
    (skipped,) = report["tensorrt"]["skipped"]
    assert skipped["graph"] == "decoder_inplace" and skipped["file"] == "decoder_inplace.onnx"
    assert "TensorScatter" in skipped["reason"] and "static sequence length" in skipped["reason"]
    assert "decodes with decoder.onnx" in skipped["reason"]
    assert "decoder_inplace.plan" not in report["files"]


def _two_kinds_of_attention() -> onnx.ModelProto:
    """fp16 attention with head size 64 (a fused kernel fits) and 8 (none does)."""
    nodes, inputs, outputs, weights = [], [], [], []
    for name, seq, head in (("wide", 16, 64), ("narrow", 17, 8)):
        shape = ["batch", 4, seq, head]
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT16, shape))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT16, shape))
        eye = np.eye(head, dtype=np.float16)
        weights.append(helper.make_tensor(f"w_{name}", TensorProto.FLOAT16, eye.shape, eye.ravel()))
        nodes += [
            helper.make_node("MatMul", [f"x_{name}", f"w_{name}"], [f"q_{name}"]),
            helper.make_node(
                "Attention", [f"q_{name}", f"x_{name}", f"x_{name}"], [f"a_{name}"], name=name
            ),
            helper.make_node("Add", [f"a_{name}", f"x_{name}"], [f"y_{name}"]),
        ]
    graph = helper.make_graph(nodes, "two", inputs, outputs, initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_probe_builds_find_the_attention_without_a_kernel() -> None:
    trt = load_library("rtx").trt
    logger = collecting_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    assert trt.OnnxParser(network, logger).parse(_two_kinds_of_attention().SerializeToString())
    attentions = attn.attention_layers(trt, network)
    assert attn.attention_names(attentions) == ["wide", "narrow"]
    assert len(attn.groups(attentions)) == 2
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, seq, head in (("wide", 16, 64), ("narrow", 17, 8)):
        profile.set_shape(f"x_{name}", (1, 4, seq, head), (2, 4, seq, head), (4, 4, seq, head))
    config.add_optimization_profile(profile)
    serialized, report = _build(trt, builder, network, config, logger, "two.onnx")
    assert serialized is not None
    assert report["fused_attention"] == ["wide"] and report["decomposed_attention"] == ["narrow"]
    # strict fails; "wide" alone strict builds; "narrow" alone strict fails; the build of the
    # "wide" probe is the engine kept (not built again)
    assert [(a["decomposable"], a["built"]) for a in report["attempts"]] == [
        ([], False),
        (["narrow"], True),
        (["wide"], False),
    ]
    assert [a.decomposable for a in attentions] == [False, True]
