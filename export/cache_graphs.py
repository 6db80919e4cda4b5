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

They run on the decoder's own device, so the cache never leaves it.
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
    ROWS,
    SOURCE_ROWS,
    WIDTH,
    kv_names,
    resize_buffer_names,
    update_name,
    written_name,
)

HELPER_OPSET = 18
_ONNX_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


def _buffer(
    name: str, elem_type: int, heads: int, head_dim: int, length: str
) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, ["rows_total", heads, length, head_dim])


def _rows_input(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, ["n"])


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", HELPER_OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def cache_copy_model(num_layers: int, heads: int, head_dim: int, kv_dtype: str) -> onnx.ModelProto:
    """``cache_copy``: ``rows`` of every past key / value become copies of ``source_rows``."""
    elem = _ONNX_TYPES[kv_dtype]
    names = kv_names("past", num_layers)
    nodes = [helper.make_node("Unsqueeze", [ROWS, "last_axis"], ["indices"])]
    for name in names:
        nodes.append(helper.make_node("Gather", [name, SOURCE_ROWS], [f"{name}_rows"], axis=0))
        nodes.append(
            helper.make_node("ScatterND", [name, "indices", f"{name}_rows"], [written_name(name)])
        )
    graph = helper.make_graph(
        nodes,
        CACHE_COPY,
        [_rows_input(ROWS), _rows_input(SOURCE_ROWS)]
        + [_buffer(n, elem, heads, head_dim, "capacity") for n in names],
        [_buffer(written_name(n), elem, heads, head_dim, "capacity") for n in names],
        initializer=[helper.make_tensor("last_axis", TensorProto.INT64, [1], [1])],
    )
    return _model(graph)


def cache_write_model(num_layers: int, heads: int, head_dim: int, kv_dtype: str) -> onnx.ModelProto:
    """``cache_write``: new cross keys / values written into ``rows``, padded along the source."""
    elem = _ONNX_TYPES[kv_dtype]
    names = kv_names("cross", num_layers)
    nodes = [helper.make_node("Unsqueeze", [ROWS, "last_axis"], ["indices"])]
    inputs = [_rows_input(ROWS)]
    for name in names:
        new = update_name(name)
        inputs += [
            _buffer(name, elem, heads, head_dim, "source_capacity"),
            helper.make_tensor_value_info(new, elem, ["n", heads, "source_length", head_dim]),
        ]
        nodes += _pad_to_buffer(name, new)
        nodes.append(
            helper.make_node("ScatterND", [name, "indices", f"{new}_padded"], [written_name(name)])
        )
    graph = helper.make_graph(
        nodes,
        CACHE_WRITE,
        inputs,
        [_buffer(written_name(n), elem, heads, head_dim, "source_capacity") for n in names],
        initializer=[
            helper.make_tensor("last_axis", TensorProto.INT64, [1], [1]),
            helper.make_tensor("source_axis", TensorProto.INT64, [1], [2]),
            helper.make_tensor("six_zeros", TensorProto.INT64, [6], [0] * 6),
            helper.make_tensor("one_zero", TensorProto.INT64, [1], [0]),
        ],
    )
    return _model(graph)


def cache_resize_model(
    num_layers: int, heads: int, head_dim: int, kv_dtype: str
) -> onnx.ModelProto:
    """``cache_resize``: every buffer cut or zero-padded to ``width`` along axis 2.

    One ``Pad`` per buffer whose end pad on axis 2 is ``width`` minus the buffer's width: positive
    pads with zeros, negative cuts (ONNX ``Pad`` crops on negative pads), so a re-layout copies
    each buffer once.
    """
    elem = _ONNX_TYPES[kv_dtype]
    names = resize_buffer_names(num_layers)
    nodes = []
    for name in names:
        nodes += [
            helper.make_node("Shape", [name], [f"{name}_shape"]),
            helper.make_node("Gather", [f"{name}_shape", "source_axis"], [f"{name}_width"]),
            helper.make_node("Sub", [WIDTH, f"{name}_width"], [f"{name}_change"]),
            # pads (begin of axes 0-3, end of axes 0-3): only the end of axis 2 changes.
            helper.make_node(
                "Concat", ["six_zeros", f"{name}_change", "one_zero"], [f"{name}_pads"], axis=0
            ),
            helper.make_node("Pad", [name, f"{name}_pads"], [written_name(name)]),
        ]
    graph = helper.make_graph(
        nodes,
        CACHE_RESIZE,
        [helper.make_tensor_value_info(WIDTH, TensorProto.INT64, [1])]
        + [_buffer(n, elem, heads, head_dim, "width_in") for n in names],
        [_buffer(written_name(n), elem, heads, head_dim, "width_out") for n in names],
        initializer=[
            helper.make_tensor("source_axis", TensorProto.INT64, [1], [2]),
            helper.make_tensor("six_zeros", TensorProto.INT64, [6], [0] * 6),
            helper.make_tensor("one_zero", TensorProto.INT64, [1], [0]),
        ],
    )
    return _model(graph)


def _pad_to_buffer(buffer: str, new: str) -> list[onnx.NodeProto]:
    """Nodes padding ``new`` with zeros at the end of axis 2 to the length of ``buffer``'s."""
    return [
        helper.make_node("Shape", [buffer], [f"{new}_buffer_shape"]),
        helper.make_node("Shape", [new], [f"{new}_shape"]),
        helper.make_node("Gather", [f"{new}_buffer_shape", "source_axis"], [f"{new}_capacity"]),
        helper.make_node("Gather", [f"{new}_shape", "source_axis"], [f"{new}_length"]),
        helper.make_node("Sub", [f"{new}_capacity", f"{new}_length"], [f"{new}_missing"]),
        # pads (begin of axes 0-3, end of axes 0-3): only the end of axis 2 grows.
        helper.make_node(
            "Concat", ["six_zeros", f"{new}_missing", "one_zero"], [f"{new}_pads"], axis=0
        ),
        helper.make_node("Pad", [new, f"{new}_pads"], [f"{new}_padded"]),
    ]


def write_cache_graphs(
    version_dir: Path, num_layers: int, heads: int, head_dim: int, kv_dtype: str
) -> list[str]:
    """Write the cache helper graphs into ``version_dir``; returns the file names."""
    shape = (num_layers, heads, head_dim, kv_dtype)
    onnx.save(cache_copy_model(*shape), version_dir / CACHE_COPY_FILE)
    onnx.save(cache_write_model(*shape), version_dir / CACHE_WRITE_FILE)
    onnx.save(cache_resize_model(*shape), version_dir / CACHE_RESIZE_FILE)
    return [CACHE_COPY_FILE, CACHE_WRITE_FILE, CACHE_RESIZE_FILE]
