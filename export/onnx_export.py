"""torch -> ONNX for one graph: dynamo export, readable axis names, checker, op census."""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch

from export.errors import ExportError
from export.spec import AUTO_AXIS_NAMES, GraphSpec

LEGACY_OPSET = 18  # decomposed MatMul / Softmax attention for older runtimes


def export_graph(
    spec: GraphSpec, path: Path, opset: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> onnx.ModelProto:
    """Export ``spec`` to ``path`` and return the checked model.

    Args:
        dtype: floating dtype of the traced module (float16 graphs take float16 inputs).

    Raises:
        ExportError: when torch.onnx.export or the ONNX checker fails.
    """
    example = cast_floats(spec.example_inputs(torch.Generator().manual_seed(seed)), dtype)
    with torch.no_grad(), _quiet():
        try:
            torch.onnx.export(
                spec.module.eval(),
                example,
                str(path),
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_shapes=spec.dynamic_shapes,
                opset_version=spec.opset or opset,
                dynamo=True,
                external_data=False,
                custom_translation_table=spec.custom_translations,
            )
        except Exception as err:  # torch.export raises many unrelated types
            raise ExportError(f"exporting the {spec.name} graph failed: {err}") from err
    model = onnx.load(str(path))
    _name_axes(model, spec)
    drop_unused_outputs(model)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"the exported {spec.name} graph is invalid: {err}") from err
    onnx.save(model, str(path))
    return model


def drop_unused_outputs(model: onnx.ModelProto) -> None:
    """Remove the trailing outputs of nodes that nothing reads (optional outputs such as
    ``Attention``'s present keys / values, which a runtime would otherwise compute)."""
    read = {name for node in model.graph.node for name in node.input}
    read |= {value.name for value in model.graph.output}
    for node in model.graph.node:
        outputs = list(node.output)
        while len(outputs) > 1 and outputs[-1] not in read:
            outputs.pop()
        if len(outputs) < len(node.output):
            del node.output[:]
            node.output.extend(outputs)


def cast_floats(values: Any, dtype: torch.dtype) -> Any:
    """Cast the floating tensors of a nested tuple of example inputs to ``dtype``."""
    if isinstance(values, torch.Tensor):
        return values.to(dtype) if values.is_floating_point() else values
    return tuple(cast_floats(v, dtype) for v in values)


def op_census(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type the graph holds (``Attention`` shows fused attention)."""
    return dict(collections.Counter(node.op_type for node in model.graph.node).most_common())


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Every tensor name -> the nodes that read it, in graph order."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _name_axes(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Give Dim.AUTO axes their contract names and propagate them to outputs sharing the symbol."""
    renames: dict[str, str] = {}
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            wanted = AUTO_AXIS_NAMES.get((value.name, axis))
            if wanted and dim.dim_param and dim.dim_param != wanted:
                renames[dim.dim_param] = wanted
    if not renames:
        return
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's progress prints and warnings (errors still raise)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
