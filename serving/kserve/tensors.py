"""KServe v2 / Triton tensor codec: protobuf tensors <-> numpy arrays, with input validation.

Wire layout (Triton's, so unmodified ``tritonclient`` works):

- A tensor's data travels either in the request's ``raw_input_contents`` (one ``bytes`` entry per
  input, in ``inputs`` order; the response's ``raw_output_contents`` likewise) or in the tensor's
  typed ``contents`` field (``fp32_contents``, ``int64_contents``, ...). One request uses one way.
- Raw numeric data: the elements flattened in row-major order, little-endian, no padding; BOOL is
  one byte per element. FP16 can only be sent raw (there is no typed field for it).
- Raw BYTES data: each element as a 4-byte little-endian length followed by that many bytes, all
  elements concatenated (``encode_bytes`` / ``decode_bytes``).

Every malformed tensor raises ``InvalidArgument`` with a message that names the tensor and says what
to fix, e.g. "input 'pixel_values' has 3072 bytes of raw data but shape [1,3,32,32] FP32 needs
12288". No other exception escapes the decoders, whatever the bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.errors import InvalidArgument
from serving.proto_gen.inference import grpc_service_pb2 as pb

BYTES = "BYTES"
NUMERIC_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
DATATYPES: tuple[str, ...] = (*NUMERIC_DTYPES, BYTES)
# The typed InferTensorContents field of each datatype; FP16 has none (raw only).
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}
ALL_CONTENTS_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(CONTENTS_FIELDS.values()))
_PREFIX = struct.Struct("<I")
MAX_ELEMENT_BYTES = 2**32 - 1  # a BYTES element's length must fit the 4-byte prefix
MAX_ELEMENTS = 2**31 - 1  # far above any message size; keeps numpy's shape arithmetic safe
MAX_RANK = 32


@dataclass(frozen=True)
class Tensor:
    """A decoded tensor.

    Attributes:
        name: the tensor's name.
        datatype: its KServe datatype ("FP32", "BYTES", ...).
        shape: its shape.
        data: numeric tensors: an array of the datatype's numpy type with ``shape``; BYTES: an
            object array of ``bytes`` with ``shape``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def batch(self) -> int:
        """The first dimension (0 for a scalar)."""
        return self.shape[0] if self.shape else 0


def format_shape(shape: Iterable[int]) -> str:
    """``[1,3,32,32]``: a shape as messages show it."""
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


# --- BYTES elements -------------------------------------------------------------------------------


