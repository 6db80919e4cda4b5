"""Linear layers that read the same tensor, fused into one matrix multiply.

Attention projects one input three times (queries, keys, values), and a seq2seq encoder's output
is projected into every decoder layer's cross-attention keys and values (2 x layers times). Traced
as written, each projection is its own ``MatMul`` and bias ``Add``: on a GPU two kernel launches
each, small ones at decode batch sizes, where a step's time is mostly launches. ``fuse_projections``
rewrites every group of ``MatMul(x, W_i) + b_i`` sharing ``x`` (weights and biases initializers
of one dtype and input width) into ``Split(MatMul(x, [W_1 .. W_n]) + [b_1 .. b_n])``: three nodes
instead of 2n. Each output column is the same dot product as before, so the graph computes the
same values (ONNX Runtime's kernels may block the wider product differently: within float
rounding, which the export's parity checks bound). In fp16 graphs ONNX Runtime's CPU provider,
which has no fp16 MatMul, now rounds the projections to fp16 at the Split, as the graph says and
a GPU does; it used to carry them in fp32 up to the attention.

Not for int8 exports: ONNX Runtime's dynamic quantisation gives a weight one scale
(``per_channel=False``), and a fused weight would share it among the projections.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.onnx_export import consumers

_PREFIX = "fused_"


@dataclass
class _Projection:
    matmul: onnx.NodeProto
    add: onnx.NodeProto
    weight: np.ndarray
    bias: np.ndarray


def _projection(
    node: onnx.NodeProto,
    weights: dict[str, onnx.TensorProto],
    readers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> _Projection | None:
    """``node`` as ``MatMul(x, W) + b`` with W (K, N) and b (N,) initializers, else None."""
    if node.op_type != "MatMul" or node.input[1] not in weights or node.output[0] in outputs:
        return None
    after = readers.get(node.output[0], [])
    if len(after) != 1 or after[0].op_type != "Add":
        return None
    add = after[0]
    bias_name = add.input[1] if add.input[0] == node.output[0] else add.input[0]
    if bias_name not in weights:
        return None
    weight = numpy_helper.to_array(weights[node.input[1]])
    bias = numpy_helper.to_array(weights[bias_name])
    if weight.ndim != 2 or bias.shape != (weight.shape[1],) or bias.dtype != weight.dtype:
        return None
    return _Projection(node, add, weight, bias)


def fuse_projections(model: onnx.ModelProto) -> int:
    """Fuse the projections of ``model`` that share an input, in place (module docstring).

    Returns:
        How many groups were fused (each of two or more projections).
    """
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    readers = consumers(graph)
    outputs = {value.name for value in graph.output}
    groups: dict[tuple[str, int, object], list[_Projection]] = {}
    for node in graph.node:
        found = _projection(node, weights, readers, outputs)
        if found is not None:
            key = (node.input[0], found.weight.shape[0], found.weight.dtype)
            groups.setdefault(key, []).append(found)
    fused: dict[int, list[onnx.NodeProto]] = {}  # id of a group's first MatMul -> new nodes
    gone: set[int] = set()
    earlier = sum(node.name.startswith(_PREFIX) and node.op_type == "Split" for node in graph.node)
    for (source, _, _), members in groups.items():
        if len(members) < 2:
            continue
        name = f"{_PREFIX}{earlier + len(fused)}"
        fused[id(members[0].matmul)] = _fused_nodes(graph, source, members, name)
        gone |= {id(p.matmul) for p in members} | {id(p.add) for p in members}
    if not fused:
        return 0
    stale = {p.matmul.output[0] for ms in groups.values() for p in ms if id(p.matmul) in gone}
    # The new nodes go where the group's first MatMul was: its input exists there, and every
    # reader of a fused output came after that output's own Add, so after the first MatMul.
    _replace_nodes(graph, fused, gone)
    for value in [v for v in graph.value_info if v.name in stale]:
        graph.value_info.remove(value)
    return len(fused)


def _fused_nodes(
    graph: onnx.GraphProto, source: str, members: list[_Projection], name: str
) -> list[onnx.NodeProto]:
    """The fused weight, bias and widths added to ``graph``'s initializers; the three nodes."""
    weight = np.concatenate([p.weight for p in members], axis=1)
    bias = np.concatenate([p.bias for p in members])
    widths = np.array([p.weight.shape[1] for p in members], dtype=np.int64)
    graph.initializer.extend(
        [
            numpy_helper.from_array(weight, f"{name}_weight"),
            numpy_helper.from_array(bias, f"{name}_bias"),
            numpy_helper.from_array(widths, f"{name}_widths"),
        ]
    )
    return [
        helper.make_node(
            "MatMul", [source, f"{name}_weight"], [f"{name}_product"], name=f"{name}_matmul"
        ),
        helper.make_node(
            "Add", [f"{name}_product", f"{name}_bias"], [f"{name}_sum"], name=f"{name}_add"
        ),
        helper.make_node(
            "Split",
            [f"{name}_sum", f"{name}_widths"],
            [p.add.output[0] for p in members],
            name=f"{name}_split",
            axis=-1,
        ),
    ]


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    read = {name for node in graph.node for name in node.input}
    read |= {value.name for value in graph.output}
    unread = [init for init in graph.initializer if init.name not in read]
    for init in unread:
        graph.initializer.remove(init)


