"""Fuzzing KServe v2 ModelInfer and ModelStreamInfer: any model, input names, datatypes,
shapes, raw or typed data (broken BYTES length prefixes), parameters and requested outputs;
inputs and outputs in system shared memory (a registered region of random bytes, or none)."""

from __future__ import annotations

import collections
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.kserve.tensors import DATATYPES, NUMERIC_DTYPES, encode_bytes
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from tests.reliability.fuzz.checker import (
    ALLOWED,
    Fuzz,
    budget,
    carried_outputs,
    check_stream_response,
)
from tests.reliability.fuzz.strategies import (
    EDGE_FLOATS,
    IMAGE_POOL,
    int32s,
    model_names,
    small_ints,
    versions,
)

INPUT_NAMES = [
    "text",
    "target_language",
    "target_prefix",
    "prefix",
    "bad_words",
    "stop",
    "image",
    "pixel_values",
    "caption",
    "probabilities",
    "",
]
BAD_DATATYPES = ["BF16", "fp32", "", "STRING", "FP8", "INT128", "bytes"]
OPTION_NAMES = [
    "max_new_tokens",
    "min_new_tokens",
    "beam_size",
    "length_penalty",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "timeout",
    "priority",
    "target_language",
    "classification",
    "num_alternatives",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "return_log_probs",
    "bogus",
]
REGION = "fuzz"  # registered on the fuzzed server: REGION_BYTES random bytes
REGION_BYTES = 64 * 1024
REGION_NAMES = [REGION, REGION, "nope", ""]
SHM_SIZES = st.one_of(st.integers(0, REGION_BYTES), st.sampled_from([-1, 2**40, 2**63 - 1]))
dims = st.one_of(
    st.integers(0, 4),
    st.sampled_from([-1, -(2**63), 3, 32, 48, 2**31, 2**40, 2**63 - 1]),
)
shapes_st = st.one_of(
    st.lists(dims, max_size=5),
    st.sampled_from([[1], [2], [1, 1], [2, 1], [1, 3, 32, 32], [2, 3, 32, 32], [1, 3, 48, 48]]),
    st.lists(st.just(1), min_size=33, max_size=40),  # too many dimensions
)


@st.composite
def parameters(draw: st.DrawFn) -> dict[str, kpb.InferParameter]:
    chosen = draw(st.lists(st.sampled_from(OPTION_NAMES), max_size=4, unique=True))
    result = {}
    for name in chosen:
        kind = draw(st.sampled_from(["bool", "int64", "uint64", "double", "string"]))
        if kind == "bool":
            value: Any = draw(st.booleans())
        elif kind == "int64":
            value = draw(st.one_of(small_ints, st.integers(-(2**63), 2**63 - 1)))
        elif kind == "uint64":
            value = draw(st.one_of(small_ints.filter(lambda v: v >= 0), st.integers(0, 2**64 - 1)))
        elif kind == "double":
            value = draw(st.one_of(st.sampled_from(EDGE_FLOATS), st.floats()))
        else:
            value = draw(
                st.one_of(
                    st.sampled_from(["de", "fr", "1", " 7 ", "nan", "inf", "1e400", "-1", "0x10"]),
                    st.text(max_size=10),
                )
            )
        result[name] = kpb.InferParameter(**{f"{kind}_param": value})
    return result


@st.composite
def bytes_data(draw: st.DrawFn, count: int) -> bytes:
    """BYTES raw data for ``count`` elements, often with broken length prefixes."""
    elements = draw(
        st.lists(
            st.one_of(
                st.sampled_from(
                    [b"three hundred", b"doce", b"", b"\xff\xfe", b"de", b"xx", IMAGE_POOL[2]]
                ),
                st.sampled_from(IMAGE_POOL),
                st.binary(max_size=40),
            ),
            min_size=min(count, 3),
            max_size=min(count, 3),
        )
    )
    data = bytearray(encode_bytes(elements))
    breakage = draw(st.sampled_from(["none", "none", "cut", "prefix", "junk", "huge"]))
    if breakage == "cut" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif breakage == "prefix" and len(data) >= 4:
        data[0:4] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
    elif breakage == "junk":
        data += draw(st.binary(min_size=1, max_size=7))
    elif breakage == "huge":
        data += struct.pack("<I", 2**32 - 1) + b"abc"
    return bytes(data)