def encode_bytes(elements: Iterable[bytes | str]) -> bytes:
    """Length-prefixed concatenation of BYTES elements (``str`` elements are UTF-8 encoded).

    Raises:
        ValueError: an element is longer than 2**32 - 1 bytes (the prefix cannot hold it).
    """
    parts: list[bytes] = []
    for element in elements:
        data = element.encode() if isinstance(element, str) else bytes(element)
        if len(data) > MAX_ELEMENT_BYTES:
            raise ValueError(f"a BYTES element of {len(data)} bytes does not fit a 4-byte prefix")
        parts.append(_PREFIX.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_bytes(data: bytes, what: str = "tensor", expected: int | None = None) -> list[bytes]:
    """Split length-prefixed BYTES data into its elements.

    Args:
        data: the raw contents.
        what: how messages name the tensor, e.g. "input 'text'".
        expected: the element count the tensor's shape needs; decoding stops as soon as the data
            holds more, so a hostile payload of many empty elements costs no memory.

    Raises:
        InvalidArgument: a truncated length prefix, an element running past the end of the data,
            or (with ``expected``) a different number of elements.
    """
    view = memoryview(data)
    size = len(view)
    offset = 0
    elements: list[bytes] = []
    while offset < size:
        index = len(elements)
        if expected is not None and index >= expected:
            raise InvalidArgument(
                f"{what} has more than {expected} BYTES elements in its raw data but its shape "
                f"needs {expected}: fix the shape or the data"
            )
        if size - offset < _PREFIX.size:
            raise InvalidArgument(
                f"{what} has broken BYTES data: element {index} starts at byte {offset} but only "
                f"{size - offset} bytes are left for its 4-byte length prefix; each element is a "
                "4-byte little-endian length followed by that many bytes"
            )
        (length,) = _PREFIX.unpack_from(view, offset)
        offset += _PREFIX.size
        if length > size - offset:
            raise InvalidArgument(
                f"{what} has broken BYTES data: element {index} declares {length} bytes but only "
                f"{size - offset} follow its length prefix; each element is a 4-byte "
                "little-endian length followed by that many bytes"
            )
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if expected is not None and len(elements) != expected:
        raise InvalidArgument(
            f"{what} has {len(elements)} BYTES elements in its raw data but its shape needs "
            f"{expected}: fix the shape or the data"
        )
    return elements


def _object_array(elements: Sequence[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(elements), dtype=object)
    array[:] = list(elements)
    return array.reshape(shape)


# --- decoding -------------------------------------------------------------------------------------


def check_datatype(datatype: str, what: str) -> None:
    """Raise InvalidArgument unless ``datatype`` is one this server decodes."""
    if datatype in DATATYPES:
        return
    if datatype == "BF16":
        raise InvalidArgument(f"{what} is BF16, which this server does not decode; send FP32")
    raise InvalidArgument(
        f"{what} has datatype {datatype[:40]!r}; use one of {', '.join(DATATYPES)} (case matters)"
    )


def check_shape(shape: Sequence[int], what: str) -> int:
    """The element count of ``shape``.

    Raises:
        InvalidArgument: a negative dimension, more than ``MAX_RANK`` dimensions, or more than
            ``MAX_ELEMENTS`` elements (zero dimensions left out of the count).
    """
    if len(shape) > MAX_RANK:
        raise InvalidArgument(f"{what} has {len(shape)} dimensions; at most {MAX_RANK} are allowed")
    if any(d < 0 for d in shape):
        raise InvalidArgument(
            f"{what} has shape {format_shape(shape)}; every dimension must be the actual size "
            "(>= 0), not -1"
        )
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:  # numpy refuses these even next to a 0
        raise InvalidArgument(
            f"{what} has shape {format_shape(shape)}; a tensor may hold at most {MAX_ELEMENTS} "
            "elements"
        )
    return math.prod(shape)


def decode_tensor(
    name: str,
    datatype: str,
    shape: Sequence[int],
    *,
    raw: bytes | None = None,
    contents: pb.InferTensorContents | None = None,
    role: str = "input",
) -> Tensor:
    """Decode one tensor from its raw data or its typed contents.

    Args:
        name, datatype, shape: the tensor's header.
        raw: its raw data, when the message uses raw contents.
        contents: its typed contents, when it uses them (None or empty: no typed data).
        role: "input" or "output", for messages.

    Raises:
        InvalidArgument: unknown datatype, negative dimension, data that does not match the
            shape, data in both forms or in the wrong typed field, values out of the type's range.
    """
    what = f"{role} {name[:100]!r}"
    check_datatype(datatype, what)
    shape = tuple(int(d) for d in shape)
    count = check_shape(shape, what)
    has_contents = contents is not None and contents.ByteSize() > 0
    if raw is not None:
        if has_contents:
            raise InvalidArgument(
                f"{what} has both raw data and typed contents; send its data one way only"
            )
        return Tensor(name, datatype, shape, _from_raw(raw, datatype, shape, count, what))
    if has_contents:
        assert contents is not None
        return Tensor(name, datatype, shape, _from_contents(contents, datatype, shape, count, what))
    if count:
        field = CONTENTS_FIELDS.get(datatype, "raw contents only")
        raise InvalidArgument(
            f"{what} has no data: send its {count} elements in raw_{role}_contents (one entry per "
            f"{role}, in order) or in contents.{field}"
        )
    empty = np.empty(shape, dtype=object if datatype == BYTES else NUMERIC_DTYPES[datatype])
    return Tensor(name, datatype, shape, empty)


def _from_raw(raw: bytes, datatype: str, shape: tuple[int, ...], count: int, what: str) -> Any:
    if datatype == BYTES:
        return _object_array(decode_bytes(raw, what, expected=count), shape)
    dtype = NUMERIC_DTYPES[datatype]
    needed = count * dtype.itemsize
    if len(raw) != needed:
        raise InvalidArgument(
            f"{what} has {len(raw)} bytes of raw data but shape {format_shape(shape)} {datatype} "
            f"needs {needed}"
        )
    if datatype == "BOOL":  # any non-zero byte is true; numpy bools must hold exactly 0 or 1
        return (np.frombuffer(raw, dtype=np.uint8) != 0).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_contents(
    contents: pb.InferTensorContents, datatype: str, shape: tuple[int, ...], count: int, what: str
) -> np.ndarray:
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidArgument(f"{what} is {datatype}, which has no typed field: send it raw")
    for other in ALL_CONTENTS_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise InvalidArgument(
                f"{what} is {datatype} but its data is in contents.{other}; use contents.{field}"
            )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidArgument(
            f"{what} has {len(values)} values in contents.{field} but shape "
            f"{format_shape(shape)} needs {count}"
        )
    if datatype == BYTES:
        return _object_array([bytes(v) for v in values], shape)
    dtype = NUMERIC_DTYPES[datatype]
    if dtype.kind in "iu" and dtype.itemsize < 4:  # int_contents / uint_contents are 32-bit
        wide = np.asarray(list(values), dtype=np.int64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidArgument(
                f"{what} is {datatype} but contents.{field} holds values outside "
                f"{info.min}..{info.max}: send values in that range or use a wider datatype"
            )
        return wide.astype(dtype).reshape(shape)
    return np.asarray(list(values), dtype=dtype).reshape(shape)


def decode_inputs(
    request: pb.ModelInferRequest, shared: dict[int, bytes] | None = None
) -> dict[str, Tensor]:
    """Every input of a request, by name.

    Args:
        request: the request.
        shared: the data of the inputs that lie in shared memory, by input index; the raw
            entries are then those of the other inputs, in order (Triton's layout).

    Raises:
        InvalidArgument: a nameless or repeated input, a raw entry count that is not one per input
            (not in shared memory), data sent two ways, or any tensor error of ``decode_tensor``.
    """
    shared = shared or {}
    raw = request.raw_input_contents
    plain = len(request.inputs) - len(shared)
    if raw and len(raw) != plain:
        raise InvalidArgument(
            f"the request has {plain} inputs{' outside shared memory' if shared else ''} but "
            f"{len(raw)} raw_input_contents entries: send one raw entry per such input, in the "
            "order of `inputs` (or none, and put the data in each input's contents)"
        )
    tensors: dict[str, Tensor] = {}
    next_raw = 0
    for index, tensor in enumerate(request.inputs):
        if not tensor.name:
            raise InvalidArgument(f"input {index} has no name; set InferInputTensor.name")
        if tensor.name in tensors:
            raise InvalidArgument(f"input {tensor.name[:100]!r} is sent twice; send it once")
        contents = tensor.contents if tensor.HasField("contents") else None
        if (raw or index in shared) and contents is not None and contents.ByteSize() > 0:
            where = (
                "it lies in shared memory"
                if index in shared
                else "the request uses raw_input_contents"
            )
            raise InvalidArgument(
                f"input {tensor.name[:100]!r} sets contents while {where}: "
                "send every input's data one way"
            )
        data = shared.get(index)
        if data is None and raw:
            data, next_raw = raw[next_raw], next_raw + 1
        tensors[tensor.name] = decode_tensor(
            tensor.name, tensor.datatype, tensor.shape, raw=data, contents=contents
        )
    return tensors


# --- encoding -------------------------------------------------------------------------------------


def as_array(datatype: str, values: Any) -> np.ndarray:
    """``values`` as an array of ``datatype`` (BYTES: object array of bytes; str is UTF-8)."""
    check_datatype(datatype, "tensor")
    if datatype != BYTES:
        return np.ascontiguousarray(values, dtype=NUMERIC_DTYPES[datatype])
    source = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)
    array = np.empty(source.shape, dtype=object)
    for index, element in np.ndenumerate(source):
        array[index] = element.encode() if isinstance(element, str) else bytes(element)
    return array


def raw_bytes(datatype: str, values: Any) -> bytes:
    """The raw wire form of ``values`` as ``datatype`` (row-major, little-endian)."""
    array = as_array(datatype, values)
    if datatype == BYTES:
        return encode_bytes(array.reshape(-1))
    return array.tobytes()


def typed_contents(datatype: str, values: Any) -> pb.InferTensorContents:
    """The typed-contents form of ``values`` as ``datatype``.

    Raises:
        ValueError: for FP16, which has no typed field.
    """
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise ValueError(f"{datatype} has no typed contents field; send it raw")
    flat = as_array(datatype, values).reshape(-1)
    contents = pb.InferTensorContents()
    getattr(contents, field).extend(flat.tolist() if datatype != BYTES else list(flat))
    return contents


def output_tensor(
    name: str, datatype: str, values: Any
) -> tuple[pb.ModelInferResponse.InferOutputTensor, bytes]:
    """An output tensor header and its raw contents."""
    array = as_array(datatype, values)
    header = pb.ModelInferResponse.InferOutputTensor(
        name=name, datatype=datatype, shape=list(array.shape)
    )
    return header, raw_bytes(datatype, array)


def input_tensor(
    name: str, datatype: str, values: Any, *, raw: bool = True
) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes | None]:
    """An input tensor and its raw contents (``raw=False``: typed contents, raw None)."""
    array = as_array(datatype, values)
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=list(array.shape)
    )
    if raw:
        return tensor, raw_bytes(datatype, array)
    tensor.contents.CopyFrom(typed_contents(datatype, array))
    return tensor, None


def decode_outputs(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Every output of a response as an array, by name (raw or typed contents).

    Raises:
        InvalidArgument: a malformed output tensor.
    """
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise InvalidArgument(
            f"the response has {len(response.outputs)} outputs but {len(raw)} "
            "raw_output_contents entries"
        )
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(response.outputs):
        arrays[tensor.name] = decode_tensor(
            tensor.name,
            tensor.datatype,
            tensor.shape,
            raw=raw[index] if raw else None,
            contents=tensor.contents if tensor.HasField("contents") else None,
            role="output",
        ).data
    return arrays
