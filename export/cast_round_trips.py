"""fp16 graphs without the fp16 -> fp32 -> fp16 round trips the mixed-precision trace leaves.

The fp16 export keeps the residual stream in fp32 (``precision.mixed_half``), so every fp16
linear layer ends in a Cast to fp32. Where its output only changes layout (the heads' split and
merge: Reshape, Transpose) before a Cast back to fp16 (the KV cache, the attention's inputs and
outputs), the pair is exact and useless: fp16 -> fp32 is lossless and a layout op moves values
without computing. ``drop_cast_round_trips`` removes both Casts and lets the layout ops carry the
fp16 tensor: the graph computes bit for bit the same, with fewer nodes, which on a GPU are fewer
kernel launches per decode step.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from export.onnx_export import consumers

LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every tensor's element type, as ONNX shape inference gives it."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    types |= {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
    types |= {init.name: init.data_type for init in graph.initializer}
    return types


def drop_cast_round_trips(model: onnx.ModelProto) -> int:
    """Remove ``Cast(fp16 -> fp32)``, layout ops, ``Cast(fp32 -> fp16)`` chains in place (see the
    module docstring); only chains whose fp32 values nothing else reads. Returns how many pairs
    of Casts were removed."""
    types = _element_types(model)
    graph = model.graph
    readers_of = consumers(graph)
    outputs = {value.name for value in graph.output}
    gone: list[onnx.NodeProto] = []
    retyped: set[str] = set()
    for up in graph.node:
        if _cast_to(up) != TensorProto.FLOAT or types.get(up.input[0]) != TensorProto.FLOAT16:
            continue
        chain, tensor = [], up.output[0]
        while tensor not in outputs and len(readers_of.get(tensor, [])) == 1:
            nxt = readers_of[tensor][0]
            if nxt.op_type not in LAYOUT_OPS or nxt.input[0] != tensor:
                break
            chain.append(nxt)
            tensor = nxt.output[0]
        readers = readers_of.get(tensor, [])
        if tensor in outputs or len(readers) != 1 or _cast_to(readers[0]) != TensorProto.FLOAT16:
            continue
        down = readers[0]
        if not chain:  # Cast, Cast: the second one's readers read the fp16 source itself
            if down.output[0] in outputs:
                continue
            for reader in readers_of.get(down.output[0], []):
                reader.input[:] = [up.input[0] if n == down.output[0] else n for n in reader.input]
        else:
            chain[0].input[0] = up.input[0]
            retyped |= {up.output[0], *(node.output[0] for node in chain)}
            chain[-1].output[0] = down.output[0]  # its only reader was ``down``
        gone += [up, down]
    for node in gone:
        graph.node.remove(node)
    stale = [v for v in graph.value_info if v.name in retyped]
    for value in stale:  # fp32 before, fp16 now: let the runtime infer them again
        graph.value_info.remove(value)
    return len(gone) // 2
