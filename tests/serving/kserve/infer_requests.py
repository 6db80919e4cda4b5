"""Requests and inputs of the KServe protocol tests: ModelInferRequests built from
(name, datatype, values) tensors, and MNIST-like digits for the ViT."""

from __future__ import annotations

from typing import Any

import numpy as np

from models.data import digits
from serving.kserve.tensors import input_tensor
from serving.proto_gen.inference import grpc_service_pb2 as pb

TIMEOUT = 30
LABELS = [str(i) for i in range(10)]


def digit_images(n: int) -> np.ndarray:
    images, _ = digits.load_digits_split("test")
    return images[:n]


def infer_request(
    model: str, *tensors: tuple[str, str, Any], raw: bool = True, **params: Any
) -> pb.ModelInferRequest:
    """A ModelInferRequest of (name, datatype, values) inputs and plain request parameters."""
    request = pb.ModelInferRequest(model_name=model, id="req-1")
    for name, datatype, values in tensors:
        tensor, data = input_tensor(name, datatype, values, raw=raw)
        request.inputs.append(tensor)
        if data is not None:
            request.raw_input_contents.append(data)
    for key, value in params.items():
        kinds = {str: "string_param", int: "int64_param", float: "double_param"}
        field = {**kinds, bool: "bool_param"}[type(value)]
        setattr(request.parameters[key], field, value)
    return request


def translate(texts: list[bytes], **params: Any) -> pb.ModelInferRequest:
    return infer_request("translator", ("text", "BYTES", texts), **params)
