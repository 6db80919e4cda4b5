"""TensorRT: optimisation profiles, structure checks, engine builds and ORT TensorRT EP options.

Four entry points:

- ``profiles_for(config, graph)``: min / opt / max shapes of every input of a graph, derived from
  the model's limits in config.yaml (batch, source, past and new-token lengths) and its fixed sizes
  (heads, head_dim, image channels and size).
- ``check_structure(version_dir, config)``: what can be checked without TensorRT, with onnx only:
  every graph holds standard ONNX ``Attention`` nodes (TensorRT >= 10.14 parses them into its fused
  attention layer), head sizes are multiples of 8, and the profiles agree with the graphs' inputs.
- ``build_engines(version_dir, loaded, options)``: one serialized engine ``{graph}.plan`` per graph
  (ONNX parser, one optimisation profile, timing cache, engine inspector); called by
  ``export.exporter`` for ``--tensorrt``.
- ``ort_tensorrt_provider_options(config, cache_dir, fp16, graph)``: the second GPU route, ONNX
  Runtime's TensorRT execution provider (then CUDA, then CPU) with the same profiles.

TensorRT 10 and 11 differ in precision handling: 11 is always strongly typed (precision comes from
the ONNX graph: export with ``--precision fp16``; the FP16 builder flag is gone), 10 builds weakly
typed networks where fp16 comes from ``BuilderFlag.FP16``. The major version is read from
``tensorrt.__version__``.

This module imports neither torch nor TensorRT at import time (``tensorrt`` is imported inside
``build_engines``; ``onnx`` inside ``check_structure``), so serving code can use the profile and
provider-option helpers.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from export.errors import ExportError
from serving.model_config import (
    CLASSIFIER_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    ModelConfig,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

    from export.exporter import ExportOptions
    from export.sources import LoadedSource

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)
Corners = tuple[int, int, int]  # one axis at the min, opt and max corner of a profile

OPT_BATCH = 8  # the batch TensorRT tunes its kernels for (capped by limits.max_batch_size)
HEAD_DIM_MULTIPLE = 8  # TensorRT's fused multi-head attention kernels need head_dim % 8 == 0
FUSED_ATTENTION_OPSET = 23  # torch exports SDPA as the ONNX Attention op from this opset on
MIN_TENSORRT = (10, 14)  # first TensorRT whose ONNX parser maps Attention to its fused layer
WORKSPACE_BYTES = 2 << 30  # builder workspace (TensorRT) / trt_max_workspace_size (ORT EP)
TIMING_CACHE_FILE = "timing.cache"
FUSED_LAYER_MARKERS = ("attention", "mha", "fmha")  # layer names / types of fused attention
INSTALL_MESSAGE = (
    "TensorRT is not installed here: `pip install tensorrt` needs NVIDIA's package index and an "
    "NVIDIA GPU; export without --tensorrt, or use the ONNX Runtime TensorRT execution provider "
    "options (export.tensorrt.ort_tensorrt_provider_options, with onnxruntime-gpu) to compile the "
    "ONNX graphs with TensorRT when the server loads them"
)

# What each profile axis is derived from in config.yaml (quoted in error messages).
AXIS_SOURCES = {
    "batch": "limits.max_batch_size",
    "source": "limits.max_source_length",
    "past": "decoder.max_positions and limits.max_new_tokens",
    "new": "new tokens per decoder call",
    "total": "past + new tokens",
    "heads": "decoder.num_heads",
    "head_dim": "decoder.head_dim",
    "channels": "the length of image.mean",
    "height": "image.size",
    "width": "image.size",
}


class TensorRTError(ExportError):
    """A graph, config or profile that TensorRT cannot build as asked; the message says why."""


# --------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------


def graph_files(config: ModelConfig) -> dict[str, str]:
    """Graph name -> ONNX file name of a model version (the ONNX contract of shared/DESIGN.md).

    Args:
        config: the model's config.yaml.

    Returns:
        {"encoder": "encoder.onnx", "decoder": "decoder.onnx"} for seq2seq models,
        {"model": "model.onnx"} for classifiers.
    """
    if config.kind == "seq2seq":
        return {"encoder": ENCODER_FILE, "decoder": DECODER_FILE}
    return {"model": CLASSIFIER_FILE}


def profiles_for(config: ModelConfig, graph: str, *, new_tokens: int = 1) -> Profile:
    """Min / opt / max shapes of every input of ``graph``, in the graph's input order.

    Dynamic axes follow the limits: batch 1..limits.max_batch_size (opt min(8, max)); source
    1..limits.max_source_length (fixed for image encoders); past 0..min(decoder.max_positions -
    new_tokens, limits.max_new_tokens); new tokens 1..new_tokens (1: a decode-step profile, larger:
    a prefill profile); the self-attention mask spans past + new at every corner. Fixed axes
    (heads, head_dim, image channels / size) come from config.decoder and config.image. Each
    corner (min, opt, max) is one consistent set of shapes, as TensorRT checks the network at
    each.

    Args:
        config: the model's config.yaml.
        graph: "encoder" or "decoder" (seq2seq), "model" (classifier).
        new_tokens: most tokens one decoder call feeds (decoder only).

    Returns:
        input name -> (min, opt, max) shapes.

    Raises:
        ValueError: an unknown graph for this model, or new_tokens out of range.
    """
    templates = _templates(config, graph)
    axes = _axes(config, graph, new_tokens)
    return {name: _corners(template, axes) for name, template in templates.items()}


def validate_profile(profile: Profile, where: str = "profile") -> None:
    """Check min <= opt <= max on every axis, equal ranks, no negative sizes.

    Args:
        profile: input name -> (min, opt, max).
        where: what the profile belongs to, for the message (e.g. "decoder.onnx").

    Raises:
        TensorRTError: naming the input and axis.
    """
    for name, (low, opt, high) in profile.items():
        if not len(low) == len(opt) == len(high):
            raise TensorRTError(
                f"{where}: input {name!r} has shapes of different ranks in its profile: "
                f"min {low}, opt {opt}, max {high}"
            )
        for axis, (a, b, c) in enumerate(zip(low, opt, high, strict=True)):
            if not 0 <= a <= b <= c:
                raise TensorRTError(
                    f"{where}: input {name!r} axis {axis} needs 0 <= min <= opt <= max, "
                    f"got {a} / {b} / {c}"
                )


def profile_as_json(profile: Profile) -> dict[str, dict[str, list[int]]]:
    """``{name: {"min": [...], "opt": [...], "max": [...]}}`` for manifest.json."""
    return {
        name: {"min": list(low), "opt": list(opt), "max": list(high)}
        for name, (low, opt, high) in profile.items()
    }


def _kv_names(prefix: str, num_layers: int) -> list[str]:
    """Same order as export.graphs.kv_names (not imported: that module needs torch)."""
    return [f"{prefix}_{part}.{i}" for i in range(num_layers) for part in ("key", "value")]


def _templates(config: ModelConfig, graph: str) -> dict[str, tuple[str, ...]]:
    """Input name -> axis symbols (keys of ``_axes``), in the graph's input order."""
    image = ("batch", "channels", "height", "width")
    if config.kind == "classifier":
        if graph != "model":
            raise ValueError(f"a classifier has one graph, 'model'; got {graph!r}")
        return {"pixel_values": image}
    if graph == "encoder":
        if config.input == "image":
            return {"pixel_values": image}
        return {"input_ids": ("batch", "source"), "attention_mask": ("batch", "source")}
    if graph != "decoder":
        raise ValueError(f"a seq2seq model has graphs 'encoder' and 'decoder'; got {graph!r}")
    assert config.decoder is not None  # ModelConfig guarantees it for seq2seq
    layers = config.decoder.num_layers
    templates: dict[str, tuple[str, ...]] = {
        "input_ids": ("batch", "new"),
        "position_ids": ("batch", "new"),
        "self_attention_mask": ("batch", "total"),
        "cross_attention_mask": ("batch", "source"),
    }
    templates.update(
        dict.fromkeys(_kv_names("past", layers), ("batch", "heads", "past", "head_dim"))
    )
    templates.update(
        dict.fromkeys(_kv_names("cross", layers), ("batch", "heads", "source", "head_dim"))
    )
    return templates


