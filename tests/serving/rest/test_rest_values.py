"""The pure functions of the KServe v2 REST layer, without a server: tensor data and parameters as
JSON (``json_values``), ``/infer`` bodies with the binary data extension (``infer``), generate
bodies (``generate``) and protobuf messages as Triton's JSON (``proto_json``).

The regression tests of 8aa079a's fixes name what was broken before it (a 500 or a wrong answer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from export.repository import model_config_for
from serving.errors import InvalidArgument
from serving.kserve.signature import Signature, signature
from serving.kserve.tensors import (
    BYTES,
    DATATYPES,
    NUMERIC_DTYPES,
    encode_bytes,
    output_tensor,
    raw_bytes,
)
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.rest.generate import generate_json, generate_request
from serving.rest.infer import parse_infer, parse_json, response_body, split_body
from serving.rest.json_values import (
    array_json,
    json_data,
    parameter_value,
    parameters_from,
    parameters_json,
    to_parameter,
)
from serving.rest.proto_json import message_json
from tests.repositories import tiny_sources

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
FAST = settings(max_examples=100, deadline=None, suppress_health_check=HEALTH)
MANY = settings(max_examples=200, deadline=None, suppress_health_check=HEALTH)
FEW = settings(max_examples=20, deadline=None, suppress_health_check=HEALTH)

WHAT = "input 'x'"
HEADER = "Inference-Header-Content-Length"
INT_DATATYPES = tuple(d for d, t in NUMERIC_DTYPES.items() if t.kind in "iu")
FLOAT_DATATYPES = tuple(d for d, t in NUMERIC_DTYPES.items() if t.kind == "f")
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
EXPECT = {"b": "true / false", "f": "numbers", "i": "integers", "u": "integers"}

# the configs an export writes for the tiny models (the shipped models' shapes), without exporting
SIGNATURES: dict[str, Signature] = {
    source.kind: signature(model_config_for(source, source.kind, "fp32"))
    for source in tiny_sources()
}


def refused(call: Callable[[], Any], *words: str) -> str:
    """``call()``'s InvalidArgument message, which must hold each of ``words``."""
    with pytest.raises(InvalidArgument) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


# --- strategies -----------------------------------------------------------------------------------
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
LISTED_SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4)
NAMES = st.text(min_size=1, max_size=10)
JSON_PARAMETERS = st.one_of(
    st.booleans(),
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(INT64_MAX + 1, UINT64_MAX),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)


