"""The three small helper graphs of the in-place decoder's cache, built with onnx.helper.

The first two update caches in place when the server binds each ``X_out`` output to the buffer
of input ``X`` (``contract.graphs`` documents them):

- ``cache_copy.onnx``: beam search continues row ``source_rows[j]`` in row ``rows[j]``, so every
  self-attention cache copies those rows (Gather, then ScatterND);
- ``cache_write.onnx``: a joining request's cross-attention keys / values, computed once by the
  encoder, are written into its rows, zero-padded to the buffer's source capacity (Pad, then
  ScatterND);
- ``cache_resize.onnx``: every cache re-laid out at another width along the sequence axis (one
  Pad, negative pads cutting), run when the longest row needs a wider (or allows a narrower)
  cache.

With an int8 cache (``kv_dtype="int8"``, ``contract.graphs`` has the layout) every buffer has a
scale buffer beside it, the keys lie transposed, and ``cache_write`` quantises the encoder's float
keys / values as the decoder quantises its own (``quantize_vectors``).

They run on the decoder's own device, so the cache never leaves it.

Every ``ScatterND`` takes its indices from one ``If`` on the ``VECTOR_SCATTER`` input
(``_scatter_rows``): one vector per index on a GPU, where ONNX Runtime's CUDA kernel gives every
index one thread that copies the index's slice alone (rows as slices, 32k values for a row of
Marian-base's cross keys, took 0.6 ms per buffer for one row and 1.7 ms for 64 on an H100,
2026-11-27, 12 buffers per join), and one row per index on the CPU, whose kernel copies a slice
as one memcpy but pays per index.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from contract.graphs import (
    CACHE_COPY,
    CACHE_COPY_FILE,
    CACHE_RESIZE,
    CACHE_RESIZE_FILE,
    CACHE_WRITE,
    CACHE_WRITE_FILE,
    GREEDY_PICK_FILE,
    ROWS,
    SOURCE_ROWS,
    VECTOR_SCATTER,
    WIDTH,
    cache_buffer_names,
    is_scale,
    kv_names,
    resize_buffer_names,
    scale_name,
    update_name,
    vector_size,
    width_axis,
    written_name,
)
from export.greedy_pick import greedy_pick_model

HELPER_OPSET = 18
# what the manifest says of the helper graphs' scatters (exports before 2026-11-27 lack it)
CACHE_SCATTER = "one vector per index where vector_scatter, else one row"
_ONNX_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
INT8_EPSILON = 1e-8  # the smallest absolute maximum a quantised vector is scaled by


def _buffer(
    name: str, kv_dtype: str, heads: int, head_dim: int, length: str
) -> onnx.ValueInfoProto:
    """The value info of cache buffer ``name`` (or of its ``written_name``) with ``length``
    positions, laid out as ``kv_dtype`` lays it out."""
    like = name.removesuffix(written_name(""))
    if kv_dtype != "int8":
        shape: list[str | int] = ["rows_total", heads, length, head_dim]
        return helper.make_tensor_value_info(name, _ONNX_TYPES[kv_dtype], shape)
    inner = vector_size(like, head_dim)
    elem = TensorProto.FLOAT if is_scale(like) else TensorProto.INT8
    if width_axis(like, kv_dtype) == 3:
        return helper.make_tensor_value_info(name, elem, ["rows_total", heads, inner, length])
    return helper.make_tensor_value_info(name, elem, ["rows_total", heads, length, inner])


def _rows_input(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, ["n"])


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The checked model of ``graph``, without the constants no node reads (ONNX Runtime logs a
    warning for each one at every session's creation)."""
    used = _node_inputs(graph)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", HELPER_OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _node_inputs(graph: onnx.GraphProto) -> set[str]:
    """Every name the nodes of ``graph`` read, those of its subgraphs (an ``If``'s) included."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= _node_inputs(attribute.g)
    return names


def _axis_constants() -> list[onnx.TensorProto]:
    return [
        helper.make_tensor("axis_2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("axis_3", TensorProto.INT64, [1], [3]),
        helper.make_tensor("six_zeros", TensorProto.INT64, [6], [0] * 6),
        helper.make_tensor("seven_zeros", TensorProto.INT64, [7], [0] * 7),
        helper.make_tensor("one_zero", TensorProto.INT64, [1], [0]),
    ]


def quantize_constants(prefix: str = "") -> list[onnx.TensorProto]:
    """The constants ``quantize_vectors`` uses (``prefix`` keeps their names apart)."""
    return [
        helper.make_tensor(f"{prefix}vector_axis", TensorProto.INT64, [1], [3]),
        helper.make_tensor(f"{prefix}epsilon", TensorProto.FLOAT, [], [INT8_EPSILON]),
        helper.make_tensor(f"{prefix}inverse_127", TensorProto.FLOAT, [], [1 / 127]),
    ]


def quantize_vectors(
    x: str, out: str, prefix: str = "", kind: str = "int8"
) -> list[onnx.NodeProto]:
    """Nodes quantising ``x`` [..., n] with one fp32 scale per vector, ``out_scale`` [..., 1]:

    - ``int8``: symmetric, ``scale = max(|x|) / 127``, ``out`` int8;
    - ``uint8``: ``x`` >= 0 (attention weights), ``scale = max(x) / 127``, ``out`` uint8 in
      0..127. Seven bits, not eight: on x86 CPUs without VNNI (AVX2) ONNX Runtime multiplies
      uint8 by int8 with ``VPMADDUBSW``, which sums each pair of products in int16 and saturates
      (255 * 127 * 2 > 32767); with values up to 127 a pair stays exact.

    The largest value is at least ``INT8_EPSILON``, so an all-zero vector stays zero.
    """
    node = helper.make_node
    signed = kind != "uint8"
    nodes = [node("Abs", [x], [f"{out}_abs"])] if signed else []
    nodes += [
        node("ReduceMax", [f"{out}_abs" if signed else x, f"{prefix}vector_axis"], [f"{out}_max"]),
        node("Max", [f"{out}_max", f"{prefix}epsilon"], [f"{out}_range"]),
        node(
            "Mul",
            [f"{out}_range", prefix + "inverse_127"],
            [scale_name(out)],
        ),
        node("Div", [x, scale_name(out)], [f"{out}_scaled"]),
        node("Round", [f"{out}_scaled"], [f"{out}_rounded"]),
    ]
    to = TensorProto.INT8 if signed else TensorProto.UINT8
    return [*nodes, node("Cast", [f"{out}_rounded"], [out], to=to)]


def cache_copy_model(num_layers: int, heads: int, head_dim: int, kv_dtype: str) -> onnx.ModelProto:
    """``cache_copy``: ``rows`` of every past key / value become copies of ``source_rows``."""
    names = cache_buffer_names("past", num_layers, kv_dtype)
    nodes = [helper.make_node("Gather", [n, SOURCE_ROWS], [f"{n}_rows"], axis=0) for n in names]
    nodes += _scatter_rows([(n, f"{n}_rows") for n in names], kv_dtype)
    graph = helper.make_graph(
        nodes,
        CACHE_COPY,
        [_rows_input(ROWS), _rows_input(SOURCE_ROWS), _vector_scatter_input()]
        + [_buffer(n, kv_dtype, heads, head_dim, "capacity") for n in names],
        [_buffer(written_name(n), kv_dtype, heads, head_dim, "capacity") for n in names],
        initializer=_vector_index_constants(),
    )
    return _model(graph)


def cache_write_model(num_layers: int, heads: int, head_dim: int, kv_dtype: str) -> onnx.ModelProto:
    """``cache_write``: new cross keys / values written into ``rows``, padded along the source
    (quantised first, keys transposed, for an int8 cache)."""
    int8 = kv_dtype == "int8"
    update_type = TensorProto.FLOAT if int8 else _ONNX_TYPES[kv_dtype]
    nodes: list[onnx.NodeProto] = []
    writes: list[tuple[str, str]] = []
    inputs, outputs = [_rows_input(ROWS), _vector_scatter_input()], []
    for name in kv_names("cross", num_layers):
        new = update_name(name)
        inputs.append(
            helper.make_tensor_value_info(new, update_type, ["n", heads, "source_length", head_dim])
        )
        written = {name: new}
        if int8:
            nodes += quantize_vectors(new, f"{new}_int8")
            written = {name: f"{new}_int8", scale_name(name): scale_name(f"{new}_int8")}
            if width_axis(name, kv_dtype) == 3:  # keys lie transposed
                for buffer, value in list(written.items()):
                    nodes.append(
                        helper.make_node("Transpose", [value], [f"{value}_t"], perm=[0, 1, 3, 2])
                    )
                    written[buffer] = f"{value}_t"
        for buffer, value in written.items():
            inputs.append(_buffer(buffer, kv_dtype, heads, head_dim, "source_capacity"))
            axis = width_axis(buffer, kv_dtype)
            nodes += _pad_to_buffer(buffer, value, axis)
            writes.append((buffer, f"{value}_padded"))
            outputs.append(
                _buffer(written_name(buffer), kv_dtype, heads, head_dim, "source_capacity")
            )
    nodes += _scatter_rows(writes, kv_dtype)
    graph = helper.make_graph(
        nodes,
        CACHE_WRITE,
        inputs,
        outputs,
        initializer=_axis_constants()
        + _vector_index_constants()
        + (quantize_constants() if int8 else []),
    )
    return _model(graph)


def cache_resize_model(
    num_layers: int, heads: int, head_dim: int, kv_dtype: str
) -> onnx.ModelProto:
    """``cache_resize``: every buffer cut or zero-padded to ``width`` along its positions' axis.

    One ``Pad`` per buffer whose end pad on that axis is ``width`` minus the buffer's width:
    positive pads with zeros, negative cuts (ONNX ``Pad`` crops on negative pads), so a re-layout
    copies each buffer once.
    """
    layout = cache_buffer_names("past", num_layers, kv_dtype)
    names = resize_buffer_names(len(layout))
    nodes = []
    inputs = [helper.make_tensor_value_info(WIDTH, TensorProto.INT64, [1])]
    outputs = []
    for name, like in zip(names, layout, strict=True):
        axis = width_axis(like, kv_dtype)
        nodes += [
            helper.make_node("Shape", [name], [f"{name}_shape"]),
            helper.make_node("Gather", [f"{name}_shape", f"axis_{axis}"], [f"{name}_width"]),
            helper.make_node("Sub", [WIDTH, f"{name}_width"], [f"{name}_change"]),
            helper.make_node("Concat", _end_pad(f"{name}_change", axis), [f"{name}_pads"], axis=0),
            helper.make_node("Pad", [name, f"{name}_pads"], [written_name(name)]),
        ]
        buffer = _buffer(like, kv_dtype, heads, head_dim, "width_in")
        buffer.name = name
        inputs.append(buffer)
        out = _buffer(like, kv_dtype, heads, head_dim, "width_out")
        out.name = written_name(name)
        outputs.append(out)
    graph = helper.make_graph(nodes, CACHE_RESIZE, inputs, outputs, initializer=_axis_constants())
    return _model(graph)


def _scatter_rows(writes: list[tuple[str, str]], kv_dtype: str) -> list[onnx.NodeProto]:
    """Each ``(buffer, value)``: ``buffer``'s ``ROWS`` overwritten by ``value`` [n, a, b, c].

    The indices come from one ``If`` on ``VECTOR_SCATTER``: (``ROWS``[i], j, k) per vector
    [n, a, b, 3], or ``ROWS``[i] per row [n, 1]; once per layout (buffers of one layout have
    one shape), from the first value of that layout. The ``If`` follows the nodes that make the
    values and precedes every scatter.
    """

    def layout(buffer: str) -> tuple[int, bool]:
        return width_axis(buffer, kv_dtype), is_scale(buffer)

    layouts: dict[tuple[int, bool], str] = {}  # layout -> its first value
    for buffer, value in writes:
        layouts.setdefault(layout(buffer), value)
    names = {key: f"indices_{key[0]}{'_scale' * key[1]}" for key in layouts}
    by_vector = [
        n for key, value in layouts.items() for n in _vector_indices(value, names[key] + "_v")
    ]
    by_row = [helper.make_node("Unsqueeze", [ROWS, "one_1d"], ["indices_by_row"])] + [
        helper.make_node("Identity", ["indices_by_row"], [name + "_r"]) for name in names.values()
    ]
    branches = {
        key: helper.make_graph(
            body,
            f"indices_{key}",
            [],
            [
                helper.make_tensor_value_info(n + suffix, TensorProto.INT64, None)
                for n in names.values()
            ],
        )
        for key, body, suffix in (("then_branch", by_vector, "_v"), ("else_branch", by_row, "_r"))
    }
    pick = helper.make_node("If", [VECTOR_SCATTER], list(names.values()), **branches)
    scatters = [
        helper.make_node(
            "ScatterND",
            [buffer, names[layout(buffer)], value],
            [written_name(buffer)],
        )
        for buffer, value in writes
    ]
    return [pick, *scatters]


def _vector_scatter_input() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(VECTOR_SCATTER, TensorProto.BOOL, [1])


def _vector_indices(like: str, out: str) -> list[onnx.NodeProto]:
    """Nodes making ``out`` [n, a, b, 3] = (``ROWS``[i], j, k): ScatterND indices that write a
    value shaped like ``like`` [n, a, b, c] into rows ``ROWS`` one vector of c at a time."""
    node = helper.make_node
    return [
        node("Shape", [like], [f"{out}_like"]),
        node("Slice", [f"{out}_like", "zero_1d", "three_1d"], [f"{out}_nab"]),
        node("Concat", [f"{out}_nab", "one_1d"], [f"{out}_shape"], axis=0),
        node("Gather", [f"{out}_like", "one"], [f"{out}_a"]),
        node("Gather", [f"{out}_like", "two"], [f"{out}_b"]),
        node("Range", ["zero", f"{out}_a", "one"], [f"{out}_js"]),
        node("Range", ["zero", f"{out}_b", "one"], [f"{out}_ks"]),
        node("Reshape", [ROWS, "rows_shape"], [f"{out}_i4"]),
        node("Reshape", [f"{out}_js", "heads_shape"], [f"{out}_j4"]),
        node("Reshape", [f"{out}_ks", "positions_shape"], [f"{out}_k4"]),
        *[node("Expand", [f"{out}_{x}4", f"{out}_shape"], [f"{out}_{x}"]) for x in "ijk"],
        node("Concat", [f"{out}_i", f"{out}_j", f"{out}_k"], [out], axis=3),
    ]


def _vector_index_constants() -> list[onnx.TensorProto]:
    int64 = TensorProto.INT64
    return [
        helper.make_tensor("zero", int64, [], [0]),
        helper.make_tensor("one", int64, [], [1]),
        helper.make_tensor("two", int64, [], [2]),
        helper.make_tensor("zero_1d", int64, [1], [0]),
        helper.make_tensor("one_1d", int64, [1], [1]),
        helper.make_tensor("three_1d", int64, [1], [3]),
        helper.make_tensor("rows_shape", int64, [4], [-1, 1, 1, 1]),
        helper.make_tensor("heads_shape", int64, [4], [1, -1, 1, 1]),
        helper.make_tensor("positions_shape", int64, [4], [1, 1, -1, 1]),
    ]


def _end_pad(change: str, axis: int) -> list[str]:
    """Concat inputs of a 4-D ``Pad``'s pads (begins of axes 0-3, then ends) where only the end
    of ``axis`` (2 or 3) changes, by ``change``."""
    return ["six_zeros", change, "one_zero"] if axis == 2 else ["seven_zeros", change]


def _pad_to_buffer(buffer: str, new: str, axis: int) -> list[onnx.NodeProto]:
    """Nodes padding ``new`` with zeros at the end of ``axis`` to the length of ``buffer``'s."""
    return [
        helper.make_node("Shape", [buffer], [f"{new}_buffer_shape"]),
        helper.make_node("Shape", [new], [f"{new}_shape"]),
        helper.make_node("Gather", [f"{new}_buffer_shape", f"axis_{axis}"], [f"{new}_capacity"]),
        helper.make_node("Gather", [f"{new}_shape", f"axis_{axis}"], [f"{new}_length"]),
        helper.make_node("Sub", [f"{new}_capacity", f"{new}_length"], [f"{new}_missing"]),
        helper.make_node("Concat", _end_pad(f"{new}_missing", axis), [f"{new}_pads"], axis=0),
        helper.make_node("Pad", [new, f"{new}_pads"], [f"{new}_padded"]),
    ]


def write_cache_graphs(
    version_dir: Path, num_layers: int, heads: int, head_dim: int, kv_dtype: str
) -> list[str]:
    """Write the cache helper graphs, and the greedy pick graph (``export/greedy_pick.py``),
    into ``version_dir``; returns the file names."""
    shape = (num_layers, heads, head_dim, kv_dtype)
    onnx.save(cache_copy_model(*shape), version_dir / CACHE_COPY_FILE)
    onnx.save(cache_write_model(*shape), version_dir / CACHE_WRITE_FILE)
    onnx.save(cache_resize_model(*shape), version_dir / CACHE_RESIZE_FILE)
    onnx.save(greedy_pick_model(), version_dir / GREEDY_PICK_FILE)
    return [CACHE_COPY_FILE, CACHE_WRITE_FILE, CACHE_RESIZE_FILE, GREEDY_PICK_FILE]
