"""JSON values of the KServe v2 REST protocol: parameters, and tensor data as JSON arrays.

A tensor's ``data`` is its elements in row-major order, flat or nested as the shape; BYTES
elements are strings (sent UTF-8 encoded), BOOL elements true / false, the other types numbers.
Parameters are JSON booleans, integers, reals or strings (``InferParameter``'s fields).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from serving.errors import InvalidArgument
from serving.kserve.tensors import BYTES, NUMERIC_DTYPES, encode_bytes, format_shape
from serving.proto_gen.inference import grpc_service_pb2 as pb

MAX_NESTING = 32  # a tensor has at most 32 dimensions (serving.kserve.tensors.MAX_RANK)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


def to_parameter(name: str, value: Any, what: str) -> pb.InferParameter:
    """A JSON parameter value as an ``InferParameter`` (bool, int64 / uint64, double, string)."""
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        if -INT64_MAX - 1 <= value <= INT64_MAX:
            return pb.InferParameter(int64_param=value)
        if value <= UINT64_MAX:
            return pb.InferParameter(uint64_param=value)
    elif isinstance(value, float) and math.isfinite(value):
        return pb.InferParameter(double_param=value)
    elif isinstance(value, str):
        return pb.InferParameter(string_param=value)
    raise InvalidArgument(
        f"{what} parameter {name[:100]!r} is {_kind(value)}; a parameter must be a boolean, an "
        "integer within 64 bits, a finite number or a string"
    )


def parameters_from(value: Any, what: str) -> dict[str, pb.InferParameter]:
    """A JSON ``parameters`` object as ``InferParameter``s by name (absent or null: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} parameters must be a JSON object, not {_kind(value)}")
    return {name: to_parameter(name, v, what) for name, v in value.items()}


def parameter_value(parameter: pb.InferParameter) -> bool | int | float | str | None:
    """An ``InferParameter``'s value as JSON (None where none is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def parameters_json(parameters: Any) -> dict[str, Any]:
    """A protobuf parameters map as a JSON object."""
    return {name: parameter_value(value) for name, value in parameters.items()}


def _kind(value: Any) -> str:
    """How a message names a JSON value's type."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _leaves(data: Any, what: str, depth: int = 0) -> Iterator[Any]:
    """The elements of a flat or nested JSON array, in row-major order."""
    if depth > MAX_NESTING:
        raise InvalidArgument(f"{what} data nests deeper than {MAX_NESTING} arrays")
    for item in data:
        if isinstance(item, list):
            yield from _leaves(item, what, depth + 1)
        else:
            yield item


def _numeric(data: list[Any], datatype: str, what: str) -> np.ndarray:
    """JSON numbers (or booleans, for BOOL) as a flat array of ``datatype``."""
    dtype = NUMERIC_DTYPES[datatype]
    try:
        array = np.asarray(data)
    except (ValueError, OverflowError) as err:  # ragged nesting; integers past 64 bits
        raise InvalidArgument(
            f"{what} data is not a regular array of numbers ({err}); send the elements flat, "
            "in row-major order"
        ) from None
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    kind = array.dtype.kind
    wanted = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[dtype.kind]
    if kind not in wanted:
        expect = {"b": "true / false", "f": "numbers"}.get(dtype.kind, "integers")
        raise InvalidArgument(f"{what} is {datatype}: its data must hold {expect} only")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise InvalidArgument(
                f"{what} is {datatype}: its values must lie within {info.min}..{info.max}"
            )
    return array.reshape(-1).astype(dtype)


def json_data(data: Any, datatype: str, shape: tuple[int, ...], what: str) -> bytes:
    """A tensor's JSON ``data`` in its raw wire form (row-major, little-endian; BYTES
    length-prefixed), checked against its datatype and its shape's element count."""
    if not isinstance(data, list):
        raise InvalidArgument(f"{what} data must be a JSON array, not {_kind(data)}")
    count = math.prod(shape)
    if datatype == BYTES:
        elements = list(_leaves(data, what))
        strings = [e for e in elements if isinstance(e, str)]
        if len(strings) != len(elements):
            raise InvalidArgument(
                f"{what} is BYTES: its JSON data must hold strings only (send other bytes as "
                "binary data)"
            )
        found = len(strings)
    elif datatype in NUMERIC_DTYPES:
        array = _numeric(data, datatype, what)
        found = array.size
    else:
        raise InvalidArgument(f"{what} is {datatype[:40]}, which JSON cannot hold; send FP32")
    if found != count:
        raise InvalidArgument(
            f"{what} data holds {found} elements but its shape {format_shape(shape)} needs "
            f"{count}; send one value per element"
        )
    return encode_bytes(strings) if datatype == BYTES else array.tobytes()


def array_json(array: np.ndarray, datatype: str) -> list[Any]:
    """An output array as a flat JSON list (BYTES elements as UTF-8 text)."""
    flat = array.reshape(-1)
    if datatype == BYTES:
        # the served models' BYTES outputs are UTF-8 text; anything else shows as U+FFFD
        return [bytes(e).decode("utf-8", "replace") for e in flat]
    return flat.tolist()