def text_array(items: list[str], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def tensors(
    datatype: str, shapes: st.SearchStrategy[tuple[int, ...]] = SHAPES
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``datatype``: BYTES ones as object arrays of text, floats without NaN (a NaN's
    payload need not survive a trip through a Python float), UINT64 ones often mixing values
    below 2**63 with values from 2**63 up (numpy makes such a list float64)."""
    if datatype == "UINT64":
        halves = st.integers(0, INT64_MAX) | st.integers(INT64_MAX + 1, UINT64_MAX)
        return hnp.arrays(NUMERIC_DTYPES[datatype], shapes, elements=halves)
    if datatype == BYTES:
        return shapes.flatmap(
            lambda shape: st.lists(
                st.text(max_size=6), min_size=math.prod(shape), max_size=math.prod(shape)
            ).map(lambda items: text_array(items, shape))
        )
    dtype = NUMERIC_DTYPES[datatype]
    elements = st.floats(width=8 * dtype.itemsize, allow_nan=False) if dtype.kind == "f" else None
    return hnp.arrays(dtype, shapes, elements=elements)


def typed_tensors(
    datatypes: tuple[str, ...] = DATATYPES, shapes: st.SearchStrategy[tuple[int, ...]] = SHAPES
) -> st.SearchStrategy[tuple[str, np.ndarray]]:
    return st.sampled_from(datatypes).flatmap(
        lambda datatype: tensors(datatype, shapes).map(lambda array: (datatype, array))
    )


def parameter_dicts(*reserved: str) -> st.SearchStrategy[dict[str, Any]]:
    keys = st.text(max_size=8).filter(lambda key: key not in reserved)
    return st.dictionaries(keys, JSON_PARAMETERS, max_size=3)


def expected_parameter(value: Any) -> pb.InferParameter:
    """The ``InferParameter`` a JSON value must become (an oracle independent of the code)."""
    if type(value) is bool:
        return pb.InferParameter(bool_param=value)
    if type(value) is int:
        if value <= INT64_MAX:
            return pb.InferParameter(int64_param=value)
        return pb.InferParameter(uint64_param=value)
    if type(value) is float:
        return pb.InferParameter(double_param=value)
    assert type(value) is str
    return pb.InferParameter(string_param=value)


def set_parameters(target: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        target[key].CopyFrom(expected_parameter(value))


def kind_words(datatype: str) -> str:
    return EXPECT[NUMERIC_DTYPES[datatype].kind]


# --- json_data: tensor data -----------------------------------------------------------------------
@MANY
@given(typed_tensors(shapes=LISTED_SHAPES), st.booleans(), st.booleans())
def test_json_data_is_the_raw_bytes(
    case: tuple[str, np.ndarray], nested: bool, through_json: bool
) -> None:
    datatype, array = case
    data = array.tolist() if nested else array.reshape(-1).tolist()
    if through_json:
        data = json.loads(json.dumps(data))
    assert json_data(data, datatype, array.shape, WHAT) == raw_bytes(datatype, array)


@pytest.mark.parametrize("values", [[0, 2**63], [UINT64_MAX, 1]])
def test_uint64_data_mixing_both_halves_is_accepted(values: list[int]) -> None:
    # before 8aa079a numpy made such a list float64: refused as "must hold integers only"
    expected = np.asarray(values, dtype=np.uint64).tobytes()
    assert json_data(values, "UINT64", (2,), WHAT) == expected


@FAST
@given(typed_tensors(shapes=st.just(())))
def test_json_data_of_a_scalar_is_one_flat_element(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    assert json_data([array.item()], datatype, (), WHAT) == raw_bytes(datatype, array)
    refused(lambda: json_data([], datatype, (), WHAT), "holds 0 elements", "needs 1")


@FAST
@given(st.sampled_from(FLOAT_DATATYPES), st.lists(st.integers(-1000, 1000), max_size=6))
def test_float_inputs_take_integers(datatype: str, values: list[int]) -> None:
    expected = np.asarray(values, dtype=NUMERIC_DTYPES[datatype]).tobytes()
    assert json_data(values, datatype, (len(values),), WHAT) == expected


@FAST
@given(typed_tensors(), st.integers(-3, 3).filter(bool), st.booleans())
def test_element_count_mismatch_is_refused(
    case: tuple[str, np.ndarray], delta: int, nested: bool
) -> None:
    datatype, array = case
    count = array.size + delta
    if count < 0:
        count = array.size + 1
    data = array.tolist() if nested and array.ndim else array.reshape(-1).tolist()
    refused(
        lambda: json_data(data, datatype, (count,), WHAT),
        WHAT,
        f"holds {array.size} elements",
        f"shape [{count}] needs {count}",
        "send one value per element",
    )


def as_datatype(data: Any, datatype: str) -> Any:
    """Nested integers as nested JSON values of ``datatype`` (BOOL: odd numbers true)."""
    if isinstance(data, list):
        return [as_datatype(item, datatype) for item in data]
    if datatype == BYTES:
        return str(data)
    return bool(data % 2) if datatype == "BOOL" else data


@pytest.mark.parametrize("datatype", DATATYPES)  # BYTES: accepted as 3 elements before 8aa079a
@pytest.mark.parametrize(
    "ragged", [[[1, 2], [3]], [1, [2, 3]], [[2, 3], 1], [[[1]], [2]], [[1], [], [2, 3]]]
)
def test_ragged_data_is_refused(datatype: str, ragged: list[Any]) -> None:
    data = as_datatype(ragged, datatype)
    refused(
        lambda: json_data(data, datatype, (3,), WHAT),
        WHAT,
        "ragged",
        "send the elements flat, in row-major order",
    )


@FAST
@given(typed_tensors(shapes=hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=3)))
def test_data_nested_other_than_the_shape_is_taken_in_row_major_order(
    case: tuple[str, np.ndarray],
) -> None:
    """Only the element count is checked against the shape: [[1, 2, 3], [4, 5, 6]] is the data of
    a [3, 2] tensor too."""
    datatype, array = case
    shape = (array.size,)
    assert json_data(array.tolist(), datatype, shape, WHAT) == raw_bytes(datatype, array)


@FAST
@given(st.data(), st.sampled_from(list(NUMERIC_DTYPES)), st.text(max_size=4))
def test_strings_in_numeric_data_are_refused(data: st.DataObject, datatype: str, text: str) -> None:
    array = data.draw(tensors(datatype, hnp.array_shapes(min_dims=1, max_dims=1, max_side=5)))
    values = array.tolist()
    values.insert(data.draw(st.integers(0, len(values))), text)
    refused(
        lambda: json_data(values, datatype, (len(values),), WHAT),
        WHAT,
        f"is {datatype}",
        f"must hold {kind_words(datatype)} only",
    )


@FAST
@given(
    st.data(),
    st.lists(st.text(max_size=4), max_size=5),
    st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(), st.just({})),
)
def test_non_strings_in_bytes_data_are_refused(
    data: st.DataObject, strings: list[str], other: Any
) -> None:
    values: list[Any] = list(strings)
    values.insert(data.draw(st.integers(0, len(values))), other)
    refused(
        lambda: json_data(values, BYTES, (len(values),), WHAT),
        WHAT,
        "is BYTES",
        "strings only",
        "binary data",
    )


@FAST
@given(
    st.data(),
    st.sampled_from(INT_DATATYPES),
    st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([None, {}, 2.0, -0.0]),
)
def test_non_integers_in_integer_data_are_refused(
    data: st.DataObject, datatype: str, other: Any
) -> None:
    info = np.iinfo(NUMERIC_DTYPES[datatype])
    values: list[Any] = data.draw(st.lists(st.integers(int(info.min), 0), max_size=4))
    values.insert(data.draw(st.integers(0, len(values))), other)
    refused(
        lambda: json_data(values, datatype, (len(values),), WHAT),
        WHAT,
        f"is {datatype}",
        "must hold integers only",
    )


@FAST
@given(st.data(), st.sampled_from([d for d in INT_DATATYPES if d != "INT64"]))
def test_out_of_range_integers_are_refused(data: st.DataObject, datatype: str) -> None:
    info = np.iinfo(NUMERIC_DTYPES[datatype])
    low = st.integers(INT64_MIN, int(info.min) - 1) if info.min > INT64_MIN else st.nothing()
    top = INT64_MAX if info.kind == "i" else UINT64_MAX
    high = st.integers(int(info.max) + 1, top) if info.max < top else st.nothing()
    value = data.draw(low | high)
    values = data.draw(st.lists(st.integers(int(info.min), int(info.max)), max_size=4))
    values.insert(data.draw(st.integers(0, len(values))), value)
    refused(
        lambda: json_data(values, datatype, (len(values),), WHAT),
        WHAT,
        f"is {datatype}",
        f"must lie within {info.min}..{info.max}",
    )


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        ("UINT8", 256),
        ("UINT8", -1),
        ("UINT16", 65536),
        ("UINT32", -1),
        ("UINT32", 2**32),
        ("UINT64", -1),
        ("INT8", 128),
        ("INT8", -129),
        ("INT16", 2**15),
        ("INT32", 2**31),
        ("INT32", -(2**31) - 1),
    ],
)
def test_out_of_range_examples(datatype: str, value: int) -> None:
    refused(lambda: json_data([0, value], datatype, (2,), WHAT), WHAT, "must lie within")


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("UINT64", [2**64]),
        ("INT64", [INT64_MIN - 1]),
        ("INT64", [-1, 2**63]),
        ("UINT64", [-1, 2**63]),
    ],
)
def test_integers_past_64_bits_are_refused(datatype: str, values: list[int]) -> None:
    # the mixed ones were "must hold integers only" before 8aa079a (numpy made them float64)
    refused(
        lambda: json_data(values, datatype, (len(values),), WHAT),
        WHAT,
        f"is {datatype}",
        "must lie within",
    )


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_float_inputs_take_integer_literals_past_64_bits(datatype: str) -> None:
    # JavaScript writes 1e20 as 100000000000000000000; refused as "numbers only" before 8aa079a
    data = json.loads("[100000000000000000000, -3]")
    assert json_data(data, datatype, (2,), WHAT) == raw_bytes(datatype, [1e20, -3.0])


@pytest.mark.parametrize("datatype", FLOAT_DATATYPES)
def test_integer_literals_past_a_float_are_refused(datatype: str) -> None:
    data = json.loads("[" + "9" * 400 + "]")
    refused(lambda: json_data(data, datatype, (1,), WHAT), WHAT, f"is {datatype}", "too large")


@pytest.mark.parametrize("values", [[1, 0], [1.0], [0], [True, 1], ["true"], [None]])
def test_bool_data_must_be_booleans(values: list[Any]) -> None:
    refused(
        lambda: json_data(values, "BOOL", (len(values),), WHAT),
        WHAT,
        "is BOOL",
        "true / false only",
    )


@pytest.mark.parametrize("datatype", [d for d in NUMERIC_DTYPES if d != "BOOL"])
def test_booleans_alone_are_refused_for_numbers(datatype: str) -> None:
    refused(lambda: json_data([True, False], datatype, (2,), WHAT), WHAT, f"is {datatype}")


@pytest.mark.parametrize("datatype", [d for d in NUMERIC_DTYPES if d != "BOOL"])
def test_booleans_among_numbers_are_refused(datatype: str) -> None:
    # [1, true] as INT32 was [1, 1] before 8aa079a
    for values in ([1, True], [False, 2], [0.5, True]):
        refused(
            lambda values=values: json_data(values, datatype, (2,), WHAT),
            WHAT,
            f"is {datatype}",
            f"must hold {kind_words(datatype)} only",
        )


@pytest.mark.parametrize(("datatype", "words"), [("BF16", "BF16"), ("FOO", "FOO")])
def test_datatypes_json_cannot_hold_are_refused(datatype: str, words: str) -> None:
    refused(
        lambda: json_data([1.0], datatype, (1,), WHAT),
        WHAT,
        words,
        "which JSON cannot hold",
        "send FP32",
    )


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (None, "null"),
        (1, "an integer"),
        (1.5, "a number"),
        (True, "a boolean"),
        ("abc", "a string"),
        ({"a": [1]}, "an object"),
        ((1,), "tuple"),
    ],
)
def test_non_list_data_is_refused(datatype: str, data: Any, kind: str) -> None:
    refused(
        lambda: json_data(data, datatype, (1,), WHAT), WHAT, "must be a JSON array", f"not {kind}"
    )


@pytest.mark.parametrize("datatype", DATATYPES)
def test_data_nesting_past_32_arrays_is_refused(datatype: str) -> None:
    element = as_datatype(1, datatype)
    data: list[Any] = [element]
    for _ in range(31):  # 32 arrays: a 32-dimensional tensor's nesting
        data = [data]
    assert json_data(data, datatype, (1,), WHAT) == raw_bytes(datatype, [element])
    for depth in (33, 70, 5000):
        deeper: list[Any] = data
        for _ in range(depth - 32):
            deeper = [deeper]
        refused(
            lambda deeper=deeper: json_data(deeper, datatype, (1,), WHAT),
            WHAT,
            "nests deeper than 32 arrays",
        )


def test_empty_data_of_an_empty_tensor() -> None:
    for datatype in DATATYPES:
        assert json_data([], datatype, (0,), WHAT) == b""
        assert json_data([[], []], datatype, (2, 0), WHAT) == b""


# --- array_json -----------------------------------------------------------------------------------
@FAST
@given(typed_tensors(datatypes=tuple(NUMERIC_DTYPES)))
def test_array_json_of_numbers_is_the_flat_list(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    values = array_json(array, datatype)
    assert values == array.reshape(-1).tolist()
    assert json.loads(json.dumps(values)) == values
    if datatype == "BOOL":
        assert all(type(v) is bool for v in values)
    elif datatype in INT_DATATYPES:
        assert all(type(v) is int for v in values)


@FAST
@given(st.lists(st.text(max_size=6), max_size=6))
def test_array_json_of_bytes_is_text(texts: list[str]) -> None:
    array = text_array([t.encode() for t in texts], (len(texts),))
    assert array_json(array, BYTES) == texts


def test_array_json_shows_undecodable_bytes_as_replacement_characters() -> None:
    array = text_array([b"ok", b"\xff\xfeA"], (1, 2))
    assert array_json(array, BYTES) == ["ok", "\ufffd\ufffdA"]


# --- parameters -----------------------------------------------------------------------------------
@MANY
@given(JSON_PARAMETERS, st.booleans())
def test_parameters_round_trip(value: Any, through_json: bool) -> None:
    if through_json:
        value = json.loads(json.dumps(value))
    parameter = to_parameter("p", value, "request")
    assert parameter == expected_parameter(value)
    back = parameter_value(parameter)
    assert type(back) is type(value) and back == value


def test_parameter_kinds_at_the_64_bit_edges() -> None:
    cases: list[tuple[Any, str]] = [
        (INT64_MIN, "int64_param"),
        (INT64_MAX, "int64_param"),
        (INT64_MAX + 1, "uint64_param"),
        (UINT64_MAX, "uint64_param"),
        (True, "bool_param"),
        (False, "bool_param"),
        (0, "int64_param"),
        (0.0, "double_param"),
        (1.0, "double_param"),
        ("", "string_param"),
    ]
    for value, kind in cases:
        parameter = to_parameter("p", value, "request")
        assert parameter.WhichOneof("parameter_choice") == kind
        assert type(parameter_value(parameter)) is type(value)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null"),
        ([1], "an array"),
        ({"a": 1}, "an object"),
        (math.nan, "a number"),
        (math.inf, "a number"),
        (-math.inf, "a number"),
        (UINT64_MAX + 1, "an integer"),
        (2**100, "an integer"),
        (INT64_MIN - 1, "an integer"),  # before 8aa079a: protobuf's ValueError, a 500
        (-(2**100), "an integer"),
    ],
)
def test_parameters_json_cannot_hold_are_refused(value: Any, kind: str) -> None:
    words = ("input 'x' parameter 'p'", f"is {kind}", "integer within 64 bits", "finite number")
    refused(lambda: to_parameter("p", value, WHAT), *words)
    refused(lambda: parameters_from({"ok": 1, "p": value}, WHAT), *words)


@FAST
@given(parameter_dicts())
def test_parameters_from_and_parameters_json_round_trip(values: dict[str, Any]) -> None:
    parameters = parameters_from(values, "request")
    assert parameters == {key: expected_parameter(value) for key, value in values.items()}
    assert parameters_json(parameters) == values
    request = pb.ModelInferRequest()  # a protobuf map, as the responses hold them
    for key, parameter in parameters.items():
        request.parameters[key].CopyFrom(parameter)
    assert parameters_json(request.parameters) == values


@pytest.mark.parametrize(
    ("value", "kind"), [([], "an array"), ("x", "a string"), (3, "an integer")]
)
def test_parameters_must_be_an_object(value: Any, kind: str) -> None:
    refused(lambda: parameters_from(value, "request"), "request parameters", "JSON object", kind)


def test_absent_parameters() -> None:
    assert parameters_from(None, "request") == {}
    assert parameters_from({}, "request") == {}
    assert parameter_value(pb.InferParameter()) is None
    assert parameters_json({}) == {}


# --- split_body -----------------------------------------------------------------------------------
@FAST
@given(st.binary(max_size=40), st.data())
def test_split_body_at_the_header_length(body: bytes, data: st.DataObject) -> None:
    assert split_body(body, None) == (body, b"")
    length = data.draw(st.integers(0, len(body)))
    assert split_body(body, str(length)) == (body[:length], body[length:])


@FAST
@given(
    st.binary(max_size=20),
    st.one_of(
        st.integers(max_value=-1),
        st.integers(1, 3),  # past the body's end by this much
        st.integers(10**6, 10**30),
        st.sampled_from(["", "abc", "1.5", "0x1", "1e3", "ten"]),
    ),
)
def test_split_body_refuses_bad_header_lengths(body: bytes, bad: int | str) -> None:
    header = str(len(body) + bad if isinstance(bad, int) and 1 <= bad <= 3 else bad)
    refused(
        lambda: split_body(body, header),
        HEADER,
        f"for a body of {len(body)} bytes",
        "the length of the JSON part",
    )


# --- parse_infer ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputCase:
    """One input of a generated request, and how it is sent: "flat" / "nested" JSON data,
    "binary" data after the JSON part, or "shared" (no data: it names a shared memory region,
    and has no raw entry in the request)."""

    name: str
    datatype: str
    array: np.ndarray
    how: str
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def raw(self) -> bytes:
        return raw_bytes(self.datatype, self.array)

    @property
    def all_parameters(self) -> dict[str, Any]:
        """The input's parameters in the request (binary_data_size is not one)."""
        if self.how != "shared":
            return self.parameters
        region = {"shared_memory_region": "region", "shared_memory_byte_size": len(self.raw)}
        return {**self.parameters, **region}

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.array.shape),
        }
        parameters = dict(self.all_parameters)
        if self.how == "binary":
            parameters["binary_data_size"] = len(self.raw)
        if parameters:
            entry["parameters"] = parameters
        if self.how == "nested" and self.array.ndim:
            entry["data"] = self.array.tolist()
        elif self.how in ("flat", "nested"):
            entry["data"] = self.array.reshape(-1).tolist()
        return entry


