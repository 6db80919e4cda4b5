"""Triton's generate extension: ``/generate`` and ``/generate_stream`` bodies.

A generate request is one flat JSON object for one element: each key that names one of the
model's inputs is that input (a string, a list of strings for the word lists, or an array of
numbers for pixels), ``id`` is the request id, and every other key (and the members of a
``parameters`` object) is a request parameter (``max_new_tokens``, ``temperature``, ...). A
response names each output as a key: a one-element output is its value (``"translation":
"trois cents"``), a longer one an array (``"token_ids": [...]``); the response's parameters
(a stream's ``finish_reason``, ...) come under ``parameters``.
"""

from __future__ import annotations

from typing import Any

from serving.errors import InvalidArgument
from serving.kserve.signature import Signature, TensorSpec
from serving.kserve.tensors import BYTES, decode_tensor, encode_bytes
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.rest.json_values import array_json, json_data, nested, parameters_json, to_parameter

RESERVED = ("id", "parameters")


def _bytes_input(spec: TensorSpec, value: Any) -> tuple[list[int], bytes]:
    """A string (or, for a word list, a list of strings) as a BYTES input's shape and data."""
    what = f"input {spec.name!r}"
    if isinstance(value, str):
        return [1], encode_bytes([value])
    if not spec.per_item and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [len(value)], encode_bytes(value)
    form = "a string" if spec.per_item else "a string or an array of strings"
    raise InvalidArgument(f"{what} must be {form} in a generate request")


def _input(
    signature: Signature, name: str, value: Any
) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes]:
    """One input of a generate request: its tensor header and raw data."""
    forms = [spec for spec in signature.accepted if spec.name == name]
    text = next((spec for spec in forms if BYTES in spec.datatypes), None)
    numeric = next((spec for spec in forms if BYTES not in spec.datatypes), None)
    if text is not None and (numeric is None or not isinstance(value, list)):
        shape, raw = _bytes_input(text, value)
        datatype = BYTES
    elif numeric is not None:
        datatype = numeric.datatype
        dims = list(nested(value, f"input {name!r}")[1]) if isinstance(value, list) else []
        shape = [1, *dims]
        raw = json_data(
            value if isinstance(value, list) else [value], datatype, tuple(shape), f"input {name!r}"
        )
    else:  # pragma: no cover - every accepted form is BYTES or numeric
        raise InvalidArgument(f"input {name!r} cannot be sent in a generate request")
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape), raw


def generate_request(
    document: Any, signature: Signature, model_name: str, model_version: str
) -> pb.ModelInferRequest:
    """A generate body as the ``ModelInferRequest`` of one element."""
    if not isinstance(document, dict):
        raise InvalidArgument(
            'a generate request is one JSON object, e.g. {"text": "...", "max_new_tokens": 16}'
        )
    request = pb.ModelInferRequest(model_name=model_name, model_version=model_version)
    names = {spec.name for spec in signature.accepted}
    if not names & document.keys():
        listed = ", ".join(sorted(names))
        raise InvalidArgument(
            f"the generate request names none of model {model_name!r}'s inputs; give them as "
            f"keys ({listed}), with parameters beside them"
        )
    extra = document.get("parameters", {})
    if not isinstance(extra, dict):
        raise InvalidArgument('"parameters" must be a JSON object')
    for key, value in document.items():
        if key == "id":
            if not isinstance(value, str):
                raise InvalidArgument('"id" must be a string')
            request.id = value
        elif key in names:
            tensor, raw = _input(signature, key, value)
            request.inputs.append(tensor)
            request.raw_input_contents.append(raw)
        elif key != "parameters":
            request.parameters[key].CopyFrom(to_parameter(key, value, "request"))
    for key, value in extra.items():
        request.parameters[key].CopyFrom(to_parameter(key, value, "request"))
    return request


def generate_json(response: pb.ModelInferResponse) -> dict[str, Any]:
    """A response of one element as a generate response object."""
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        document["id"] = response.id
    for index, tensor in enumerate(response.outputs):
        array = decode_tensor(
            tensor.name,
            tensor.datatype,
            tensor.shape,
            raw=response.raw_output_contents[index],
            role="output",
        ).data
        values = array_json(array, tensor.datatype)
        document[tensor.name] = values[0] if array.ndim <= 1 and len(values) == 1 else values
    if response.parameters:
        document["parameters"] = parameters_json(response.parameters)
    return document
