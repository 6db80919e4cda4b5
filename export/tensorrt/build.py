"""Engine builds: one serialized engine ``{graph}.plan`` per graph of a version, with its report.

Each build runs the ONNX parser, adds one optimisation profile (``export.tensorrt.profiles``),
builds with every attention layer's decomposition forbidden first (a layer that builds so has a
fused kernel) and allows it only for the layers without one (``export.tensorrt.attention``), then
records the engine inspector's layer list where the engine can run here. ``export.exporter``
calls ``build_engines`` for ``--tensorrt``; what it returns goes into manifest.json as the build
report.

The library comes from ``export.tensorrt.library.load_library`` (TensorRT or TensorRT-RTX, one
code path): its ``Flavour`` says whether networks are always strongly typed (TensorRT 11,
TensorRT-RTX: precision comes from the ONNX graph, export with ``--precision fp16``) or take
``BuilderFlag.FP16`` (TensorRT 10), whether the timing cache does anything, and whether the
engine can be inspected without a GPU it runs on. Nothing here imports TensorRT itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.graphs import DECODER_FILE, DECODER_INPLACE, DECODER_INPLACE_FILE, graph_files
from contract.model_config import GeneratorConfig, ModelConfig
from export.tensorrt import attention as attn
from export.tensorrt.errors import TensorRTError
from export.tensorrt.library import Library, load_library
from export.tensorrt.network import (
    FUSED_LAYER_MARKERS,
    TIMING_CACHE_FILE,
    WORKSPACE_BYTES,
    collecting_logger,
    configure,
    count_fused_attention,
    engine_layers,
    parse,
)
from export.tensorrt.structure import check_structure

if TYPE_CHECKING:  # pragma: no cover - typing only
    from export.exporter import ExportOptions
    from export.sources import LoadedSource

__all__ = [
    "FUSED_LAYER_MARKERS",
    "TIMING_CACHE_FILE",
    "WORKSPACE_BYTES",
    "build_engines",
    "build_graph",
    "count_fused_attention",
]


def build_engines(
    version_dir: Path, loaded: LoadedSource, options: ExportOptions, flavour: str | None = None
) -> dict[str, Any]:
    """Build one engine per graph of a freshly exported version; returns the build report.

    The graphs of ``contract.graphs.graph_files`` are built or the export fails. A seq2seq
    model's in-place decoder (``decoder_inplace.onnx``) is built too when the parser takes it;
    otherwise the report's "skipped" says why (serving's TensorRT backend decodes with the
    growing-cache ``decoder.onnx``).

    Args:
        version_dir: REPOSITORY/NAME/VERSION with the ONNX graphs (config.yaml is not written yet;
            the config is derived with ``export.repository.model_config_for``).
        loaded: the exported source.
        options: the export options (precision, name; ``tensorrt_flavour`` when it has one).
        flavour: "auto", "tensorrt" or "rtx"; None: ``options.tensorrt_flavour``, else the
            ATTNSERVE_TENSORRT_FLAVOUR environment variable, else "auto".

    Returns:
        {"flavour", "library", "tensorrt_version", "strongly_typed", "fp16_flag", "precision",
         "runs_on", "workspace_bytes", "timing_cache", "structure", "profiles",
         "engines": [``build_graph`` entries], "skipped": [{"graph", "file", "reason"}]}.

    Raises:
        ExportError: no TensorRT flavour is installed (with what to do instead).
        TensorRTError: an unsupported version or precision, a structure check, the parser or the
            builder failed.
    """
    _check_precision(options.precision)
    library = load_library(flavour or getattr(options, "tensorrt_flavour", None))
    from export.repository import model_config_for

    version_dir = Path(version_dir)
    name = options.name or version_dir.parent.name
    config = model_config_for(loaded, name, options.precision)
    structure = check_structure(version_dir, config)
    fp16_flag = not library.strongly_typed and options.precision == "fp16"
    engines = [
        build_graph(library, version_dir, graph, filename, config, fp16_flag)
        for graph, filename in graph_files(config.kind).items()
    ]
    inplace, skipped = _inplace_decoder(library, version_dir, config, fp16_flag)
    kind = library.flavour
    return {
        "flavour": kind.name,
        "library": kind.label,
        "tensorrt_version": library.version_text,
        "strongly_typed": library.strongly_typed,
        "fp16_flag": fp16_flag,
        "precision": options.precision,
        "runs_on": list(kind.runs_on) or ["the GPU model the engines were built on"],
        "workspace_bytes": WORKSPACE_BYTES,
        "timing_cache": TIMING_CACHE_FILE if kind.timing_cache else None,
        "structure": structure["graphs"],
        "profiles": structure["profiles"],
        "engines": engines + inplace,
        "skipped": skipped,
    }


def _check_precision(precision: str) -> None:
    """Refuse the int8 export, whose quantised MatMuls TensorRT does not build."""
    if precision == "int8":
        raise TensorRTError(
            "TensorRT engines are built from fp32 or fp16 graphs; the int8 export uses ONNX "
            "Runtime dynamic quantisation (MatMulInteger), which TensorRT does not build: export "
            "with --precision fp16 (or fp32) for --tensorrt"
        )


def _inplace_decoder(
    library: Library, version_dir: Path, config: ModelConfig, fp16_flag: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """([engine entry], []) when the in-place decoder builds, ([], [skip entry]) when not."""
    path = version_dir / DECODER_INPLACE_FILE
    if not isinstance(config, GeneratorConfig) or not path.is_file():
        return [], []
    try:
        entry = build_graph(
            library, version_dir, DECODER_INPLACE, DECODER_INPLACE_FILE, config, fp16_flag
        )
    except TensorRTError as err:
        reason = (
            f"{err}. Not built: serving's TensorRT backend decodes with {DECODER_FILE} (the "
            "growing KV cache), which was built"
        )
        return [], [{"graph": DECODER_INPLACE, "file": DECODER_INPLACE_FILE, "reason": reason}]
    return [entry], []


def build_graph(
    library: Library,
    version_dir: Path,
    graph: str,
    filename: str,
    config: ModelConfig,
    fp16_flag: bool = False,
) -> dict[str, Any]:
    """Parse, configure, build and inspect one graph; writes ``{graph}.plan`` and its layers.

    Args:
        library: the TensorRT flavour (``load_library``).
        version_dir: REPOSITORY/NAME/VERSION.
        graph: the graph name ("model", "encoder", "decoder", "decoder_inplace").
        filename: its ONNX file.
        config: the model's config (the optimisation profile comes from it).
        fp16_flag: set ``BuilderFlag.FP16`` (weakly typed TensorRT 10 only).

    Returns:
        {"graph", "file", "layers_file", "bytes", "build_seconds" (the kept build),
         "total_build_seconds" (every attempt), "attempts", "layers", "layers_source",
         "network_layers", "attention_layers", "fused_attention", "decomposed_attention",
         "fused_attention_layers", "inspector_attention_layers"}.

    Raises:
        TensorRTError: the parser, the profile or the builder failed.
    """
    trt = library.trt
    logger = collecting_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: weakly typed; 11 and RTX: strongly
    parse(trt, network, logger, version_dir / filename)
    cache_path = version_dir / TIMING_CACHE_FILE if library.flavour.timing_cache else None
    builder_config = configure(
        library, builder, network, config, graph, filename, fp16_flag, cache_path
    )
    serialized, attention = _build(trt, builder, network, builder_config, logger, filename)
    if cache_path is not None:
        blob = builder_config.get_timing_cache().serialize()
        cache_path.write_bytes(bytes(memoryview(blob)))
    plan = version_dir / f"{graph}.plan"
    plan.write_bytes(bytes(memoryview(serialized)))
    layers, source = engine_layers(library, logger, plan.read_bytes(), network, graph)
    layers_file = version_dir / f"{graph}.layers.json"
    layers_file.write_text(json.dumps(layers, indent=1) + "\n")
    return {
        "graph": graph,
        "file": plan.name,
        "layers_file": layers_file.name,
        "bytes": plan.stat().st_size,
        **attention,
        "layers": len(layers),
        "layers_source": source,
        "network_layers": int(network.num_layers),
        "inspector_attention_layers": (
            count_fused_attention(layers) if source == "engine inspector" else None
        ),
    }


def _build(
    trt: Any, builder: Any, network: Any, builder_config: Any, logger: Any, filename: str
) -> tuple[Any, dict[str, Any]]:
    """Build with decomposition forbidden, then allowed only where no fused kernel fits.

    Returns:
        (the serialized engine, the attention part of the report).
    """
    attentions = attn.attention_layers(trt, network)
    names = attn.attention_names(attentions)
    attempts: list[dict[str, Any]] = []
    built: dict[frozenset[int], Any] = {}  # a probe that built is the engine to keep

    def attempt(decomposable: set[int]) -> Any:
        attn.set_decomposable(attentions, decomposable)  # the network says what was kept
        if frozenset(decomposable) in built:
            return built[frozenset(decomposable)]
        logger.clear()
        started = time.perf_counter()
        serialized = builder.build_serialized_network(network, builder_config)
        attempts.append(
            {
                "decomposable": [names[i] for i in sorted(decomposable)],
                "built": serialized is not None,
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
        if serialized is not None:
            built[frozenset(decomposable)] = serialized
        return serialized

    decomposable: set[int] = set()
    serialized = attempt(decomposable)
    if serialized is None and attentions and attn.lacks_kernel(logger.errors()):
        decomposable = _without_kernels(attentions, attempt)
        serialized = attempt(decomposable)
        if serialized is None and len(decomposable) < len(attentions):
            decomposable = set(range(len(attentions)))
            serialized = attempt(decomposable)
    if serialized is None:
        raise TensorRTError(f"TensorRT failed to build {filename}: {logger.errors() or '?'}")
    fused = [n for i, n in enumerate(names) if i not in decomposable]
    final = [names[i] for i in sorted(decomposable)]
    kept = next(a for a in attempts if a["built"] and a["decomposable"] == final)
    return serialized, {
        "build_seconds": kept["seconds"],
        "total_build_seconds": round(sum(a["seconds"] for a in attempts), 2),
        "attempts": attempts,
        "attention_layers": len(names),
        "fused_attention": fused,
        "decomposed_attention": final,
        "fused_attention_layers": len(fused),
    }


def _without_kernels(attentions: list[Any], attempt: Any) -> set[int]:
    """Indices of the attention layers with no fused kernel: one probe build per kind of layer.

    With one kind (same shapes, type, mask), the failed strict build already says it has none.
    Otherwise each kind is built with its decomposition forbidden and every other kind's
    allowed; the kinds whose build fails lack a kernel.
    """
    everything = set(range(len(attentions)))
    kinds = attn.groups(attentions)
    if len(kinds) == 1:
        return everything
    lacking: set[int] = set()
    for indices in kinds.values():
        if attempt(everything - set(indices)) is None:
            lacking |= set(indices)
    return lacking
