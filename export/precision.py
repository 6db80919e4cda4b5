"""Precision variants: fp16 graphs (mixed precision) and int8 dynamic quantisation."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from export.errors import ExportError
from export.fused_projections import unfuse_projections
from models.layers import FeedForward

PRECISIONS = ("fp32", "fp16", "int8")
HALF = torch.float16


def check_precision(precision: str) -> str:
    """Return ``precision`` if supported.

    Raises:
        ExportError: naming the supported precisions.
    """
    if precision not in PRECISIONS:
        raise ExportError(f"unknown precision {precision!r}; supported: {', '.join(PRECISIONS)}")
    return precision


class HalfLinear(nn.Module):
    """A Linear with fp16 weights whose matmul runs in fp16; input and output keep their dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().to(HALF), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(HALF), False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x.to(HALF), self.weight, self.bias).to(x.dtype)


class HalfFeedForward(nn.Module):
    """A feed-forward block (``models.layers.FeedForward``) run in fp16 from fc1 to fc2, the
    activation included; input and output keep their dtype. Its hidden values are fp16 either
    way (fc1's product), so an fp32 activation only adds a Cast each side: two kernels per layer
    and decode step on a GPU."""

    def __init__(self, ffn: FeedForward) -> None:
        super().__init__()
        self.fc1, self.fc2 = HalfLinear(ffn.fc1), HalfLinear(ffn.fc2)
        self.act: Callable[[Tensor], Tensor] = ffn.act

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.act(F.linear(x.to(HALF), self.fc1.weight, self.fc1.bias))
        return F.linear(hidden, self.fc2.weight, self.fc2.bias).to(x.dtype)


def mixed_half(model: nn.Module) -> nn.Module:
    """The fp16 variant: fp16 weights, matmuls and KV cache; fp32 residual stream and norms.

    fp16 graph inputs (pixels, cached keys/values) stay fp16, as TensorRT 11's strongly typed
    builds need; the residual stream, layer norms, softmax and logits are fp32, which keeps the
    outputs within the fp16 parity tolerance where an all-half model is not (measured: the
    captioner's logits were 0.022 off PyTorch fp32).
    """
    mixed = copy.deepcopy(model).eval()
    for module in list(mixed.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, FeedForward):
                setattr(module, child_name, HalfFeedForward(child))
            elif isinstance(child, nn.Linear):
                setattr(module, child_name, HalfLinear(child))
    decoder = getattr(mixed, "decoder", None)
    if decoder is not None and hasattr(decoder, "kv_dtype"):
        decoder.kv_dtype = HALF
    return mixed


def model_for_precision(model: nn.Module, precision: str) -> nn.Module:
    """The module to trace: the mixed-precision copy for fp16 (precision lives in the graph)."""
    if precision == "fp16":
        return mixed_half(model)
    return model


def fold_weight_transposes(model: onnx.ModelProto) -> int:
    """Replace ``Transpose(initializer)`` feeding MatMuls by a transposed initializer.

    The tied LM head computes ``x @ embedding.T``: the quantiser only quantises MatMuls whose
    weight is an initializer, so without this the largest MatMul of a decoder step (d_model x
    vocabulary) would stay fp32. Returns how many were folded.
    """
    from onnx import numpy_helper

    weights = {init.name: init for init in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for node in list(model.graph.node):
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        if any(c.op_type != "MatMul" for c in consumers.get(node.output[0], [])):
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        value = numpy_helper.to_array(weights[node.input[0]]).transpose(perm)
        model.graph.initializer.append(numpy_helper.from_array(value.copy(), node.output[0]))
        model.graph.node.remove(node)
        folded += 1
    return folded


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights of ``source`` into ``target``.

    Only MatMul is quantised: with the defaults ONNX Runtime rewrites the standard ``Attention``
    op into its contrib ``QAttention``, which it then refuses to load ("Unrecognized attribute:
    is_causal for operator QAttention", onnxruntime 1.31).

    Raises:
        ExportError: when quantisation fails.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger("root").setLevel(logging.ERROR)
    # The exporter's value_info shapes trip the quantiser's own shape inference ("Inferred shape
    # and existing shape differ"); it re-infers them anyway.
    model = onnx.load(str(source))
    del model.graph.value_info[:]
    unfuse_projections(model)  # a weight of its own per projection: one scale each
    fold_weight_transposes(model)
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