def _axes(config: ModelConfig, graph: str, new_tokens: int) -> dict[str, Corners]:
    """Axis symbol -> (min, opt, max) for one graph."""
    limits = config.limits
    batch = limits.max_batch_size
    axes: dict[str, Corners] = {"batch": (1, min(OPT_BATCH, batch), batch)}
    if config.image is not None:
        size = config.image.size
        axes.update(
            channels=_fixed(len(config.image.mean)), height=_fixed(size), width=_fixed(size)
        )
    source = limits.max_source_length
    # Image encoders have a fixed number of positions (patches + class token).
    axes["source"] = _fixed(source) if config.input == "image" else _span(1, source)
    decoder = config.decoder
    if decoder is None or graph != "decoder":
        return axes
    if not 1 <= new_tokens < decoder.max_positions:
        raise ValueError(
            f"new_tokens must be between 1 and decoder.max_positions - 1 "
            f"({decoder.max_positions - 1}), got {new_tokens}"
        )
    past_max = min(decoder.max_positions - new_tokens, limits.max_new_tokens)
    past = _span(0, past_max)
    new = (1, 1, new_tokens)  # decode steps (one new token) are what the engine is tuned for
    axes.update(
        past=past,
        new=new,
        total=(past[0] + new[0], past[1] + new[1], past[2] + new[2]),
        heads=_fixed(decoder.num_heads),
        head_dim=_fixed(decoder.head_dim),
    )
    return axes


