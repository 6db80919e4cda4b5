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
from export.onnx_export import consumers
from models.attention import MultiHeadAttention
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
    """A Linear with fp16 weights whose matmul runs in fp16; input and output keep their dtype.

    With ``output_bias`` the bias stays in the output's dtype and is added after the product's
    Cast: for layers whose output joins the fp32 residual stream (attention outputs, fc2), where
    ONNX Runtime then folds that Add with the residual Add and the LayerNorm after it into one
    ``SkipLayerNormalization``, as it does in fp32 graphs (an fp16 bias Add before the Cast
    stays a kernel of its own). The bias is also added in fp32, not fp16.
    """

    def __init__(self, linear: nn.Linear, output_bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().to(HALF), requires_grad=False)
        bias, dtype = linear.bias, linear.weight.dtype if output_bias else HALF
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), False)
        self.output_bias = output_bias

    def forward(self, x: Tensor) -> Tensor:
        return self.project(x.to(HALF), x.dtype)

    def project(self, half: Tensor, dtype: torch.dtype) -> Tensor:
        """The layer on fp16 ``half``, its output in ``dtype``."""
        if not self.output_bias or self.bias is None:
            return F.linear(half, self.weight, self.bias).to(dtype)
        return F.linear(half, self.weight).to(dtype) + self.bias.to(dtype)


class HalfFeedForward(nn.Module):
    """A feed-forward block (``models.layers.FeedForward``) run in fp16 from fc1 to fc2, the
    activation included; input and output keep their dtype. Its hidden values are fp16 either
    way (fc1's product), so an fp32 activation only adds a Cast each side: two kernels per layer
    and decode step on a GPU."""

    def __init__(self, ffn: FeedForward) -> None:
        super().__init__()
        self.fc1, self.fc2 = HalfLinear(ffn.fc1), HalfLinear(ffn.fc2, output_bias=True)
        self.act: Callable[[Tensor], Tensor] = ffn.act

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2.project(self.act(self.fc1.project(x.to(HALF), HALF)), x.dtype)


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
                # an attention's output joins the residual stream
                joins = isinstance(module, MultiHeadAttention) and child_name == "out_proj"
                setattr(module, child_name, HalfLinear(child, output_bias=joins))
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
    readers = consumers(model.graph)
    folded = 0
    for node in list(model.graph.node):
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        if any(c.op_type != "MatMul" for c in readers.get(node.output[0], [])):
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
