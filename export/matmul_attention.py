"""The in-place decoder's attention as two MatMuls around a masked Softmax, for the CPU.

A decode step's attention has one query per row and head. ONNX Runtime's CPU ``Attention`` op
computes its scores as query × keysᵀ, a product with a one-row left operand and a transposed
right one, which MLAS runs as dot products over every cached key; written as keys × queryᵀ (the
keys as a plain [positions × head_dim] left operand, the query as a one-column right one) the
same scores come from MLAS's ordinary kernel, which streams the keys once. Measured on a 2-core
AMD EPYC Zen 4 (2026-11-28; README, Export, ``--decode-attention``; docs/measurements.md): 25-37%
less time per attention at batches 8-32 with the caches in memory, the int8 decoder step alone
5-10% faster there, 8-19% more new tokens/s at batch 32 in the engine benchmark, batch 1 even.

The rewrite keeps the cache and its layout ([batch, heads, positions, head_dim], written by
``TensorScatter``): only each ``Attention`` node changes, into

    scores = Reshape(keys × Reshape(query · scale, [b, h, d, 1]), [b, h, 1, w]) + mask
    output = Softmax(scores) × values

where ``mask`` is 0 before a row's length and -1e30 after it (the op's ``nonpad_kv_seqlen``),
made once per lengths input (the self-attentions share one, the cross-attentions another).
Standard ONNX ops only. On a GPU the fused op's kernels are the faster ones, so the rewrite is
for exports served on the CPU (``--decode-attention``; int8 exports take it by default).
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto, helper

from contract.graphs import kv_names, present_name
from export.errors import ExportError

PREFIX = "mm_attn_"  # the rewrite's constants and tensors


def attention_constants(scale: float, prefix: str = PREFIX) -> list[onnx.TensorProto]:
    """The constants ``length_mask`` and ``matmul_decode_attention`` use, under ``prefix``."""

    def int64(name: str, values: list[int]) -> onnx.TensorProto:
        return helper.make_tensor(prefix + name, TensorProto.INT64, [len(values)], values)

    return [
        int64("axis_0", [0]),
        int64("axis_1", [1]),
        helper.make_tensor(prefix + "zero", TensorProto.INT64, [], [0]),
        helper.make_tensor(prefix + "one", TensorProto.INT64, [], [1]),
        helper.make_tensor(prefix + "scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor(prefix + "no_bias", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor(prefix + "masked", TensorProto.FLOAT, [], [-1e30]),
        int64("as_column", [0, 0, -1, 1]),
        int64("as_row", [0, 0, 1, -1]),
    ]


def length_mask(cache: str, lengths: str, out: str, axis: int, prefix: str) -> list[onnx.NodeProto]:
    """Nodes making ``out`` [batch, 1, 1, width]: 0 where position < lengths[row], else -1e30
    (``Attention``'s ``nonpad_kv_seqlen``), the width being ``cache``'s ``axis``. Uses the
    constants ``axis_0``, ``axis_1``, ``zero``, ``one``, ``no_bias`` and ``masked`` under
    ``prefix``."""
    c, node = prefix, helper.make_node
    return [
        node("Shape", [cache], [f"{out}_shape"], start=axis, end=axis + 1),
        node("Squeeze", [f"{out}_shape", c + "axis_0"], [f"{out}_width"]),
        node("Range", [c + "zero", f"{out}_width", c + "one"], [f"{out}_positions"]),
        node("Unsqueeze", [lengths, c + "axis_1"], [f"{out}_lengths"]),
        node("Less", [f"{out}_positions", f"{out}_lengths"], [f"{out}_valid"]),
        node("Where", [f"{out}_valid", c + "no_bias", c + "masked"], [f"{out}_2d"]),
        node("Unsqueeze", [f"{out}_2d", c + "axis_1"], [f"{out}_3d"]),
        node("Unsqueeze", [f"{out}_3d", c + "axis_1"], [out]),
    ]


def matmul_decode_attention(
    query: str, key: str, value: str, mask: str, out: str, cast_to: int | None = None
) -> list[onnx.NodeProto]:
    """One decode attention: ``query`` [b, h, 1, d], ``key`` / ``value`` [b, h, w, d], additive
    ``mask`` [b, 1, 1, w] (float32) -> ``out`` [b, h, 1, d]. ``cast_to``: the graph's float type
    where it is not float32 (the mask is cast to it)."""
    node = helper.make_node
    c = PREFIX
    nodes = []
    if cast_to is not None:
        nodes.append(node("Cast", [mask], [f"{out}_mask"], to=cast_to))
        mask = f"{out}_mask"
        nodes.append(node("CastLike", [c + "scale", query], [f"{out}_scale"]))
        scale = f"{out}_scale"
    else:
        scale = c + "scale"
    return [
        *nodes,
        node("Mul", [query, scale], [f"{out}_q"]),
        node("Reshape", [f"{out}_q", c + "as_column"], [f"{out}_qc"]),
        node("MatMul", [key, f"{out}_qc"], [f"{out}_sc"]),
        node("Reshape", [f"{out}_sc", c + "as_row"], [f"{out}_s"]),
        node("Add", [f"{out}_s", mask], [f"{out}_m"]),
        node("Softmax", [f"{out}_m"], [f"{out}_w"], axis=-1),
        node("MatMul", [f"{out}_w", value], [out]),
    ]


def _attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _check(node: onnx.NodeProto, caches: set[str], scale: float) -> None:
    inputs = list(node.input) + [""] * (7 - len(node.input))
    if any(inputs[3:6]) or not inputs[6] or _attribute(node, "is_causal", 0):
        raise ExportError(f"Attention node {node.name!r} is not a decode step over the cache")
    if set(inputs[1:3]) - caches:
        raise ExportError(f"Attention node {node.name!r} does not read the KV cache")
    if _attribute(node, "softcap", 0.0) or _attribute(node, "scale", scale) != scale:
        raise ExportError(f"Attention node {node.name!r} has a scale or softcap of its own")
    if _attribute(node, "q_num_heads", 0) or _attribute(node, "kv_num_heads", 0):
        raise ExportError(f"Attention node {node.name!r} takes 3D inputs; expected 4D")


def matmul_attention(model: onnx.ModelProto, num_layers: int, head_dim: int) -> onnx.ModelProto:
    """The in-place decoder ``model`` with its attention as MatMul / Softmax / MatMul (a new
    model; inputs, outputs and the cache layout unchanged).

    Raises:
        ExportError: the graph is not the in-place decoder this rewrite knows (``2 *
            num_layers`` ``Attention`` nodes over the cache with ``nonpad_kv_seqlen``).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    caches = set(kv_names("cross", num_layers))
    caches |= {present_name(n) for n in kv_names("past", num_layers)}
    attention = [n for n in graph.node if n.op_type == "Attention"]
    if len(attention) != 2 * num_layers:
        raise ExportError(
            f"the matmul decode attention needs {2 * num_layers} Attention nodes (in-place "
            f"decoder, opset 24); found {len(attention)}"
        )
    scale = 1 / math.sqrt(head_dim)
    for node in attention:
        _check(node, caches, scale)
    float_type = {v.name: v.type.tensor_type.elem_type for v in graph.input}
    cache_type = float_type[kv_names("cross", num_layers)[0]]
    cast_to = None if cache_type == TensorProto.FLOAT else cache_type
    graph.initializer.extend(attention_constants(scale))
    nodes: list[onnx.NodeProto] = []
    masks: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "Attention":
            nodes.append(node)
            continue
        query, key, value, lengths = node.input[0], node.input[1], node.input[2], node.input[6]
        if lengths not in masks:
            masks[lengths] = f"{PREFIX}mask_{len(masks)}"
            nodes += length_mask(key, lengths, masks[lengths], 2, PREFIX)
        nodes += matmul_decode_attention(query, key, value, masks[lengths], node.output[0], cast_to)
    del graph.node[:]
    graph.node.extend(nodes)
    # the value_info stays (ONNX Runtime's fusions, e.g. SkipLayerNormalization, need the
    # shapes); the new tensors' are inferred
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model
