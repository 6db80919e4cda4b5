"""Precision variants: fp16 graphs (exported from a half copy) and int8 dynamic quantisation."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import onnx
from torch import nn

from export.errors import ExportError

PRECISIONS = ("fp32", "fp16", "int8")


def check_precision(precision: str) -> str:
    """Return ``precision`` if supported.

    Raises:
        ExportError: naming the supported precisions.
    """
    if precision not in PRECISIONS:
        raise ExportError(f"unknown precision {precision!r}; supported: {', '.join(PRECISIONS)}")
    return precision


def model_for_precision(model: nn.Module, precision: str) -> nn.Module:
    """The module to trace: a half copy for fp16 (TensorRT 11 takes precision from the graph)."""
    if precision == "fp16":
        return copy.deepcopy(model).half().eval()
    return model


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights of ``source`` into ``target``.

    Only MatMul is quantised: with the defaults ONNX Runtime rewrites the standard ``Attention``
    op into its contrib ``QAttention``, which it then refuses to load (measured, see FACTS.md).

    Raises:
        ExportError: when quantisation fails.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger("root").setLevel(logging.ERROR)
    # The exporter's value_info shapes trip the quantiser's own shape inference ("Inferred shape
    # and existing shape differ"); it re-infers them anyway.
    model = onnx.load(str(source))
    del model.graph.value_info[:]
    clean = target.with_suffix(".unquantized.onnx")
    onnx.save(model, str(clean))
    try:
        quantize_dynamic(
            str(clean),
            str(target),
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            per_channel=False,
        )
    except Exception as err:  # the quantiser raises assorted types
        raise ExportError(f"int8 quantisation of {source.name} failed: {err}") from err
    finally:
        clean.unlink(missing_ok=True)