@st.composite
def numeric_data(draw: st.DrawFn, datatype: str, count: int) -> bytes:
    """Raw numeric data of the right length (often) or a wrong one; values may be NaN / inf."""
    itemsize = NUMERIC_DTYPES[datatype].itemsize
    length = count * itemsize if count * itemsize <= 64 * 1024 else 0
    choice = draw(st.sampled_from(["exact", "exact", "short", "long", "empty"]))
    if choice == "short":
        length = max(0, length - draw(st.integers(1, itemsize + 3)))
    elif choice == "long":
        length += draw(st.integers(1, 9))
    elif choice == "empty":
        length = 0
    if datatype in ("FP32", "FP16", "FP64") and choice == "exact" and draw(st.booleans()):
        values = np.random.default_rng(draw(st.integers(0, 99))).normal(size=length // itemsize)
        specials = draw(st.sampled_from([None, math.nan, math.inf, -math.inf, 1e38]))
        if specials is not None and values.size:
            values[draw(st.integers(0, values.size - 1))] = specials
        with np.errstate(over="ignore"):  # 1e38 as FP16 is inf: fine, that is a case too
            return values.astype(NUMERIC_DTYPES[datatype]).tobytes()
    return draw(st.binary(min_size=length, max_size=length))


@st.composite
def shared_memory(draw: st.DrawFn) -> dict[str, kpb.InferParameter]:
    """A tensor's shared memory parameters: the registered region or none, any size, offset and
    parameter types, sometimes one left out."""
    region = draw(st.sampled_from(REGION_NAMES))
    params = {
        "shared_memory_region": kpb.InferParameter(string_param=region),
        "shared_memory_byte_size": kpb.InferParameter(int64_param=draw(SHM_SIZES)),
    }
    if draw(st.booleans()):
        params["shared_memory_offset"] = kpb.InferParameter(int64_param=draw(SHM_SIZES))
    if draw(st.integers(0, 5)) == 0:
        del params[draw(st.sampled_from(sorted(params)))]
    if draw(st.integers(0, 5)) == 0:
        params["shared_memory_byte_size"] = kpb.InferParameter(string_param="12")
    return params


@st.composite
def infer_requests(draw: st.DrawFn, deep: bool = False) -> kpb.ModelInferRequest:
    """A ModelInferRequest: any model, inputs of any name / datatype / shape / data, parameters,
    requested outputs. ``deep``: real models and input names, so validation goes further."""
    models = st.sampled_from(["translator", "captioner", "vit"])
    request = kpb.ModelInferRequest(
        model_name=draw(models if deep else st.one_of(models, model_names)),
        model_version=draw(st.just("") if deep else st.one_of(st.just(""), versions)),
        id=draw(st.text(max_size=8)),
    )
    raw = draw(st.booleans()) if not deep else draw(st.sampled_from([True, True, False]))
    names = (
        st.sampled_from(INPUT_NAMES[:4])
        if deep
        else st.one_of(st.sampled_from(INPUT_NAMES), st.text(max_size=6))
    )
    for _ in range(draw(st.integers(0 if not deep else 1, 3))):
        name = draw(names)
        datatype = draw(
            st.one_of(st.sampled_from(["BYTES", "FP32", "FP16"]), st.sampled_from(DATATYPES))
            if deep
            else st.one_of(st.sampled_from(DATATYPES), st.sampled_from(BAD_DATATYPES))
        )
        shape = draw(shapes_st)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        count = math.prod(shape) if all(d >= 0 for d in shape) else 1
        count = count if count <= 16384 else 1
        if datatype == "BYTES":
            data = draw(bytes_data(count))
        elif datatype in NUMERIC_DTYPES:
            data = draw(numeric_data(datatype, count))
        else:
            data = draw(st.binary(max_size=16))
        if draw(st.integers(0, 4)) == 0:  # in shared memory instead
            for key, value in draw(shared_memory()).items():
                tensor.parameters[key].CopyFrom(value)
        elif raw:
            request.raw_input_contents.append(data)
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                draw(st.lists(st.sampled_from([b"doce", b"", IMAGE_POOL[1], b"\xff"]), max_size=3))
            )
        elif datatype in ("FP32", "FP64"):
            tensor.contents.fp32_contents.extend(
                draw(st.lists(st.floats(width=32), max_size=8))
                if not draw(st.booleans())
                else [0.0] * min(count, 4096)
            )
        elif datatype in NUMERIC_DTYPES:
            tensor.contents.int_contents.extend(draw(st.lists(int32s, max_size=4)))
    if raw and draw(st.integers(0, 9)) == 0:  # one raw entry too many or too few
        if request.raw_input_contents and draw(st.booleans()):
            del request.raw_input_contents[-1]
        else:
            request.raw_input_contents.append(b"\x00" * 4)
    for key, value in draw(parameters()).items():
        request.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(
            name=draw(
                st.sampled_from(
                    ["probabilities", "label", "translation", "caption", "token_ids", "x"]
                )
            )
        )
        if draw(st.booleans()):
            output.parameters["classification"].CopyFrom(
                kpb.InferParameter(int64_param=draw(small_ints))
            )
        if draw(st.integers(0, 3)) == 0:
            for key, value in draw(shared_memory()).items():
                output.parameters[key].CopyFrom(value)
    return request


