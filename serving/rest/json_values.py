"""JSON values of the KServe v2 REST protocol: parameters, and tensor data as JSON arrays.

A tensor's ``data`` is its elements in row-major order, flat or nested as the shape; BYTES
elements are strings (sent UTF-8 encoded), BOOL elements true / false, the other types numbers.
Parameters are JSON booleans, integers, reals or strings (``InferParameter``'s fields).
"""

from __future__ import annotations

import math
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
        if 0 <= value <= UINT64_MAX:
            return pb.InferParameter(uint64_param=value)
    elif isinstance(value, float) and math.isfinite(value):
        return pb.InferParameter(double_param=value)
    elif isinstance(value, str):
        utf8(value, f"{what} parameter {name[:100]!r}")
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


def nested(data: Any, what: str) -> tuple[list[Any], tuple[int, ...]]:
    """The elements of a JSON array, flat or nested, in row-major order, and its nesting's
    shape (``[[1, 2], [3, 4]]``: (2, 2)).

    Raises:
        InvalidArgument: ragged nesting (arrays of different lengths, or arrays beside values),
            or more than ``MAX_NESTING`` levels.
    """
    if not isinstance(data, list):
        raise InvalidArgument(f"{what} data must be a JSON array, not {_kind(data)}")
    level: list[Any] = data
    shape = [len(data)]
    for _ in range(MAX_NESTING):
        inner = [item for item in level if isinstance(item, list)]
        if not inner:
            return level, tuple(shape)
        if len(inner) != len(level) or len({len(item) for item in inner}) != 1:
            raise InvalidArgument(
                f"{what} data is ragged (nested arrays of different lengths, or arrays beside "
                "values); send the elements flat, in row-major order"
            )
        shape.append(len(inner[0]))
        level = [element for item in inner for element in item]
    raise InvalidArgument(f"{what} data nests deeper than {MAX_NESTING} arrays")


def _numeric(elements: list[Any], datatype: str, what: str) -> np.ndarray:
    """JSON numbers (booleans, for BOOL) as a flat array of ``datatype``."""
    dtype = NUMERIC_DTYPES[datatype]
    kinds: set[type] = {type(e) for e in elements}
    allowed: set[type]
    if dtype.kind == "b":
        allowed, expect = {bool}, "true / false"
    elif dtype.kind == "f":
        allowed, expect = {int, float}, "numbers"
    else:
        allowed, expect = {int}, "integers"
    if not kinds <= allowed:
        raise InvalidArgument(f"{what} is {datatype}: its data must hold {expect} only")
    if dtype.kind in "iu" and elements:
        info = np.iinfo(dtype)
        if min(elements) < info.min or max(elements) > info.max:
            raise InvalidArgument(
                f"{what} is {datatype}: its values must lie within {info.min}..{info.max}"
            )
    try:
        with np.errstate(over="ignore"):  # an overflow to inf is refused below
            array = np.array(elements, dtype=dtype)
        if dtype.kind == "f" and not np.isfinite(array).all():  # NaN / Infinity literals pass
            wide = np.array(elements, dtype=np.float64)
            if (np.isinf(array) & np.isfinite(wide)).any():
                raise OverflowError
    except OverflowError:  # past what the type holds (70000 as FP16, 10**400 as anything)
        raise InvalidArgument(f"{what} is {datatype}: a value is too large for it") from None
    return array


def utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8 (a JSON escape of a lone surrogate, such as \\ud800, is no text)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{what} holds a lone UTF-16 surrogate escape (such as \\ud800), which is no text; "
            "send valid Unicode, or the bytes as binary data"
        ) from None


def json_data(data: Any, datatype: str, shape: tuple[int, ...], what: str) -> bytes:
    """A tensor's JSON ``data`` in its raw wire form (row-major, little-endian; BYTES
    length-prefixed), checked against its datatype and its shape's element count."""
    elements, _ = nested(data, what)
    count = math.prod(shape)
    if datatype == BYTES:
        if not all(isinstance(e, str) for e in elements):
            raise InvalidArgument(
                f"{what} is BYTES: its JSON data must hold strings only (send other bytes as "
                "binary data)"
            )
        raw = encode_bytes(utf8(e, what) for e in elements)
    elif datatype in NUMERIC_DTYPES:
        raw = _numeric(elements, datatype, what).tobytes()
    else:
        raise InvalidArgument(f"{what} is {datatype[:40]}, which JSON cannot hold; send FP32")
    if len(elements) != count:
        raise InvalidArgument(
            f"{what} data holds {len(elements)} elements but its shape {format_shape(shape)} "
            f"needs {count}; send one value per element"
        )
    return raw


def array_json(array: np.ndarray, datatype: str) -> list[Any]:
    """An output array as a flat JSON list (BYTES elements as UTF-8 text)."""
    flat = array.reshape(-1)
    if datatype == BYTES:
        # the served models' BYTES outputs are UTF-8 text; anything else shows as U+FFFD
        return [bytes(e).decode("utf-8", "replace") for e in flat]
    return flat.tolist()