def unfuse_projections(model: onnx.ModelProto) -> int:
    """Undo ``fuse_projections`` in place: each fused group back to one ``MatMul`` and bias
    ``Add`` per projection (int8 quantisation gives each weight its own scale; see the module
    docstring). Returns how many groups were split."""
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    by_output = {out: node for node in graph.node for out in node.output}
    split_back: dict[int, list[onnx.NodeProto]] = {}
    gone: set[int] = set()
    for node in graph.node:
        if node.op_type != "Split" or not node.name.startswith(_PREFIX):
            continue
        name = node.name.removesuffix("_split")
        add, matmul = by_output[f"{name}_sum"], by_output[f"{name}_product"]
        weight = numpy_helper.to_array(weights[f"{name}_weight"])
        bias = numpy_helper.to_array(weights[f"{name}_bias"])
        edges = np.cumsum([0, *numpy_helper.to_array(weights[f"{name}_widths"])])
        nodes = []
        for i, out in enumerate(node.output):
            part = f"{name}_{i}"
            graph.initializer.extend(
                [
                    numpy_helper.from_array(
                        weight[:, edges[i] : edges[i + 1]].copy(), f"{part}_weight"
                    ),
                    numpy_helper.from_array(bias[edges[i] : edges[i + 1]].copy(), f"{part}_bias"),
                ]
            )
            nodes += [
                helper.make_node(
                    "MatMul", [matmul.input[0], f"{part}_weight"], [f"{part}_product"]
                ),
                helper.make_node("Add", [f"{part}_product", f"{part}_bias"], [out]),
            ]
        split_back[id(matmul)] = nodes
        gone |= {id(matmul), id(add), id(node)}
    if split_back:
        _replace_nodes(graph, split_back, gone)
    return len(split_back)


def _replace_nodes(
    graph: onnx.GraphProto, inserted: dict[int, list[onnx.NodeProto]], gone: set[int]
) -> None:
    """Rebuild ``graph``'s nodes in one pass (``graph.node`` copies what it is given, so the
    nodes are addressed by ``id`` before it changes): ``inserted[id(n)]`` goes before node n,
    the nodes in ``gone`` are dropped, and then the initializers nothing reads."""
    rebuilt: list[onnx.NodeProto] = []
    for node in graph.node:
        rebuilt += inserted.get(id(node), [])
        if id(node) not in gone:
            rebuilt.append(node)
    del graph.node[:]
    graph.node.extend(rebuilt)
    _drop_unread_initializers(graph)