def _fixed(size: int) -> Corners:
    return (size, size, size)


def _span(low: int, high: int) -> Corners:
    """A dynamic axis: opt halfway (TensorRT tunes for opt, and must serve min..max)."""
    return (low, max(low, (low + high) // 2), high)


def _corners(template: tuple[str, ...], axes: Mapping[str, Corners]) -> tuple[Shape, Shape, Shape]:
    return (
        tuple(axes[s][0] for s in template),
        tuple(axes[s][1] for s in template),
        tuple(axes[s][2] for s in template),
    )


# --------------------------------------------------------------------------------------------
# Structure checks (onnx only)
# --------------------------------------------------------------------------------------------


def check_structure(version_dir: Path, config: ModelConfig) -> dict[str, Any]:
    """Check, without TensorRT, that the graphs of a version can become fused-attention engines.

    Every graph must hold standard ONNX ``Attention`` nodes (exported at opset >= 23), head sizes
    must be multiples of 8 (TensorRT's fused multi-head attention), and the optimisation profiles
    from ``profiles_for`` must match the graph inputs: the same names, fixed axes equal to the
    graph's (heads, head_dim, image channels and size), axes sharing one symbolic name equal at
    every corner, and dynamic ranges inside what the graph accepts (the export's dynamic-shape
    bounds and the position tables).

    Args:
        version_dir: REPOSITORY/NAME/VERSION holding the ONNX graphs.
        config: the model's config.yaml (or what ``export.repository.model_config_for`` gives).

    Returns:
        {"graphs": {graph: {"file", "opset", "attention_nodes", "head_dims"}},
         "profiles": {graph: {input: {"min", "opt", "max"}}}}.

    Raises:
        TensorRTError: a missing graph, no Attention nodes, a bad head size, or a profile that
            disagrees with the graph; the message names the file, input and axis.
    """
    import onnx

    if config.decoder is not None:
        _check_head_dim(config.decoder.head_dim, "config.yaml decoder.head_dim")
    report: dict[str, Any] = {"graphs": {}, "profiles": {}}
    for graph, filename in graph_files(config).items():
        path = Path(version_dir) / filename
        if not path.is_file():
            raise TensorRTError(f"{path} is missing; export the model into {version_dir} first")
        model = onnx.load(str(path), load_external_data=False)
        report["graphs"][graph] = _check_attention(model, filename)
        profile = profiles_for(config, graph)
        validate_profile(profile, filename)
        _check_inputs(model, profile, _templates(config, graph), filename)
        _check_limits(model, profile, _axis_limits(config, graph), filename)
        report["profiles"][graph] = profile_as_json(profile)
    return report


def _check_attention(model: onnx.ModelProto, filename: str) -> dict[str, Any]:
    """Attention node count and head sizes of one graph."""
    opset = _default_opset(model)
    count = sum(1 for node in model.graph.node if node.op_type == "Attention")
    if count == 0:
        raise TensorRTError(
            f"{filename} has no ONNX Attention nodes (exported at opset {opset}, attention "
            f"decomposed into MatMul/Softmax): TensorRT's fused attention needs the standard "
            f"Attention op, which torch exports only at opset >= {FUSED_ATTENTION_OPSET}; "
            f"re-export with --opset {FUSED_ATTENTION_OPSET}"
        )
    head_dims = sorted(set(_attention_head_dims(model)))
    for head_dim in head_dims:
        _check_head_dim(head_dim, f"{filename}'s Attention nodes")
    return {"file": filename, "opset": opset, "attention_nodes": count, "head_dims": head_dims}


def _check_head_dim(head_dim: int, where: str) -> None:
    if head_dim % HEAD_DIM_MULTIPLE:
        raise TensorRTError(
            f"head_dim {head_dim} ({where}) is not a multiple of {HEAD_DIM_MULTIPLE}: TensorRT's "
            f"fused multi-head attention kernels need head sizes (d_model / num_heads) that are "
            f"multiples of {HEAD_DIM_MULTIPLE}; choose d_model and num_heads accordingly"
        )


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _attention_head_dims(model: onnx.ModelProto) -> list[int]:
    """Head sizes of the Attention nodes whose query shape is known (4-D, or 3-D + q_num_heads)."""
    shapes = _value_shapes(model)
    attention = [n for n in model.graph.node if n.op_type == "Attention"]
    if any(node.input[0] not in shapes for node in attention):
        shapes = _value_shapes(_inferred(model))
    dims = []
    for node in attention:
        shape = shapes.get(node.input[0])
        if not shape or not isinstance(shape[-1], int):
            continue
        if len(shape) == 4:
            dims.append(shape[-1])
        elif len(shape) == 3:
            heads = next((a.i for a in node.attribute if a.name == "q_num_heads"), 0)
            if heads:
                dims.append(shape[-1] // heads)
    return dims


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort (huge or unusual graphs)
        return model


def _value_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    values = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    return {v.name: _dims(v) for v in values if v.type.tensor_type.HasField("shape")}


def _dims(value: Any) -> list[int | str | None]:
    """Axis sizes of an ONNX value: int (fixed), str (symbolic name) or None (unknown)."""
    dims: list[int | str | None] = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return dims


def _graph_inputs(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    initializers = {t.name for t in model.graph.initializer}
    return {v.name: _dims(v) for v in model.graph.input if v.name not in initializers}


def _check_inputs(
    model: onnx.ModelProto,
    profile: Profile,
    templates: Mapping[str, tuple[str, ...]],
    filename: str,
) -> None:
    """Names, ranks, fixed axes and shared symbolic axes of the graph against the profile."""
    inputs = _graph_inputs(model)
    missing = [n for n in inputs if n not in profile]
    extra = [n for n in profile if n not in inputs]
    if missing or extra:
        raise TensorRTError(
            f"{filename}: graph inputs and profile disagree: the graph's inputs "
            f"{missing or 'all'} have no profile; profile inputs {extra or 'none'} are not in "
            f"the graph (the graph has {list(inputs)})"
        )
    shared: dict[str, tuple[str, int, Shape]] = {}
    for name, dims in inputs.items():
        low, opt, high = profile[name]
        if len(dims) != len(low):
            raise TensorRTError(
                f"{filename}: input {name!r} has rank {len(dims)} in the graph but "
                f"{len(low)} in the profile {low}"
            )
        for axis, dim in enumerate(dims):
            corners = (low[axis], opt[axis], high[axis])
            source = AXIS_SOURCES.get(templates[name][axis], templates[name][axis])
            if isinstance(dim, int) and corners != (dim, dim, dim):
                raise TensorRTError(
                    f"{filename}: input {name!r} axis {axis} is fixed at {dim} in the graph, but "
                    f"the profile gives min/opt/max {'/'.join(map(str, corners))} (from "
                    f"config.yaml {source}); re-export the model or fix config.yaml"
                )
            if isinstance(dim, str):
                _check_shared(shared, dim, name, axis, corners, filename)
    _check_total_length(shared, filename)


def _check_shared(
    shared: dict[str, tuple[str, int, Shape]],
    symbol: str,
    name: str,
    axis: int,
    corners: Shape,
    filename: str,
) -> None:
    """Axes with one symbolic name in the graph must have equal sizes at every corner."""
    first = shared.setdefault(symbol, (name, axis, corners))
    if first[2] != corners:
        raise TensorRTError(
            f"{filename}: axis {symbol!r} is shared by input {first[0]!r} (axis {first[1]}) and "
            f"input {name!r} (axis {axis}) in the graph, but the profile gives them min/opt/max "
            f"{'/'.join(map(str, first[2]))} and {'/'.join(map(str, corners))}"
        )


def _check_total_length(shared: Mapping[str, tuple[str, int, Shape]], filename: str) -> None:
    """The self-attention mask covers past + new tokens at every corner."""
    if not {"total_length", "past_length", "new_tokens"} <= shared.keys():
        return
    total, past, new = (shared[k] for k in ("total_length", "past_length", "new_tokens"))
    if any(t != p + n for t, p, n in zip(total[2], past[2], new[2], strict=True)):
        raise TensorRTError(
            f"{filename}: input {total[0]!r} (total_length) must equal past_length + new_tokens "
            f"at every profile corner; got {total[2]} for past {past[2]} + new {new[2]}"
        )


def _axis_limits(config: ModelConfig, graph: str) -> dict[str, tuple[int, int, str]]:
    """Symbolic axis name -> (lowest, highest, why) the exported graph accepts."""
    from export.spec import (
        BATCH,
        NEW,
        PAST,
        SOURCE,
    )  # torch.export Dims the graphs were traced with

    limits = {
        "batch": (BATCH.min, BATCH.max, "the export's batch range"),
        "source_length": (SOURCE.min, SOURCE.max, "the export's source range"),
        "past_length": (PAST.min, PAST.max, "the export's past range"),
        "new_tokens": (NEW.min, NEW.max, "the export's new-token range"),
        "total_length": (PAST.min + NEW.min, PAST.max + NEW.max, "past + new"),
    }
    decoder = config.decoder
    if decoder is None:
        return limits
    positions = decoder.max_positions
    table = f"the position table of decoder.max_positions = {positions}"
    limits["past_length"] = (PAST.min, min(PAST.max, positions - 1), table)
    limits["new_tokens"] = (NEW.min, min(NEW.max, positions), table)
    limits["total_length"] = (PAST.min + NEW.min, min(PAST.max + NEW.max, positions), table)
    if config.input == "text":  # the translator's encoder shares the position table size
        limits["source_length"] = (SOURCE.min, min(SOURCE.max, positions), table)
    return limits


def _check_limits(
    model: onnx.ModelProto,
    profile: Profile,
    limits: Mapping[str, tuple[int, int, str]],
    filename: str,
) -> None:
    """Dynamic axes of the profile must lie inside the range the graph accepts."""
    for name, dims in _graph_inputs(model).items():
        low, _, high = profile[name]
        for axis, dim in enumerate(dims):
            if not isinstance(dim, str) or dim not in limits:
                continue
            lowest, highest, why = limits[dim]
            if low[axis] < lowest or high[axis] > highest:
                raise TensorRTError(
                    f"{filename}: input {name!r} axis {axis} ({dim}) spans {low[axis]}.."
                    f"{high[axis]} in the profile (from config.yaml limits), but the graph accepts "
                    f"{lowest}..{highest} ({why}); lower the limit in config.yaml"
                )


# --------------------------------------------------------------------------------------------
# Engine builds (TensorRT)
# --------------------------------------------------------------------------------------------


def build_engines(
    version_dir: Path, loaded: LoadedSource, options: ExportOptions
) -> dict[str, Any]:
    """Build one TensorRT engine per graph of a freshly exported version.

    For each graph: ONNX parser, one optimisation profile (``profiles_for``), timing cache at
    VERSION/timing.cache (loaded if present, saved after each build), detailed profiling
    verbosity, ``build_serialized_network``; writes ``{graph}.plan`` and the engine inspector's
    layer list ``{graph}.layers.json``. TensorRT 11 networks are strongly typed (precision from
    the graph); on TensorRT 10, ``--precision fp16`` sets ``BuilderFlag.FP16``.

    Args:
        version_dir: REPOSITORY/NAME/VERSION with the ONNX graphs (config.yaml is not written yet;
            the config is derived with ``export.repository.model_config_for``).
        loaded: the exported source.
        options: the export options (precision, name).

    Returns:
        {"tensorrt_version", "strongly_typed", "fp16_flag", "workspace_bytes", "timing_cache",
         "structure", "profiles", "engines": [{"graph", "file", "layers_file", "bytes",
         "build_seconds", "layers", "fused_attention_layers"}]}.

    Raises:
        ExportError: TensorRT is not installed (with what to do instead).
        TensorRTError: an unsupported TensorRT version or precision, a structure check, the
            parser or the builder failed.
    """
    try:
        import tensorrt as trt
    except ImportError as err:
        raise ExportError(INSTALL_MESSAGE) from err
    from export.repository import model_config_for

    version = _tensorrt_version(trt.__version__)
    if options.precision == "int8":
        raise TensorRTError(
            "TensorRT engines are built from fp32 or fp16 graphs; the int8 export uses ONNX "
            "Runtime dynamic quantisation (MatMulInteger), which TensorRT does not build: export "
            "with --precision fp16 (or fp32) for --tensorrt"
        )
    name = options.name or Path(version_dir).parent.name
    config = model_config_for(loaded, name, options.precision)
    structure = check_structure(Path(version_dir), config)
    strongly_typed = version[0] >= 11
    fp16_flag = not strongly_typed and options.precision == "fp16"
    engines = [
        _build_engine(trt, Path(version_dir), graph, filename, config, fp16_flag)
        for graph, filename in graph_files(config).items()
    ]
    return {
        "tensorrt_version": trt.__version__,
        "strongly_typed": strongly_typed,
        "fp16_flag": fp16_flag,
        "workspace_bytes": WORKSPACE_BYTES,
        "timing_cache": TIMING_CACHE_FILE,
        "structure": structure["graphs"],
        "profiles": structure["profiles"],
        "engines": engines,
    }


def _tensorrt_version(text: str) -> tuple[int, int]:
    """(major, minor) of ``tensorrt.__version__``, refusing versions without ONNX Attention."""
    parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
    version = (*parts, 0, 0)[:2]
    if version < MIN_TENSORRT:
        raise TensorRTError(
            f"TensorRT {text} cannot parse the ONNX Attention op into its fused attention layer; "
            f"install TensorRT >= {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]}"
        )
    return version[0], version[1]


def _build_engine(
    trt: Any, version_dir: Path, graph: str, filename: str, config: ModelConfig, fp16_flag: bool
) -> dict[str, Any]:
    """Parse, configure, build and inspect one graph; returns its manifest entry."""
    logger = _collecting_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # 10.x: weakly typed; 11.x: always strongly typed
    _parse(trt, network, logger, version_dir / filename)
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    builder_config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if fp16_flag:  # TensorRT 10 only: BuilderFlag.FP16 no longer exists in 11
        builder_config.set_flag(trt.BuilderFlag.FP16)
    _add_profile(builder, builder_config, network, profiles_for(config, graph), filename)
    cache_path = version_dir / TIMING_CACHE_FILE
    _load_timing_cache(builder_config, cache_path)
    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, builder_config)
    seconds = time.perf_counter() - started
    if serialized is None:
        raise TensorRTError(
            f"TensorRT failed to build the {graph} engine from {filename}: {logger.errors() or '?'}"
        )
    cache_path.write_bytes(bytes(memoryview(builder_config.get_timing_cache().serialize())))
    plan = version_dir / f"{graph}.plan"
    plan.write_bytes(bytes(memoryview(serialized)))
    layers = _inspect(trt, logger, plan.read_bytes(), graph)
    layers_file = version_dir / f"{graph}.layers.json"
    layers_file.write_text(json.dumps(layers, indent=1) + "\n")
    return {
        "graph": graph,
        "file": plan.name,
        "layers_file": layers_file.name,
        "bytes": plan.stat().st_size,
        "build_seconds": round(seconds, 1),
        "layers": len(layers),
        "fused_attention_layers": count_fused_attention(layers),
    }


def _collecting_logger(trt: Any) -> Any:
    """A trt.ILogger that prints warnings and keeps errors for exception messages."""

    class CollectingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self.messages.append(msg)
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR, trt.ILogger.WARNING):
                print(f"[TensorRT] {msg}", file=sys.stderr, flush=True)

        def errors(self) -> str:
            return "; ".join(self.messages[-5:])

    return CollectingLogger()


def _parse(trt: Any, network: Any, logger: Any, path: Path) -> None:
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(path.read_bytes(), str(path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TensorRTError(
            f"TensorRT's ONNX parser rejected {path.name}: {'; '.join(errors) or logger.errors()}"
        )


def _add_profile(
    builder: Any, builder_config: Any, network: Any, profile: Profile, filename: str
) -> None:
    """One optimisation profile over the network's inputs."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    missing = [t.name for t in inputs if t.name not in profile]
    if missing:
        raise TensorRTError(f"{filename}: TensorRT network inputs {missing} have no profile")
    optimisation = builder.create_optimization_profile()
    for tensor in inputs:
        low, opt, high = profile[tensor.name]
        optimisation.set_shape(tensor.name, low, opt, high)
    if builder_config.add_optimization_profile(optimisation) < 0:
        raise TensorRTError(f"{filename}: TensorRT refused the optimisation profile {profile}")


def _load_timing_cache(builder_config: Any, path: Path) -> None:
    """Reuse VERSION/timing.cache when it was made on this GPU and TensorRT; else start fresh."""
    blob = path.read_bytes() if path.is_file() else b""
    cache = builder_config.create_timing_cache(blob)
    if not builder_config.set_timing_cache(cache, ignore_mismatch=False):
        builder_config.set_timing_cache(builder_config.create_timing_cache(b""), False)


def _inspect(trt: Any, logger: Any, plan: bytes, graph: str) -> list[Any]:
    """The engine inspector's layer list (dicts with DETAILED verbosity, names otherwise)."""
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TensorRTError(f"the {graph} engine just built cannot be deserialized")
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return list(info.get("Layers", [])) if isinstance(info, dict) else list(info)


def count_fused_attention(layers: list[Any]) -> int:
    """Layers whose name, type or tactic mentions attention / MHA / fmha.

    Args:
        layers: the "Layers" list of the engine inspector's JSON (dicts or names).

    Returns:
        how many layers run fused attention kernels.
    """

    def text(layer: Any) -> str:
        if isinstance(layer, str):
            return layer.lower()
        fields = ("Name", "LayerType", "TacticName", "Metadata")
        return " ".join(str(layer.get(k, "")) for k in fields).lower()

    return sum(1 for layer in layers if any(m in text(layer) for m in FUSED_LAYER_MARKERS))


# --------------------------------------------------------------------------------------------
# ONNX Runtime TensorRT execution provider
# --------------------------------------------------------------------------------------------


def ort_tensorrt_provider_options(
    config: ModelConfig,
    cache_dir: Path,
    fp16: bool,
    graph: str | None = None,
    device_id: int = 0,
) -> list[tuple[str, dict[str, Any]]]:
    """Execution providers for one graph's ONNX Runtime session: TensorRT, then CUDA, then CPU.

    The TensorRT EP gets the same profile as ``build_engines`` (``trt_profile_*_shapes`` strings
    "name:1x3x32x32,name2:..."), engine and timing caches under ``cache_dir``, and a workspace
    limit. Encoder and decoder share input names with different shapes, so each graph needs its
    own session options.

    Args:
        config: the model's config.yaml.
        cache_dir: folder for the EP's engine and timing caches (created by ONNX Runtime).
        fp16: let TensorRT lower an fp32 graph to fp16 (TensorRT 10; TensorRT 11 takes precision
            from the graph, so pass False and export with --precision fp16).
        graph: "encoder" / "decoder" (seq2seq), "model" (the default for classifiers).
        device_id: the CUDA device.

    Returns:
        [("TensorrtExecutionProvider", {...}), ("CUDAExecutionProvider", {...}),
         ("CPUExecutionProvider", {})], for InferenceSession(providers=...).

    Raises:
        ValueError: no graph given for a seq2seq model, or an unknown graph.
    """
    files = graph_files(config)
    if graph is None:
        if len(files) != 1:
            raise ValueError(
                f"a {config.kind} model has graphs {list(files)} with different inputs; pass "
                "graph= to get each session's provider options"
            )
        graph = next(iter(files))
    profile = profiles_for(config, graph)
    cache = str(cache_dir)
    tensorrt = {
        "device_id": device_id,
        "trt_fp16_enable": bool(fp16),
        "trt_max_workspace_size": WORKSPACE_BYTES,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": cache,
        "trt_profile_min_shapes": profile_shapes_string(profile, 0),
        "trt_profile_opt_shapes": profile_shapes_string(profile, 1),
        "trt_profile_max_shapes": profile_shapes_string(profile, 2),
    }
    cuda = {
        "device_id": device_id,
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "do_copy_in_default_stream": True,
    }
    return [
        ("TensorrtExecutionProvider", tensorrt),
        ("CUDAExecutionProvider", cuda),
        ("CPUExecutionProvider", {}),
    ]


def profile_shapes_string(profile: Profile, corner: int) -> str:
    """ONNX Runtime's profile format: "name:1x3x32x32,name2:2x7" for one corner.

    Args:
        profile: input name -> (min, opt, max).
        corner: 0 (min), 1 (opt) or 2 (max).

    Returns:
        the trt_profile_{min,opt,max}_shapes value.
    """
    return ",".join(
        f"{name}:{'x'.join(str(d) for d in shapes[corner])}" for name, shapes in profile.items()
    )


def parse_profile_shapes(text: str) -> dict[str, Shape]:
    """Inverse of ``profile_shapes_string``: "a:1x2,b:3" -> {"a": (1, 2), "b": (3,)}.

    Raises:
        ValueError: a malformed entry.
    """
    shapes: dict[str, Shape] = {}
    for entry in filter(None, text.split(",")):
        name, sep, dims = entry.rpartition(":")
        if not sep or not name:
            raise ValueError(f"profile entry {entry!r} is not NAME:DxDx...")
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes
