"""Structure checks with onnx only: can the exported graphs become fused-attention engines?

What can be checked without TensorRT: every graph holds standard ONNX ``Attention`` nodes
(TensorRT >= 10.14 parses them into its fused attention layer), head sizes are multiples of 8, and
the optimisation profiles (``export.tensorrt.profiles``) agree with the graphs' inputs and with the
ranges the graphs were exported for. ``onnx`` is imported inside the functions that read graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.graphs import FUSED_ATTENTION_OPSET, graph_files
from contract.model_config import ClassifierConfig, GeneratorConfig, ModelConfig
from export.tensorrt.errors import TensorRTError
from export.tensorrt.profiles import (
    AXIS_SOURCES,
    Profile,
    Shape,
    input_axes,
    profile_as_json,
    profiles_for,
    validate_profile,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

HEAD_DIM_MULTIPLE = 8  # TensorRT's fused multi-head attention kernels need head_dim % 8 == 0


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

    if isinstance(config, GeneratorConfig):
        _check_head_dim(config.decoder.head_dim, "config.yaml decoder.head_dim")
    report: dict[str, Any] = {"graphs": {}, "profiles": {}}
    for graph, filename in graph_files(config.kind).items():
        path = Path(version_dir) / filename
        if not path.is_file():
            raise TensorRTError(f"{path} is missing; export the model into {version_dir} first")
        model = onnx.load(str(path), load_external_data=False)
        report["graphs"][graph] = _check_attention(model, filename)
        profile = profiles_for(config, graph)
        validate_profile(profile, filename)
        _check_inputs(model, profile, input_axes(config, graph), filename)
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
    # The torch.export Dims the graphs were traced with; export.spec imports torch, so only here.
    from export.spec import BATCH, NEW, PAST, SOURCE

    limits = {
        "batch": (BATCH.min, BATCH.max, "the export's batch range"),
        "source_length": (SOURCE.min, SOURCE.max, "the export's source range"),
        "past_length": (PAST.min, PAST.max, "the export's past range"),
        "new_tokens": (NEW.min, NEW.max, "the export's new-token range"),
        "total_length": (PAST.min + NEW.min, PAST.max + NEW.max, "past + new"),
    }
    if isinstance(config, ClassifierConfig):
        return limits
    positions = config.decoder.max_positions
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
