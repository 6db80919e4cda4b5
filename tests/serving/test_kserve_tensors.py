"""The KServe tensor codec: BYTES framing, numeric tensors raw and typed, validation messages."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from serving.errors import InvalidArgument
from serving.kserve.tensors import (
    CONTENTS_FIELDS,
    NUMERIC_DTYPES,
    decode_bytes,
    decode_inputs,
    decode_outputs,
    decode_tensor,
    encode_bytes,
    input_tensor,
    output_tensor,
    raw_bytes,
    typed_contents,
)
from serving.proto_gen.inference import grpc_service_pb2 as pb

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


def numeric_arrays(datatype: str) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(NUMERIC_DTYPES[datatype], shapes)


# --- BYTES framing --------------------------------------------------------------------------------
@FAST
@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_round_trip(elements: list[bytes]) -> None:
    data = encode_bytes(elements)
    assert len(data) == sum(4 + len(e) for e in elements)
    assert decode_bytes(data) == elements
    assert decode_bytes(data, expected=len(elements)) == elements


def test_bytes_layout_is_tritons() -> None:
    assert encode_bytes([b"ab", "é", b""]) == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9" + bytes(
        4
    )


@FAST
@given(st.binary(max_size=64), st.none() | st.integers(0, 10))
def test_any_bytes_decode_or_raise_invalid_argument(data: bytes, expected: int | None) -> None:
    try:
        elements = decode_bytes(data, "input 'x'", expected)
    except InvalidArgument as err:
        assert "input 'x'" in str(err)
    else:
        assert encode_bytes(elements) == data


@FAST
@given(st.binary(max_size=64), shapes, st.sampled_from([*NUMERIC_DTYPES, "BYTES"]))
def test_any_raw_tensor_decodes_or_raises_invalid_argument(
    data: bytes, shape: tuple[int, ...], datatype: str
) -> None:
    try:
        tensor = decode_tensor("x", datatype, shape, raw=data)
    except InvalidArgument:
        return
    assert tensor.data.shape == shape


@FAST
@given(st.binary(max_size=200))
def test_any_parseable_request_decodes_or_raises_invalid_argument(data: bytes) -> None:
    request = pb.ModelInferRequest()
    try:
        request.ParseFromString(data)
    except Exception:  # not a message at all: the gRPC layer rejects it before us
        return
    with contextlib.suppress(InvalidArgument):
        decode_inputs(request)


def test_broken_prefixes_say_what_is_wrong() -> None:
    with pytest.raises(InvalidArgument, match=r"element 0 declares 5 bytes but only 2 follow"):
        decode_bytes(b"\x05\x00\x00\x00ab", "input 'text'")
    with pytest.raises(InvalidArgument, match=r"element 1 starts at byte 6 but only 2 bytes"):
        decode_bytes(b"\x02\x00\x00\x00ab\x01\x00", "input 'text'")
    with pytest.raises(InvalidArgument, match=r"has 1 BYTES elements .* shape needs 2"):
        decode_tensor("text", "BYTES", [2], raw=encode_bytes([b"a"]))
    with pytest.raises(InvalidArgument, match=r"more than 1 BYTES elements"):
        decode_tensor("text", "BYTES", [1], raw=encode_bytes([b"a", b"b"]))


def test_huge_declared_counts_fail_fast() -> None:
    with pytest.raises(InvalidArgument, match="shape needs"):
        decode_tensor("x", "BYTES", [2**30], raw=encode_bytes([b""] * 3))
    with pytest.raises(InvalidArgument, match="at most"):
        decode_tensor("x", "FP32", [0, 2**40], raw=b"")
    with pytest.raises(InvalidArgument, match="dimensions"):
        decode_tensor("x", "FP32", [1] * 40, raw=b"\0\0\0\0")


# --- numeric tensors ------------------------------------------------------------------------------
@FAST
@given(
    st.sampled_from(sorted(NUMERIC_DTYPES)).flatmap(
        lambda t: st.tuples(st.just(t), numeric_arrays(t))
    )
)
def test_numeric_raw_round_trip(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    raw = raw_bytes(datatype, array)
    assert len(raw) == array.size * NUMERIC_DTYPES[datatype].itemsize
    decoded = decode_tensor("x", datatype, array.shape, raw=raw).data
    assert decoded.shape == array.shape and decoded.dtype == NUMERIC_DTYPES[datatype]
    np.testing.assert_array_equal(decoded, array)


@FAST
@given(
    st.sampled_from(sorted(t for t in NUMERIC_DTYPES if t in CONTENTS_FIELDS)).flatmap(
        lambda t: st.tuples(st.just(t), numeric_arrays(t))
    )
)
def test_numeric_typed_contents_round_trip(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    contents = typed_contents(datatype, array)
    decoded = decode_tensor("x", datatype, array.shape, contents=contents).data
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@FAST
@given(hnp.arrays(object, shapes, elements=st.binary(max_size=8)), st.booleans())
def test_bytes_tensor_round_trip_through_request_and_response(array: np.ndarray, raw: bool) -> None:
    tensor, data = input_tensor("t", "BYTES", array, raw=raw)
    request = pb.ModelInferRequest(inputs=[tensor], raw_input_contents=[data] if raw else [])
    decoded = decode_inputs(request)["t"]
    assert decoded.shape == array.shape and decoded.data.tolist() == array.tolist()
    header, out = output_tensor("t", "BYTES", array)
    response = pb.ModelInferResponse(outputs=[header], raw_output_contents=[out])
    assert decode_outputs(response)["t"].tolist() == array.tolist()


def test_little_endian_layout() -> None:
    assert raw_bytes("INT32", [1, -2]) == struct.pack("<ii", 1, -2)
    assert raw_bytes("FP16", [1.0]) == np.float16(1.0).tobytes()
    assert decode_tensor("b", "BOOL", [3], raw=b"\x00\x01\x07").data.tolist() == [False, True, True]


# --- validation messages --------------------------------------------------------------------------
def test_raw_length_mismatch_message() -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_tensor("pixel_values", "FP32", [1, 3, 32, 32], raw=bytes(3072))
    assert str(err.value) == (
        "input 'pixel_values' has 3072 bytes of raw data but shape [1,3,32,32] FP32 needs 12288"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"datatype": "FLOAT32", "raw": b""}, r"datatype 'FLOAT32'; use one of BOOL"),
        ({"datatype": "BF16", "raw": b""}, r"BF16, which this server does not decode"),
        ({"shape": [-1, 2], "raw": b""}, r"shape \[-1,2\]; every dimension must be the actual"),
        (
            {"contents": pb.InferTensorContents(int64_contents=[1, 2])},
            r"is FP32 but its data is "
            r"in contents.int64_contents; use contents.fp32_contents",
        ),
        (
            {"contents": pb.InferTensorContents(fp32_contents=[1.0])},
            r"1 values in "
            r"contents.fp32_contents but shape \[2\] needs 2",
        ),
        (
            {"raw": bytes(8), "contents": pb.InferTensorContents(fp32_contents=[1.0, 2.0])},
            "both raw data and typed contents",
        ),
        ({}, r"no data: send its 2 elements in raw_input_contents"),
        (
            {"datatype": "FP16", "contents": pb.InferTensorContents(fp32_contents=[1.0, 2.0])},
            "FP16, which has no typed field: send it raw",
        ),
        (
            {"datatype": "INT8", "contents": pb.InferTensorContents(int_contents=[1, 300])},
            r"outside -128..127",
        ),
    ],
)
def test_tensor_errors(kwargs: dict, message: str) -> None:
    args = {"name": "x", "datatype": "FP32", "shape": [2], **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        decode_tensor(**args)


def test_request_level_errors() -> None:
    a, raw_a = input_tensor("a", "FP32", np.zeros(2, np.float32))
    b, _ = input_tensor("b", "FP32", np.zeros(2, np.float32), raw=False)
    with pytest.raises(InvalidArgument, match="2 inputs but 1 raw_input_contents"):
        decode_inputs(pb.ModelInferRequest(inputs=[a, a], raw_input_contents=[raw_a]))
    with pytest.raises(InvalidArgument, match="input 'b' sets contents while the request uses raw"):
        decode_inputs(pb.ModelInferRequest(inputs=[a, b], raw_input_contents=[raw_a, raw_a]))
    with pytest.raises(InvalidArgument, match="sent twice"):
        decode_inputs(pb.ModelInferRequest(inputs=[a, a], raw_input_contents=[raw_a, raw_a]))
    nameless = pb.ModelInferRequest.InferInputTensor(datatype="FP32", shape=[0])
    with pytest.raises(InvalidArgument, match="input 0 has no name"):
        decode_inputs(pb.ModelInferRequest(inputs=[nameless]))


# --- compatibility with tritonclient's own codec --------------------------------------------------
@FAST
@given(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=10))
def test_matches_tritonclient_bytes_codec(elements: list[bytes]) -> None:
    utils = pytest.importorskip("tritonclient.utils", reason="tritonclient is not installed")
    array = np.array(elements, dtype=object)
    assert utils.serialize_byte_tensor(array).item() == encode_bytes(elements)
    assert utils.deserialize_bytes_tensor(encode_bytes(elements)).tolist() == elements


def test_decodes_a_tritonclient_request() -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed")
    from tritonclient.grpc import _utils

    pixels = grpcclient.InferInput("pixel_values", [1, 3, 2, 2], "FP32")
    pixels.set_data_from_numpy(np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2))
    text = grpcclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"three", "zwölf".encode()], dtype=object))
    theirs = _utils._get_inference_request(
        "m", [pixels, text], "", "", None, 0, False, False, 0, None, {"target_language": "de"}
    )
    ours = pb.ModelInferRequest.FromString(theirs.SerializeToString())
    inputs = decode_inputs(ours)
    assert inputs["pixel_values"].data.reshape(-1).tolist() == list(range(12))
    assert inputs["text"].data.tolist() == [b"three", "zwölf".encode()]
    assert ours.parameters["target_language"].string_param == "de"