@st.composite
def input_cases(draw: st.DrawFn) -> InputCase:
    datatype, array = draw(typed_tensors())
    how = draw(st.sampled_from(["flat", "nested", "binary", "binary", "shared"]))
    parameters = draw(parameter_dicts("binary_data_size", "shared_memory_region"))
    return InputCase(draw(NAMES), datatype, array, how, parameters)


@dataclass(frozen=True)
class OutputRequest:
    name: str
    binary: bool | None
    parameters: dict[str, Any]

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name}
        parameters = dict(self.parameters)
        if self.binary is not None:
            parameters["binary_data"] = self.binary
        if parameters:
            entry["parameters"] = parameters
        return entry


output_requests = st.builds(
    OutputRequest, NAMES, st.none() | st.booleans(), parameter_dicts("binary_data")
)


@dataclass(frozen=True)
class InferCase:
    model_name: str
    model_version: str
    id: str | None
    parameters: dict[str, Any]
    all_binary: bool | None
    inputs: list[InputCase]
    outputs: list[OutputRequest]
    header_anyway: bool  # send the header although no input is binary

    def body(self) -> tuple[bytes, str | None]:
        document: dict[str, Any] = {"inputs": [i.entry() for i in self.inputs]}
        if self.id is not None:
            document["id"] = self.id
        parameters = dict(self.parameters)
        if self.all_binary is not None:
            parameters["binary_data_output"] = self.all_binary
        if parameters:
            document["parameters"] = parameters
        if self.outputs:
            document["outputs"] = [o.entry() for o in self.outputs]
        head = json.dumps(document).encode()
        binary = b"".join(i.raw for i in self.inputs if i.how == "binary")
        if binary or self.header_anyway:
            return head + binary, str(len(head))
        return head, None

    def expected(self) -> pb.ModelInferRequest:
        request = pb.ModelInferRequest(
            model_name=self.model_name, model_version=self.model_version, id=self.id or ""
        )
        set_parameters(request.parameters, self.parameters)
        for case in self.inputs:
            tensor = request.inputs.add(
                name=case.name, datatype=case.datatype, shape=case.array.shape
            )
            set_parameters(tensor.parameters, case.all_parameters)
            if case.how != "shared":
                request.raw_input_contents.append(case.raw)
        for output in self.outputs:
            set_parameters(request.outputs.add(name=output.name).parameters, output.parameters)
        return request


infer_cases = st.builds(
    InferCase,
    st.text(max_size=10),
    st.sampled_from(["", "1", "12"]),
    st.none() | st.text(max_size=12),
    parameter_dicts("binary_data_output"),
    st.none() | st.booleans(),
    st.lists(input_cases(), max_size=4),
    st.lists(output_requests, max_size=3, unique_by=lambda o: o.name),
    st.booleans(),
)


@MANY
@given(infer_cases)
def test_parse_infer_of_valid_requests(case: InferCase) -> None:
    body, header = case.body()
    parsed = parse_infer(body, header, case.model_name, case.model_version)
    message = parsed.message
    assert message == case.expected()
    # the fields one by one, for a readable failure
    assert (message.model_name, message.model_version) == (case.model_name, case.model_version)
    assert message.id == (case.id or "")
    assert parameters_json(message.parameters) == case.parameters
    assert [(t.name, t.datatype, list(t.shape)) for t in message.inputs] == [
        (i.name, i.datatype, list(i.array.shape)) for i in case.inputs
    ]
    assert list(message.raw_input_contents) == [i.raw for i in case.inputs if i.how != "shared"]
    for tensor in message.inputs:
        assert "binary_data_size" not in tensor.parameters
    assert [o.name for o in message.outputs] == [o.name for o in case.outputs]
    for output in message.outputs:
        assert "binary_data" not in output.parameters
    assert parsed.binary == {o.name: o.binary for o in case.outputs if o.binary is not None}
    assert parsed.all_binary is bool(case.all_binary)


def entry(**fields: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": "INT32", "shape": [2], **fields}


def body_of(document: Any, binary: bytes = b"") -> tuple[bytes, str | None]:
    head = json.dumps(document).encode()
    return head + binary, str(len(head)) if binary else None


def refused_infer(body: bytes, header: str | None, *words: str) -> str:
    return refused(lambda: parse_infer(body, header, "m", ""), *words)


@pytest.mark.parametrize("header", ["-1", "abc", "", "1.0", "999"])
def test_parse_infer_refuses_bad_header_lengths(header: str) -> None:
    body, _ = body_of({"inputs": []})
    refused_infer(body, header, HEADER, "the length of the JSON part")


def test_parse_infer_refuses_binary_sizes_that_overrun() -> None:
    document = {"inputs": [entry(parameters={"binary_data_size": 8})]}
    body, header = body_of(document, bytes(4))
    refused_infer(body, header, "input 'x'", "claims 8 bytes", "only 4 remain", HEADER)
    sized = [entry(name=name, parameters={"binary_data_size": 1}) for name in ("x", "y")]
    body, header = body_of({"inputs": sized}, b"\x01")
    refused_infer(body, header, "input 'y'", "claims 1 bytes", "only 0 remain")
    body, _ = body_of({"inputs": [entry(parameters={"binary_data_size": 1})]})
    refused_infer(body, None, "input 'x'", "claims 1 bytes", "only 0 remain")


@pytest.mark.parametrize("extra", [b"\x00", bytes(9)])
def test_parse_infer_refuses_binary_bytes_left_over(extra: bytes) -> None:
    document = {"inputs": [entry(parameters={"binary_data_size": 8})]}
    body, header = body_of(document, bytes(8) + extra)
    refused_infer(body, header, f"{len(extra)} bytes of binary data follow", HEADER)
    body, header = body_of({"inputs": [entry(data=[1, 2])]}, extra)
    refused_infer(body, header, f"{len(extra)} bytes of binary data follow")


def test_parse_infer_refuses_data_and_binary_size() -> None:
    document = {"inputs": [entry(data=[1, 2], parameters={"binary_data_size": 8})]}
    body, header = body_of(document, bytes(8))
    refused_infer(body, header, "input 'x'", "both data and binary_data_size", "one way")


@pytest.mark.parametrize("size", [-1, True, 1.5, "8"])
def test_parse_infer_binary_size_must_be_a_count(size: Any) -> None:
    body, _ = body_of({"inputs": [entry(parameters={"binary_data_size": size})]})
    refused_infer(body, None, "input 'x' binary_data_size", "integer >= 0")


@pytest.mark.parametrize("body", [b"[]", b"1", b'"inputs"', b"null", b"true"])
def test_parse_infer_refuses_a_non_object_body(body: bytes) -> None:
    refused_infer(body, None, "the request body must be a JSON object")


@pytest.mark.parametrize(
    "document", [{}, {"input": []}, {"inputs": None}, {"inputs": {"name": "x"}}, {"inputs": "x"}]
)
def test_parse_infer_needs_inputs(document: dict[str, Any]) -> None:
    refused_infer(json.dumps(document).encode(), None, '"inputs"', "an array of")


@pytest.mark.parametrize("shape", [None, "1", 2, [1.0], [True], ["2"], [[2]], {"0": 2}, [1, None]])
def test_parse_infer_refuses_bad_shape_types(shape: Any) -> None:
    body, _ = body_of({"inputs": [entry(shape=shape)]})
    refused_infer(body, None, "input 'x'", "shape must be an array of integers")


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ([-1], "(>= 0), not -1"),
        ([1] * 33, "at most 32"),
        ([2**40, 2**40], "at most 2147483647 elements"),
        ([0, 2**70], "at most 2147483647 elements"),
    ],
)
def test_parse_infer_refuses_bad_shapes(shape: list[int], words: str) -> None:
    body, _ = body_of({"inputs": [entry(shape=shape)]})
    refused_infer(body, None, "input 'x'", words)


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"{'inputs': []}", b'{"inputs": [],}', b'{"inputs": [] } x', b"NaN x"],
)
def test_parse_infer_refuses_invalid_json(body: bytes) -> None:
    refused_infer(body, None, "not valid JSON", "send a JSON object")


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe{\x00}\x00",  # UTF-16
        b'{"inputs": [], "id": "caf\xe9"}',  # Latin-1
        b'{"inputs": [], "id": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8
    ],
)
def test_parse_infer_refuses_bodies_not_in_utf8(body: bytes) -> None:
    refused_infer(body, None, "not UTF-8", "send JSON in UTF-8")


def test_parse_infer_refuses_a_json_part_followed_by_bytes_without_the_header() -> None:
    body, _ = body_of({"inputs": [entry(parameters={"binary_data_size": 8})]})
    refused_infer(body + bytes(8), None, "not valid JSON")


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
    ],
)
def test_parse_infer_refuses_deeply_nested_json(body: bytes) -> None:
    refused_infer(body, None, "nests too deep")


def test_parse_infer_refuses_huge_integer_literals() -> None:
    # json.loads raises a plain ValueError past 4,300 digits: a 500 before 8aa079a
    for literal in (b"1" * 5000, b"-" + b"9" * 4301):
        refused_infer(b'{"inputs": [], "id": ' + literal + b"}", None, "thousands of digits")


LONE_SURROGATES = {  # as JSON escapes: the bodies themselves are ASCII
    "bytes data": rb'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], '
    rb'"data": ["\ud800"]}]}',
    "id": rb'{"inputs": [], "id": "\ud800"}',
    "input name": rb'{"inputs": [{"name": "\udc00", "datatype": "INT8", "shape": [0], '
    rb'"data": []}]}',
    "parameter": rb'{"inputs": [], "parameters": {"k": "\ud800"}}',
    "parameter name": rb'{"inputs": [], "parameters": {"\ud800": 1}}',
    "output name": rb'{"inputs": [], "outputs": [{"name": "\udfff"}]}',
}


@pytest.mark.parametrize("body", list(LONE_SURROGATES.values()), ids=list(LONE_SURROGATES))
def test_parse_infer_refuses_lone_surrogates(body: bytes) -> None:
    # before 8aa079a: UnicodeEncodeError from encode_bytes or protobuf, a 500
    refused_infer(body, None, "lone UTF-16 surrogate", "send valid Unicode")


def test_parse_infer_takes_surrogate_pairs_and_escaped_backslashes() -> None:
    body = (
        rb'{"id": "\\ud800", "inputs": [{"name": "\ud83d\ude00", "datatype": "BYTES", '
        rb'"shape": [2], "data": ["\uD83D\uDE00", "\\udc00"]}]}'
    )
    message = parse_infer(body, None, "m", "").message
    assert message.id == "\\ud800"  # an escaped backslash, then plain text
    assert message.inputs[0].name == "\U0001f600"
    assert list(message.raw_input_contents) == [encode_bytes(["\U0001f600", "\\udc00"])]


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ({"inputs": [1]}, ("inputs[0] must be a JSON object",)),
        ({"inputs": [{"datatype": "INT32", "shape": [1]}]}, ("inputs[0].name", "string")),
        ({"inputs": [entry(datatype=None)]}, ("input 'x' datatype", "string")),
        ({"inputs": [entry(datatype="BF16")]}, ("input 'x' is BF16", "send FP32")),
        ({"inputs": [entry(datatype="int32")]}, ("input 'x'", "'int32'", "case matters")),
        ({"inputs": [entry(data=[1, 2, 3])]}, ("input 'x' data holds 3 elements",)),
        ({"inputs": [entry(data=[1, "2"])]}, ("input 'x' is INT32", "integers only")),
        ({"inputs": [entry(parameters=[1])]}, ("input 'x' parameters", "JSON object")),
        ({"inputs": [], "id": 7}, ("id must be a string",)),
        ({"inputs": [], "id": "i" * 1025}, ("id", "at most 1024 characters")),
        ({"inputs": [], "parameters": {"binary_data_output": 1}}, ("binary_data_output", "true")),
        ({"inputs": [], "parameters": {"p": None}}, ("request parameter 'p' is null",)),
        (
            {"inputs": [entry(parameters={"binary_data_size": None})]},
            ("input 'x' parameter 'binary_data_size' is null",),
        ),
        ({"inputs": [], "outputs": {"name": "y"}}, ('"outputs" must be an array',)),
        ({"inputs": [], "outputs": None}, ('"outputs" must be an array',)),
        ({"inputs": [], "outputs": ["y"]}, ("outputs[0] must be a JSON object",)),
        ({"inputs": [], "outputs": [{"name": 1}]}, ("outputs[0].name", "string")),
        (
            {"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]},
            ("output 'y' binary_data must be true or false",),
        ),
    ],
)
def test_parse_infer_refuses_bad_fields(document: dict[str, Any], words: tuple[str, ...]) -> None:
    refused_infer(json.dumps(document).encode(), None, *words)


def test_parse_infer_shared_memory_inputs_have_no_raw_entry() -> None:
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    inputs = [entry(name="a", data=[1, 2]), entry(parameters=region), entry(name="b", data=[3, 4])]
    parsed = parse_infer(json.dumps({"inputs": inputs}).encode(), None, "m", "2")
    assert [t.name for t in parsed.message.inputs] == ["a", "x", "b"]
    assert list(parsed.message.raw_input_contents) == [
        raw_bytes("INT32", [1, 2]),
        raw_bytes("INT32", [3, 4]),
    ]
    assert parameters_json(parsed.message.inputs[1].parameters) == region


@pytest.mark.parametrize("parameters", [None, {"shared_memory_byte_size": 8}])
def test_parse_infer_refuses_an_input_without_data(parameters: dict[str, Any] | None) -> None:
    body, _ = body_of({"inputs": [entry(parameters=parameters)]})
    refused_infer(
        body, None, "input 'x' has no data", '"data"', "binary_data_size", "shared_memory_region"
    )


# --- response_body --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputCase:
    name: str
    datatype: str
    array: np.ndarray
    shared: bool
    parameters: dict[str, Any]

    @property
    def raw(self) -> bytes:
        return raw_bytes(self.datatype, self.array)


@st.composite
def output_cases(draw: st.DrawFn) -> OutputCase:
    # at least one dimension: output_tensor (tensors.as_array, np.ascontiguousarray) gives a
    # numeric 0-d array the shape [1]
    datatype, array = draw(typed_tensors(shapes=LISTED_SHAPES))
    parameters = draw(parameter_dicts("binary_data_size", "shared_memory_region"))
    return OutputCase(draw(NAMES), datatype, array, draw(st.integers(0, 4)) == 0, parameters)


@dataclass(frozen=True)
class ResponseCase:
    model_name: str
    model_version: str
    id: str
    parameters: dict[str, Any]
    outputs: list[OutputCase]
    flags: dict[str, bool]  # per output binary_data
    all_binary: bool

    def response(self) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(
            model_name=self.model_name, model_version=self.model_version, id=self.id
        )
        set_parameters(response.parameters, self.parameters)
        for case in self.outputs:
            header, raw = output_tensor(case.name, case.datatype, case.array)
            assert raw == case.raw
            set_parameters(header.parameters, case.parameters)
            if case.shared:  # as serving.kserve.execute.write_shared leaves it
                header.parameters["shared_memory_region"].string_param = "region"
                header.parameters["shared_memory_byte_size"].int64_param = len(raw)
                raw = b""
            response.outputs.append(header)
            response.raw_output_contents.append(raw)
        return response

    def is_binary(self, case: OutputCase) -> bool:
        return not case.shared and self.flags.get(case.name, self.all_binary)


