"""An int8 KV cache for the in-place decoder: a rewrite of its exported graph.

Decode-step attention reads every cached key and value once per step, and on a CPU that read is
memory-bound. Kept in int8 (one fp32 scale per cached vector) the cache is 27% of the bytes.
The rewrite, on the in-place decoder after int8 weight quantisation:

- every cache input / output becomes int8, with a ``*_scale`` tensor beside it; keys lie
  transposed (``contract.graphs`` has the layout);
- each ``TensorScatter`` quantises the new key / value (``quantize_vectors``, the formula
  ``cache_write`` uses) and writes it and its scale;
- each ``Attention`` becomes two integer GEMMs: the query quantised per row and head (int8,
  symmetric) times the int8 keys gives the scores (times both scales), a masked softmax weights
  the value scales, and those weights quantised per row and head (uint8 in 0..127) times the
  int8 values give the output. No operand is a full-range uint8: ONNX Runtime's uint8 x int8
  kernel on AVX2 CPUs (no VNNI) saturates on full-range inputs, where int8 x int8 and 7-bit
  uint8 are exact (``quantize_vectors``).

Standard ONNX ops only, no custom kernels; measured on ONNX Runtime's CPU provider (README, "int8
KV cache, measured": faster from batch 32 on, slower below, where the extra nodes cost more than
the bytes save).
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto, helper

from contract.graphs import kv_names, present_name, scale_name, width_axis
from export.cache_graphs import HELPER_OPSET, quantize_constants, quantize_vectors
from export.errors import ExportError
from export.matmul_attention import attention_constants, length_mask

_PREFIX = "kv8_"


def _constants(scale: float) -> list[onnx.TensorProto]:
    return [*quantize_constants(_PREFIX), *attention_constants(scale, _PREFIX)]


def _retype(value: onnx.ValueInfoProto, head_dim: int) -> onnx.ValueInfoProto:
    """Make cache tensor ``value`` int8 in its layout; return its new fp32 scale tensor."""
    dims = value.type.tensor_type.shape.dim
    width = onnx.TensorShapeProto.Dimension()
    width.CopyFrom(dims[2])
    scale = onnx.ValueInfoProto()
    scale.CopyFrom(value)
    scale.name = scale_name(value.name)
    scale_dims = scale.type.tensor_type.shape.dim
    if width_axis(value.name, "int8") == 3:  # keys: [batch, heads, head_dim, width]
        dims[2].Clear()
        dims[2].dim_value = head_dim
        dims[3].CopyFrom(width)
        scale_dims[2].Clear()
        scale_dims[2].dim_value = 1
        scale_dims[3].CopyFrom(width)
    else:  # values: [batch, heads, width, head_dim], scales [.., width, 1]
        scale_dims[3].Clear()
        scale_dims[3].dim_value = 1
    value.type.tensor_type.elem_type = TensorProto.INT8
    return scale


def decode_attention(query: str, key: str, value: str, mask: str, out: str) -> list[onnx.NodeProto]:
    """Decode attention (one query position) over an int8 cache, into ``out`` [b, h, 1, d].

    The query is quantised per row and head, symmetric int8; the attention weights, which carry
    the value scales and so differ in range from row to row, per row and head into 0..127.
    """
    c, node = _PREFIX, helper.make_node
    query_i8, weights_u8 = f"{out}_qi", f"{out}_w_u8"
    return [
        node("Mul", [query, c + "scale"], [f"{out}_q"]),
        *quantize_vectors(f"{out}_q", query_i8, c, kind="int8"),
        node("MatMulInteger", [query_i8, key], [f"{out}_scores_i"]),
        node("Cast", [f"{out}_scores_i"], [f"{out}_scores_f"], to=TensorProto.FLOAT),
        node("Mul", [scale_name(key), scale_name(query_i8)], [f"{out}_scores_scale"]),
        node("Mul", [f"{out}_scores_f", f"{out}_scores_scale"], [f"{out}_scores"]),
        node("Add", [f"{out}_scores", mask], [f"{out}_masked"]),
        node("Softmax", [f"{out}_masked"], [f"{out}_weights"], axis=-1),
        node("Reshape", [scale_name(value), c + "as_row"], [f"{out}_value_scale"]),
        node("Mul", [f"{out}_weights", f"{out}_value_scale"], [f"{out}_w"]),
        *quantize_vectors(f"{out}_w", weights_u8, c, kind="uint8"),
        node("MatMulInteger", [weights_u8, value], [f"{out}_out_i"]),
        node("Cast", [f"{out}_out_i"], [f"{out}_out_f"], to=TensorProto.FLOAT),
        node("Mul", [f"{out}_out_f", scale_name(weights_u8)], [out]),
    ]


def decode_attention_model(heads: int, head_dim: int) -> onnx.ModelProto:
    """``decode_attention`` alone, as a model: ``query`` [b, h, 1, d] float, ``key`` int8
    [b, h, d, w] and its scale [b, h, 1, w], ``value`` int8 [b, h, w, d] and its scale
    [b, h, w, 1], an additive ``mask`` [b, 1, 1, w]; ``output`` [b, h, 1, d]. For tests."""

    def tensor(name: str, dtype: int, shape: list) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    float_ = TensorProto.FLOAT
    inputs = [
        tensor("query", float_, ["b", heads, 1, head_dim]),
        tensor("key", TensorProto.INT8, ["b", heads, head_dim, "w"]),
        tensor(scale_name("key"), float_, ["b", heads, 1, "w"]),
        tensor("value", TensorProto.INT8, ["b", heads, "w", head_dim]),
        tensor(scale_name("value"), float_, ["b", heads, "w", 1]),
        tensor("mask", float_, ["b", 1, 1, "w"]),
    ]
    graph = helper.make_graph(
        decode_attention("query", "key", "value", "mask", "output"),
        "decode_attention",
        inputs,
        [tensor("output", float_, ["b", heads, 1, head_dim])],
        initializer=_constants(1 / math.sqrt(head_dim)),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", HELPER_OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def int8_kv_cache(model: onnx.ModelProto, num_layers: int, head_dim: int) -> onnx.ModelProto:
    """The in-place decoder ``model`` rewritten for an int8 KV cache (a new model).

    Raises:
        ExportError: the graph is not the in-place decoder this rewrite knows (its caches are
            not written by ``TensorScatter`` and read by ``Attention`` with ``nonpad_kv_seqlen``).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    caches = set(kv_names("past", num_layers) + kv_names("cross", num_layers))
    presents = {present_name(n) for n in kv_names("past", num_layers)}
    scatters = sum(n.op_type == "TensorScatter" for n in graph.node)
    attention = [n for n in graph.node if n.op_type == "Attention"]
    if scatters != 2 * num_layers or len(attention) != 2 * num_layers:
        raise ExportError(
            f"the int8 KV cache needs {2 * num_layers} TensorScatter and Attention nodes "
            f"(in-place decoder, opset 24); found {scatters} and {len(attention)}"
        )
    scale = 1 / math.sqrt(head_dim)
    for node in attention:
        inputs = list(node.input) + [""] * (7 - len(node.input))
        if any(inputs[3:6]) or not inputs[6] or _attribute(node, "is_causal", 0):
            raise ExportError(f"Attention node {node.name!r} is not a decode step over the cache")
        if set(inputs[1:3]) - caches - presents:
            raise ExportError(f"Attention node {node.name!r} does not read the KV cache")
        if _attribute(node, "softcap", 0.0) or _attribute(node, "scale", scale) != scale:
            raise ExportError(f"Attention node {node.name!r} has a scale or softcap of its own")

    for group in (graph.input, graph.output):
        for value in list(group):
            if value.name in caches or value.name in presents:
                group.append(_retype(value, head_dim))
    graph.initializer.extend(_constants(scale))
    nodes: list[onnx.NodeProto] = []
    masks: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "TensorScatter":
            past, update, lengths = node.input
            out = node.output[0]
            quantized = f"{out}_new"
            nodes += quantize_vectors(update, quantized, _PREFIX)
            axis = width_axis(past, "int8")
            values = quantized
            if axis == 3:  # a key, stored transposed: [b, h, 1, d] -> [b, h, d, 1] (one position)
                values = f"{quantized}_t"
                nodes.append(
                    helper.make_node("Reshape", [quantized, _PREFIX + "as_column"], [values])
                )
            # the scales [b, h, 1, 1] go in as they are, along the same axis
            for cache, new, result in (
                (past, values, out),
                (scale_name(past), scale_name(quantized), scale_name(out)),
            ):
                nodes.append(
                    helper.make_node(
                        "TensorScatter", [cache, new, lengths], [result], axis=axis, mode="linear"
                    )
                )
        elif node.op_type == "Attention":
            query, key, value, lengths = node.input[0], node.input[1], node.input[2], node.input[6]
            if lengths not in masks:
                masks[lengths] = f"{_PREFIX}mask_{len(masks)}"
                nodes += length_mask(key, lengths, masks[lengths], 3, _PREFIX)
            nodes += decode_attention(query, key, value, masks[lengths], node.output[0])
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # shapes and types of the rewritten tensors changed: infer them
    # again (ONNX Runtime's fusions, e.g. SkipLayerNormalization, check the shapes they know)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model
