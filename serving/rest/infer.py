"""KServe v2 REST inference bodies, with Triton's binary tensor data extension.

A request body is a JSON object, optionally followed by binary tensor data: the header
``Inference-Header-Content-Length`` gives the JSON part's length, and each input whose
parameters hold ``binary_data_size`` takes that many bytes of what follows, in input order.
The request becomes a ``ModelInferRequest`` (every input's data raw) served exactly as one sent
over gRPC; its response becomes JSON, with the outputs asked for as binary data (the output
parameter ``binary_data``, or the request parameter ``binary_data_output`` for all) after it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from serving.errors import InvalidArgument
from serving.kserve.tensors import check_datatype, check_shape, decode_tensor
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.rest.json_values import (
    array_json,
    json_data,
    parameter_value,
    parameters_from,
    parameters_json,
    utf8,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_SIZE = "binary_data_size"  # input / output parameter: its bytes in the binary part
BINARY_OUTPUT = "binary_data"  # requested output parameter: send it as binary data
ALL_BINARY = "binary_data_output"  # request parameter: every output as binary data
MAX_ID_CHARS = 1024
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff in a JSON string


@dataclass
class RestRequest:
    """A parsed inference request: the protobuf request and how its outputs go back."""

    message: pb.ModelInferRequest
    binary: dict[str, bool]  # requested output -> as binary data
    all_binary: bool  # binary_data_output


def parse_json(body: bytes, what: str = "request body") -> Any:
    """A body's JSON value: UTF-8 (RFC 8259), no lone surrogate escapes in its strings."""
    try:
        value = json.loads(body.decode())
    except UnicodeDecodeError:
        raise InvalidArgument(f"the {what} is not UTF-8; send JSON in UTF-8") from None
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"the {what} is not valid JSON ({err}); send a JSON object") from None
    except (ValueError, RecursionError):  # an integer of 4,300+ digits; nesting past Python's
        raise InvalidArgument(
            f"the {what} holds a number of thousands of digits or nests too deep; send "
            "values that fit their types"
        ) from None
    if SURROGATE_ESCAPE.search(body):  # rare: only then walk every string
        _check_text(value, f"the {what}")
    return value


def _check_text(value: Any, what: str) -> None:
    """Raise InvalidArgument where a string (or key) of ``value`` is no valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            utf8(item, what)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON part and the binary part of a body (``header_length``: the header's value)."""
    if header_length is None:
        return body, b""
    digits = header_length.isascii() and header_length.isdigit()
    length = int(header_length) if digits else -1
    if not 0 <= length <= len(body):
        raise InvalidArgument(
            f"{HEADER_LENGTH} is {header_length[:40]!r} for a body of {len(body)} bytes; it must "
            "be the length of the JSON part at the start of the body"
        )
    return body[:length], body[length:]


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else InvalidArgument naming ``what``."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return value


def _string(value: Any, what: str, limit: int = MAX_ID_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidArgument(f"{what} must be a string of at most {limit} characters")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise InvalidArgument(f"{what} shape must be an array of integers, e.g. [1, 3]")
    shape = tuple(value)
    check_shape(shape, what)
    return shape


def _input(
    entry: Any, index: int, binary: memoryview, offset: int
) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes | None, int]:
    """One ``inputs`` entry as a tensor header and its raw data (None: in shared memory);
    returns the new offset."""
    entry = json_object(entry, f"inputs[{index}]")
    name = _string(entry.get("name"), f"inputs[{index}].name", 256)
    what = f"input {name[:100]!r}"
    datatype = _string(entry.get("datatype"), f"{what} datatype", 40)
    check_datatype(datatype, what)
    shape = _shape(entry.get("shape"), what)
    parameters = parameters_from(entry.get("parameters"), what)
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    size_parameter = parameters.pop(BINARY_SIZE, None)
    for key, value in parameters.items():
        tensor.parameters[key].CopyFrom(value)
    if size_parameter is not None:
        size = parameter_int(size_parameter, f"{what} {BINARY_SIZE}")
        if "data" in entry:
            raise InvalidArgument(f"{what} has both data and {BINARY_SIZE}; send it one way")
        if offset + size > len(binary):
            raise InvalidArgument(
                f"{what} claims {size} bytes of binary data but only {len(binary) - offset} "
                f"remain after the JSON part; check {HEADER_LENGTH} and each {BINARY_SIZE}"
            )
        return tensor, bytes(binary[offset : offset + size]), offset + size
    if "data" in entry:
        return tensor, json_data(entry["data"], datatype, shape, what), offset
    if "shared_memory_region" in parameters:  # read from the region: no raw entry
        return tensor, None, offset
    raise InvalidArgument(
        f'{what} has no data: send its elements in "data", as binary data after the JSON part '
        f"({BINARY_SIZE}), or in a system shared memory region (shared_memory_region)"
    )


def parameter_int(parameter: pb.InferParameter, what: str) -> int:
    value = parameter_value(parameter)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{what} must be an integer >= 0, got {value!r}")
    return value


def _output(entry: Any, index: int) -> tuple[pb.ModelInferRequest.InferRequestedOutputTensor, Any]:
    """One ``outputs`` entry, and its ``binary_data`` parameter (None: not given)."""
    entry = json_object(entry, f"outputs[{index}]")
    name = _string(entry.get("name"), f"outputs[{index}].name", 256)
    parameters = parameters_from(entry.get("parameters"), f"output {name[:100]!r}")
    binary = parameters.pop(BINARY_OUTPUT, None)
    output = pb.ModelInferRequest.InferRequestedOutputTensor(name=name)
    for key, value in parameters.items():
        output.parameters[key].CopyFrom(value)
    return output, binary


def parse_infer(
    body: bytes, header_length: str | None, model_name: str, model_version: str
) -> RestRequest:
    """An ``/infer`` body as a ``ModelInferRequest`` for the model named by the URL."""
    json_part, binary_part = split_body(body, header_length)
    document = json_object(parse_json(json_part), "the request body")
    inputs = document.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidArgument(
            'the request needs "inputs": an array of {name, shape, datatype, data}'
        )
    request = pb.ModelInferRequest(model_name=model_name, model_version=model_version)
    if "id" in document:
        request.id = _string(document["id"], "id")
    parameters = parameters_from(document.get("parameters"), "request")
    all_binary = parameters.pop(ALL_BINARY, None)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    binary, offset = memoryview(binary_part), 0
    for index, entry in enumerate(inputs):
        tensor, raw, offset = _input(entry, index, binary, offset)
        request.inputs.append(tensor)
        if raw is not None:
            request.raw_input_contents.append(raw)
    if offset != len(binary):
        raise InvalidArgument(
            f"{len(binary) - offset} bytes of binary data follow the inputs' {BINARY_SIZE}s; "
            f"check {HEADER_LENGTH} and each {BINARY_SIZE}"
        )
    wanted: dict[str, bool] = {}
    outputs = document.get("outputs", [])
    if not isinstance(outputs, list):
        raise InvalidArgument('"outputs" must be an array of {name, parameters}')
    for index, entry in enumerate(outputs):
        output, as_binary = _output(entry, index)
        request.outputs.append(output)
        if as_binary is not None:
            wanted[output.name] = _bool(as_binary, f"output {output.name[:100]!r} {BINARY_OUTPUT}")
    every = _bool(all_binary, ALL_BINARY) if all_binary is not None else False
    return RestRequest(request, wanted, every)


def _bool(parameter: pb.InferParameter, what: str) -> bool:
    value = parameter_value(parameter)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be true or false, got {value!r}")
    return value


def response_body(
    response: pb.ModelInferResponse, binary: dict[str, bool], all_binary: bool
) -> tuple[bytes, int | None]:
    """A response as its body, and the JSON part's length where binary data follows."""
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = parameters_json(response.parameters)
    chunks: list[bytes] = []
    outputs = []
    for index, tensor in enumerate(response.outputs):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        parameters = parameters_json(tensor.parameters)
        raw = response.raw_output_contents[index]
        if "shared_memory_region" in parameters:
            # written into the client's region; as Triton's HTTP answer, no parameters (its C++
            # client reads any output parameters as binary data's)
            parameters = {}
        elif binary.get(tensor.name, all_binary):
            parameters[BINARY_SIZE] = len(raw)
            chunks.append(raw)
        else:
            array = decode_tensor(
                tensor.name, tensor.datatype, tensor.shape, raw=raw, role="output"
            ).data
            entry["data"] = array_json(array, tensor.datatype)
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    document["outputs"] = outputs
    head = json.dumps(document, ensure_ascii=False).encode()
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)