@st.composite
def response_cases(draw: st.DrawFn) -> ResponseCase:
    outputs = draw(st.lists(output_cases(), max_size=4, unique_by=lambda o: o.name))
    names = [o.name for o in outputs]
    flags = draw(st.dictionaries(st.sampled_from(names), st.booleans())) if names else {}
    return ResponseCase(
        draw(st.text(max_size=8)),
        draw(st.sampled_from(["", "1"])),
        draw(st.text(max_size=8)),
        draw(parameter_dicts()),
        outputs,
        flags,
        draw(st.booleans()),
    )


def json_values(case: OutputCase) -> list[Any]:
    if case.datatype == BYTES:
        return list(case.array.reshape(-1))
    return case.array.reshape(-1).tolist()


@MANY
@given(response_cases())
def test_response_body(case: ResponseCase) -> None:
    content, length = response_body(case.response(), case.flags, case.all_binary)
    binary = [o for o in case.outputs if case.is_binary(o)]
    if binary:
        assert length is not None and 0 < length <= len(content)
        head, tail = content[:length], content[length:]
        assert tail == b"".join(o.raw for o in binary)  # in output order
    else:
        assert length is None
        head = content
    document = json.loads(head)
    assert document["model_name"] == case.model_name
    assert document["model_version"] == case.model_version
    assert document.get("id") == (case.id or None)
    assert document.get("parameters") == (case.parameters or None)
    assert [o["name"] for o in document["outputs"]] == [o.name for o in case.outputs]
    for entry, output in zip(document["outputs"], case.outputs, strict=True):
        assert entry["datatype"] == output.datatype
        assert entry["shape"] == list(output.array.shape)
        parameters = dict(output.parameters)
        if output.shared:  # as Triton's HTTP answer: neither data nor parameters
            parameters = {}
            assert "data" not in entry
        elif case.is_binary(output):
            parameters["binary_data_size"] = len(output.raw)
            assert "data" not in entry
        else:
            assert entry["data"] == json_values(output)
        assert entry.get("parameters") == (parameters or None)


def test_response_body_per_output_flag_overrides_all_binary() -> None:
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    for name, values in (("a", [1, 2]), ("b", [3])):
        header, raw = output_tensor(name, "INT32", values)
        response.outputs.append(header)
        response.raw_output_contents.append(raw)
    content, length = response_body(response, {"a": False}, True)
    assert length is not None
    document = json.loads(content[:length])
    assert document["outputs"][0]["data"] == [1, 2]
    assert document["outputs"][1]["parameters"] == {"binary_data_size": 4}
    assert content[length:] == raw_bytes("INT32", [3])
    content, length = response_body(response, {"b": True}, False)
    assert length is not None and content[length:] == raw_bytes("INT32", [3])
    content, length = response_body(response, {}, False)
    assert length is None and "id" not in json.loads(content)


def test_response_body_bytes_outputs_are_text() -> None:
    response = pb.ModelInferResponse(model_name="m", id="r1")
    header, raw = output_tensor("label", BYTES, [["0.9:1:un", "é"]])
    response.outputs.append(header)
    response.raw_output_contents.append(raw)
    content, length = response_body(response, {}, False)
    assert length is None
    assert json.loads(content)["outputs"] == [
        {"name": "label", "datatype": "BYTES", "shape": [1, 2], "data": ["0.9:1:un", "é"]}
    ]
    assert "é".encode() in content  # ensure_ascii=False: UTF-8 text, not \u escapes


def test_response_body_shared_memory_output_has_no_binary_part() -> None:
    response = pb.ModelInferResponse(model_name="m")
    header, _ = output_tensor("y", "FP32", [1.0, 2.0])
    header.parameters["shared_memory_region"].string_param = "out"
    header.parameters["shared_memory_byte_size"].int64_param = 8
    response.outputs.append(header)
    response.raw_output_contents.append(b"")
    content, length = response_body(response, {"y": True}, True)
    assert length is None
    (entry,) = json.loads(content)["outputs"]
    assert entry == {"name": "y", "datatype": "FP32", "shape": [2]}


# --- generate_request -----------------------------------------------------------------------------
def refused_generate(document: Any, model: str, *words: str) -> str:
    return refused(lambda: generate_request(document, SIGNATURES[model], model, ""), *words)


def image_size(model: str) -> int:
    spec = SIGNATURES[model].input_form("image", "UINT8")
    assert spec is not None
    return spec.dims[0]


GENERATE_RESERVED = ("id", "parameters", "text", "target_language", "target_prefix")
GENERATE_RESERVED += ("bad_words", "stop", "image", "prefix", "pixel_values")


@FAST
@given(
    st.text(max_size=20),
    st.none() | st.text(max_size=4),
    st.none() | st.text(max_size=8),
    st.none() | st.lists(st.text(max_size=6), max_size=4),
    st.none() | st.lists(st.text(max_size=6), max_size=4),
    st.none() | st.text(max_size=8),
    parameter_dicts(*GENERATE_RESERVED),
    st.none() | parameter_dicts(),
)
def test_generate_request_of_the_translator(
    text: str,
    language: str | None,
    prefix: str | None,
    bad_words: list[str] | None,
    stop: list[str] | None,
    request_id: str | None,
    extra: dict[str, Any],
    nested: dict[str, Any] | None,
) -> None:
    document: dict[str, Any] = {"text": text}
    expected = pb.ModelInferRequest(model_name="translator", model_version="3")
    expected.inputs.add(name="text", datatype=BYTES, shape=[1])
    expected.raw_input_contents.append(encode_bytes([text]))
    for name, value in (("target_language", language), ("target_prefix", prefix)):
        if value is not None:
            document[name] = value
            expected.inputs.add(name=name, datatype=BYTES, shape=[1])
            expected.raw_input_contents.append(encode_bytes([value]))
    for name, words in (("bad_words", bad_words), ("stop", stop)):
        if words is not None:
            document[name] = words
            expected.inputs.add(name=name, datatype=BYTES, shape=[len(words)])
            expected.raw_input_contents.append(encode_bytes(words))
    document.update(extra)
    if request_id is not None:
        document["id"] = request_id
        expected.id = request_id
    if nested is not None:
        document["parameters"] = nested
    set_parameters(expected.parameters, {**extra, **(nested or {})})  # the object's win
    request = generate_request(document, SIGNATURES["translator"], "translator", "3")
    assert request == expected


@FEW
@given(st.sampled_from(["vit", "captioner"]), st.integers(0, 2**32 - 1))
def test_generate_request_nested_image(model: str, seed: int) -> None:
    size = image_size(model)
    image = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    document = {"image": image.tolist(), "max_new_tokens": 4}
    request = generate_request(document, SIGNATURES[model], model, "1")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
        "image",
        "UINT8",
        [1, size, size, 3],
    )
    assert list(request.raw_input_contents) == [image.tobytes()]
    assert parameters_json(request.parameters) == {"max_new_tokens": 4}


@FEW
@given(st.integers(0, 2**32 - 1))
def test_generate_request_nested_pixels(seed: int) -> None:
    size = image_size("vit")
    pixels = np.random.default_rng(seed).standard_normal((3, size, size)).astype(np.float32)
    request = generate_request({"pixel_values": pixels.tolist()}, SIGNATURES["vit"], "vit", "")
    (tensor,) = request.inputs
    assert (tensor.datatype, list(tensor.shape)) == ("FP32", [1, 3, size, size])
    assert request.raw_input_contents[0] == pixels.tobytes()