def kserve_allowed(request: kpb.ModelInferRequest) -> set[grpc.StatusCode]:
    allowed = set(ALLOWED)
    if "timeout" in request.parameters:  # a tiny Triton timeout may legitimately expire
        allowed.add(grpc.StatusCode.DEADLINE_EXCEEDED)
    return allowed


def check_infer_response(request: kpb.ModelInferRequest, response: kpb.ModelInferResponse) -> None:
    """Well-formed outputs; one written to shared memory has an empty raw entry and fits."""
    wanted = [o.name for o in request.outputs]
    if wanted:
        assert [o.name for o in response.outputs] == wanted
    assert response.id == request.id and response.outputs
    asked = {o.name: o.parameters for o in request.outputs}
    for output in response.outputs:
        if "shared_memory_region" in output.parameters:
            written = output.parameters["shared_memory_byte_size"].int64_param
            assert written <= asked[output.name]["shared_memory_byte_size"].int64_param
    carried_outputs(response)


@pytest.fixture(scope="module")
def shm_object() -> Iterator[str]:
    """The object behind the registered region: random bytes in /dev/shm."""
    key = f"attnserve-fuzz-{os.getpid()}"
    path = Path("/dev/shm", key)
    path.write_bytes(np.random.default_rng(0).bytes(REGION_BYTES))
    yield "/" + key
    path.unlink(missing_ok=True)


def register_region(fuzz: Fuzz, key: str) -> None:
    """Register REGION on the fuzzed server (once per server; a second time is no error)."""
    request = kpb.SystemSharedMemoryRegisterRequest(name=REGION, key=key, byte_size=REGION_BYTES)
    try:
        fuzz.kserve.SystemSharedMemoryRegister(request, timeout=30)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err


def test_fuzz_kserve_infer(fuzz: Fuzz, shm_object: str) -> None:
    register_region(fuzz, shm_object)

    @budget("kserve_infer")
    @given(request=infer_requests())
    def run(request: kpb.ModelInferRequest) -> None:
        code, details, result = fuzz.call(lambda t: fuzz.kserve.ModelInfer(request, timeout=t))
        fuzz.check("kserve_infer", code, details, kserve_allowed(request), what=request)
        if code == grpc.StatusCode.OK:
            check_infer_response(request, result)

    run()
    fuzz.assert_still_correct()


def test_fuzz_kserve_tensors(fuzz: Fuzz, shm_object: str) -> None:
    """Real models and input names with wrong datatypes, shapes, byte lengths and BYTES data."""
    register_region(fuzz, shm_object)

    @budget("kserve_tensors")
    @given(request=infer_requests(deep=True))
    def run(request: kpb.ModelInferRequest) -> None:
        code, details, result = fuzz.call(lambda t: fuzz.kserve.ModelInfer(request, timeout=t))
        fuzz.check("kserve_tensors", code, details, kserve_allowed(request), what=request)
        if code == grpc.StatusCode.OK:
            check_infer_response(request, result)

    run()
    fuzz.assert_still_correct()


def test_fuzz_kserve_stream(fuzz: Fuzz, shm_object: str) -> None:
    register_region(fuzz, shm_object)

    @budget("kserve_stream")
    @given(requests=st.lists(st.one_of(infer_requests(), infer_requests(deep=True)), max_size=4))
    def run(requests: list[kpb.ModelInferRequest]) -> None:
        code, details, result = fuzz.call(
            lambda t: list(fuzz.kserve.ModelStreamInfer(iter(requests), timeout=t))
        )
        fuzz.check("kserve_stream", code, details, what=requests)
        assert code == grpc.StatusCode.OK  # a failing request goes into error_message
        finals: collections.Counter[str] = collections.Counter()
        for response in result:
            check_stream_response(fuzz, response)
            parameters = response.infer_response.parameters
            if response.error_message or parameters["triton_final_response"].bool_param:
                finals[response.infer_response.id] += 1
        assert sum(finals.values()) == len(requests)  # exactly one final answer per request

    run()
    fuzz.assert_still_correct()