@pytest.mark.parametrize("model", ["vit", "captioner"])
def test_generate_request_encoded_image_is_bytes(model: str) -> None:
    request = generate_request({"image": "iVBORw0KGgo="}, SIGNATURES[model], model, "")
    (tensor,) = request.inputs
    assert (tensor.datatype, list(tensor.shape)) == (BYTES, [1])
    assert request.raw_input_contents[0] == encode_bytes(["iVBORw0KGgo="])


def test_generate_request_captioner_prefix_and_words() -> None:
    document = {"image": "x", "prefix": "a cat", "stop": ["."], "bad_words": []}
    request = generate_request(document, SIGNATURES["captioner"], "captioner", "")
    shapes = {t.name: (t.datatype, list(t.shape)) for t in request.inputs}
    assert shapes == {
        "image": (BYTES, [1]),
        "prefix": (BYTES, [1]),
        "stop": (BYTES, [1]),
        "bad_words": (BYTES, [0]),
    }
    assert list(request.raw_input_contents) == [
        encode_bytes(["x"]),
        encode_bytes(["a cat"]),
        encode_bytes(["."]),
        b"",
    ]


def test_generate_request_parameter_kinds() -> None:
    document = {
        "text": "hi",
        "max_new_tokens": 16,
        "temperature": 0.5,
        "do_sample": True,
        "seed": 2**64 - 1,
        "finish": "eos",
        "parameters": {"top_k": 5, "max_new_tokens": 8},
    }
    request = generate_request(document, SIGNATURES["translator"], "translator", "")
    kinds = {k: p.WhichOneof("parameter_choice") for k, p in request.parameters.items()}
    assert kinds == {
        "max_new_tokens": "int64_param",
        "temperature": "double_param",
        "do_sample": "bool_param",
        "seed": "uint64_param",
        "finish": "string_param",
        "top_k": "int64_param",
    }
    assert parameters_json(request.parameters)["max_new_tokens"] == 8


@pytest.mark.parametrize("document", [[], "hello", None, 3, [{"text": "a"}]])
def test_generate_request_refuses_a_non_object(document: Any) -> None:
    refused_generate(document, "translator", "one JSON object")


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        ("translator", "bad_words, stop, target, target_language, target_prefix, text"),
        ("vit", "image, pixel_values"),
        ("captioner", "bad_words, image, prefix, stop, target"),
    ],
)
def test_generate_request_refuses_a_body_naming_no_input(model: str, inputs: str) -> None:
    for document in ({}, {"id": "a", "max_new_tokens": 3}, {"parameters": {"text": "x"}}):
        refused_generate(document, model, "names none of model", repr(model), inputs)


@pytest.mark.parametrize(
    ("model", "document", "words"),
    [
        ("translator", {"text": ["a", "b"]}, ("input 'text' must be a string",)),
        ("translator", {"text": "a", "target_language": ["fr"]}, ("'target_language'",)),
        ("captioner", {"image": "x", "prefix": ["a"]}, ("input 'prefix' must be a string",)),
        ("translator", {"text": 3}, ("input 'text' must be a string",)),
        ("translator", {"text": None}, ("input 'text' must be a string",)),
        ("translator", {"text": "a", "stop": [1]}, ("'stop'", "array of strings")),
        ("translator", {"text": "a", "bad_words": "x", "stop": {}}, ("'stop'", "array of")),
        ("translator", {"text": "a", "id": 3}, ('"id" must be a string',)),
        ("translator", {"text": "a", "parameters": []}, ('"parameters"', "JSON object")),
        ("translator", {"text": "a", "parameters": {"p": [1]}}, ("parameter 'p'",)),
        ("translator", {"text": "a", "p": None}, ("request parameter 'p' is null",)),
        ("vit", {"image": {"a": 1}}, ("input 'image' must be a string",)),
        ("vit", {"image": [[[256]]]}, ("input 'image' is UINT8", "within 0..255")),
        ("vit", {"image": [["a"]]}, ("input 'image' is UINT8", "integers only")),
        ("vit", {"pixel_values": "abc"}, ("input 'pixel_values' is FP32", "numbers only")),
        ("vit", {"pixel_values": True}, ("input 'pixel_values' is FP32",)),
    ],
)
def test_generate_request_refuses_bad_inputs(
    model: str, document: dict[str, Any], words: tuple[str, ...]
) -> None:
    refused_generate(document, model, *words)


@pytest.mark.parametrize(
    "document",
    [
        {"image": [[1, 2], [3]]},
        {"pixel_values": [[0.5], [0.5, 0.5]]},
        {"pixel_values": [0.5, [0.5]]},
        {"image": [[[1]], []]},
    ],
)
def test_generate_request_refuses_ragged_arrays(document: dict[str, Any]) -> None:
    # before 8aa079a: numpy's ValueError from np.shape, a 500
    refused_generate(document, "vit", "ragged", "send the elements flat")


def test_generate_request_refuses_lone_surrogates() -> None:
    # a generate body passes parse_json (the route's parser) first
    body = rb'{"text": "a", "stop": ["\udc00"]}'
    refused(lambda: parse_json(body), "the request body", "lone UTF-16 surrogate")
    document = json.loads(rb'{"text": "a", "k": "\ud800"}')
    refused_generate(document, "translator", "request parameter 'k'", "lone UTF-16 surrogate")


# --- generate_json --------------------------------------------------------------------------------
@st.composite
def generate_outputs(draw: st.DrawFn) -> tuple[str, str, np.ndarray]:
    shapes = st.sampled_from([(), (1,), (1, 1), (1, 3)]) | hnp.array_shapes(max_dims=1, max_side=4)
    shapes = shapes | hnp.array_shapes(min_dims=1, max_dims=1, min_side=0, max_side=0)
    datatype, array = draw(typed_tensors(shapes=shapes))
    name = draw(NAMES.filter(lambda n: n not in ("model_name", "model_version", "id")))
    return name, datatype, array


@FAST
@given(
    st.lists(generate_outputs(), max_size=3, unique_by=lambda o: o[0]),
    st.text(max_size=6),
    parameter_dicts(),
)
def test_generate_json(
    outputs: list[tuple[str, str, np.ndarray]], request_id: str, parameters: dict[str, Any]
) -> None:
    outputs = [o for o in outputs if o[0] != "parameters" or not parameters]
    response = pb.ModelInferResponse(model_name="translator", model_version="1", id=request_id)
    set_parameters(response.parameters, parameters)
    for name, datatype, array in outputs:
        header, raw = output_tensor(name, datatype, array)
        response.outputs.append(header)
        response.raw_output_contents.append(raw)
    document = json.loads(json.dumps(generate_json(response)))
    expected: dict[str, Any] = {"model_name": "translator", "model_version": "1"}
    if request_id:
        expected["id"] = request_id
    for name, datatype, array in outputs:
        values = list(array.reshape(-1)) if datatype == BYTES else array.reshape(-1).tolist()
        expected[name] = values[0] if array.ndim <= 1 and array.size == 1 else values
    if parameters:
        expected["parameters"] = parameters
    assert document == expected


def test_generate_json_of_a_translation() -> None:
    response = pb.ModelInferResponse(model_name="translator", model_version="1", id="q")
    for name, datatype, values in (
        ("translation", BYTES, ["trois cents"]),
        ("token_ids", "INT32", [[5, 6, 2]]),
        ("one_token", "INT32", [[7]]),
    ):
        header, raw = output_tensor(name, datatype, values)
        response.outputs.append(header)
        response.raw_output_contents.append(raw)
    response.parameters["finish_reason"].string_param = "eos"
    assert generate_json(response) == {
        "model_name": "translator",
        "model_version": "1",
        "id": "q",
        "translation": "trois cents",
        "token_ids": [5, 6, 2],
        "one_token": [7],
        "parameters": {"finish_reason": "eos"},
    }


# --- message_json ---------------------------------------------------------------------------------
F = FieldDescriptor
INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (INT64_MIN, INT64_MAX),
    F.TYPE_SINT64: (INT64_MIN, INT64_MAX),
    F.TYPE_SFIXED64: (INT64_MIN, INT64_MAX),
    F.TYPE_UINT64: (0, UINT64_MAX),
    F.TYPE_FIXED64: (0, UINT64_MAX),
}
INT64_TYPES = frozenset(
    {F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT64, F.TYPE_FIXED64}
)


def is_map(descriptor: FieldDescriptor) -> bool:
    message = descriptor.message_type
    return message is not None and message.GetOptions().map_entry


def is_repeated(descriptor: FieldDescriptor) -> bool:
    return bool(descriptor.is_repeated)


def scalar_values(descriptor: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = descriptor.type
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        return st.integers(low, high)
    if kind == F.TYPE_ENUM:
        numbers = [value.number for value in descriptor.enum_type.values]
        return st.sampled_from([*numbers, 97])  # 97: an unknown value of an open enum
    strategies: dict[int, st.SearchStrategy[Any]] = {
        F.TYPE_BOOL: st.booleans(),
        F.TYPE_STRING: st.text(max_size=6),
        F.TYPE_BYTES: st.binary(max_size=6),
        F.TYPE_DOUBLE: st.floats(allow_nan=False, allow_infinity=False),
        F.TYPE_FLOAT: st.floats(width=32, allow_nan=False, allow_infinity=False),
    }
    return strategies[kind]


def fill(data: st.DataObject, message: Message, depth: int) -> None:
    """Set a random subset of ``message``'s fields, nested messages ``depth`` levels down."""
    for descriptor in message.DESCRIPTOR.fields:
        if not data.draw(st.booleans()):
            continue
        value = getattr(message, descriptor.name)
        if is_map(descriptor):
            key_field = descriptor.message_type.fields_by_name["key"]
            value_field = descriptor.message_type.fields_by_name["value"]
            for key in data.draw(st.lists(scalar_values(key_field), max_size=2, unique=True)):
                if value_field.message_type is not None:
                    entry = value[key]  # creates the entry
                    if depth > 0:
                        fill(data, entry, depth - 1)
                else:
                    value[key] = data.draw(scalar_values(value_field))
        elif is_repeated(descriptor):
            if descriptor.message_type is not None:
                for _ in range(data.draw(st.integers(0, 2 if depth > 0 else 0))):
                    fill(data, value.add(), depth - 1)
            else:
                value.extend(data.draw(st.lists(scalar_values(descriptor), max_size=3)))
        elif descriptor.message_type is not None:
            value.SetInParent()
            if depth > 0:
                fill(data, value, depth - 1)
        else:
            setattr(message, descriptor.name, data.draw(scalar_values(descriptor)))


def _normal_scalar(descriptor: FieldDescriptor, value: Any) -> Any:
    if descriptor.message_type is not None:
        return normalised(value, descriptor.message_type)
    if descriptor.type in INT64_TYPES:
        assert isinstance(value, str)  # json_format's form: a 64-bit integer as a string
        return int(value)
    if descriptor.type == F.TYPE_FLOAT:  # json_format: the shortest text that round-trips
        return float(np.float32(value))
    return value


def normalised(document: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """``MessageToDict``'s JSON with 64-bit integers as ints (Triton's REST form)."""
    result: dict[str, Any] = {}
    for name, value in document.items():
        field_descriptor = descriptor.fields_by_name[name]
        if is_map(field_descriptor):
            value_field = field_descriptor.message_type.fields_by_name["value"]
            result[name] = {k: _normal_scalar(value_field, v) for k, v in value.items()}
        elif is_repeated(field_descriptor):
            result[name] = [_normal_scalar(field_descriptor, v) for v in value]
        else:
            result[name] = _normal_scalar(field_descriptor, value)
    return result


def triton_json(message: Message) -> dict[str, Any]:
    document = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return normalised(document, message.DESCRIPTOR)


MESSAGE_TYPES: list[type[Message]] = [
    pb.ModelMetadataResponse,
    pb.ModelStatisticsResponse,
    pb.ModelConfig,
    pb.ModelConfigResponse,
    pb.RepositoryIndexResponse,
    pb.ServerMetadataResponse,
    pb.ModelInferResponse,
]


@MANY
@given(st.data(), st.sampled_from(MESSAGE_TYPES))
def test_message_json_is_json_format_with_integers(
    data: st.DataObject, message_type: type[Message]
) -> None:
    message = message_type()
    fill(data, message, depth=3)
    document = message_json(message)
    assert document == triton_json(message)
    assert json.loads(json.dumps(document)) == document


def test_message_json_writes_64_bit_integers_as_numbers() -> None:
    metadata = pb.ModelMetadataResponse(name="vit", versions=["1"], platform="onnxruntime_onnx")
    metadata.inputs.add(name="image", datatype="UINT8", shape=[-1, 2**40, 3])
    document = message_json(metadata)
    assert document == {
        "name": "vit",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, 2**40, 3]}],
        "outputs": [],
    }
    stats = pb.ModelStatisticsResponse()
    model = stats.model_stats.add(name="m", inference_count=2**63 - 1)
    model.inference_stats.success.count = UINT64_MAX
    document = message_json(stats)["model_stats"][0]
    assert document["inference_count"] == 2**63 - 1
    assert document["inference_stats"]["success"] == {"count": UINT64_MAX, "ns": 0}
    assert document["execution_count"] == 0  # defaults are written


def test_message_json_leaves_out_unset_messages_and_oneofs() -> None:
    config = message_json(pb.ModelConfig(name="m"))
    assert config["name"] == "m" and config["max_batch_size"] == 0 and config["input"] == []
    for absent in ("version_policy", "dynamic_batching", "model_transaction_policy"):
        assert absent not in config
    assert message_json(pb.InferParameter()) == {}
    assert message_json(pb.InferParameter(int64_param=0)) == {"int64_param": 0}
    set_config = pb.ModelConfig(name="m")
    set_config.dynamic_batching.SetInParent()
    assert "dynamic_batching" in message_json(set_config)
    assert message_json(pb.ModelConfigResponse()) == {}


def test_message_json_writes_enums_by_name_and_bytes_as_base64() -> None:
    config = pb.ModelConfig()
    config.input.add(name="x", data_type=pb.TYPE_UINT8)
    assert message_json(config)["input"][0]["data_type"] == "TYPE_UINT8"
    response = pb.ModelInferResponse(raw_output_contents=[b"\x00\xff", b"\xfb\xff\xbf", b""])
    assert message_json(response)["raw_output_contents"] == ["AP8=", "+/+/", ""]  # standard


@pytest.mark.parametrize(("datatype", "value"), [("FP16", 70000), ("FP32", 1e300), ("FP16", 1e5)])
def test_finite_values_past_a_float_type_are_refused(datatype: str, value: float) -> None:
    refused(lambda: json_data([1.0, value], datatype, (2,), WHAT), WHAT, "too large")


@pytest.mark.parametrize("header", ["+3", " 3 ", "1_0", "٣"])
def test_header_length_is_plain_digits(header: str) -> None:
    with pytest.raises(InvalidArgument, match="Inference-Header-Content-Length"):
        split_body(b'{"inputs": []}', header)
