"""Request parameters: typed values, decoding options, Triton's ``timeout`` and ``priority``."""

from __future__ import annotations

from typing import Any

from serving.errors import InvalidArgument
from serving.generation.options import DecodingOptions
from serving.proto_gen.inference import grpc_service_pb2 as pb

INT_OPTIONS = (
    "max_new_tokens",
    "min_new_tokens",
    "beam_size",
    "top_k",
    "seed",
    "no_repeat_ngram_size",
    "num_alternatives",
    "top_log_probs",
)
FLOAT_OPTIONS = ("length_penalty", "temperature", "top_p", "repetition_penalty")
BOOL_OPTIONS = ("return_log_probs",)


def _param_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def int_parameter(name: str, parameter: pb.InferParameter) -> int:
    """An integer request parameter (int64 / uint64, or a string holding an integer)."""
    value = _param_value(parameter)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidArgument(f"parameter {name!r} must be an integer (int64_param), got {value!r}")


def float_parameter(name: str, parameter: pb.InferParameter) -> float:
    """A real request parameter (double / int64 / uint64, or a numeric string)."""
    value = _param_value(parameter)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise InvalidArgument(f"parameter {name!r} must be a number (double_param), got {value!r}")


def bool_parameter(name: str, parameter: pb.InferParameter) -> bool:
    """A true / false request parameter (bool_param, or a string "true" / "false")."""
    value = _param_value(parameter)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, bool):
        return value
    raise InvalidArgument(f"parameter {name!r} must be true or false (bool_param), got {value!r}")


def string_parameter(name: str, parameter: pb.InferParameter) -> str:
    value = _param_value(parameter)
    if not isinstance(value, str):
        raise InvalidArgument(f"parameter {name!r} must be a string (string_param), got {value!r}")
    return value


def decoding_options(parameters: Any) -> DecodingOptions:
    """DecodingOptions from request parameters (absent ones keep their defaults)."""
    kwargs: dict[str, Any] = {}
    for name in INT_OPTIONS:
        if name in parameters:
            kwargs[name] = int_parameter(name, parameters[name])
    for name in FLOAT_OPTIONS:
        if name in parameters:
            kwargs[name] = float_parameter(name, parameters[name])
    for name in BOOL_OPTIONS:
        if name in parameters:
            kwargs[name] = bool_parameter(name, parameters[name])
    return DecodingOptions(**kwargs)


def request_timeout(request: pb.ModelInferRequest, deadline: float | None) -> float | None:
    """Seconds the request may take: the gRPC deadline and Triton's ``timeout`` (µs) parameter."""
    if "timeout" not in request.parameters:
        return deadline
    micros = int_parameter("timeout", request.parameters["timeout"])
    if micros < 0:
        raise InvalidArgument(f"parameter 'timeout' must be >= 0 microseconds, got {micros}")
    if micros == 0:  # Triton: 0 = no timeout
        return deadline
    return micros / 1e6 if deadline is None else min(deadline, micros / 1e6)


def request_priority(request: pb.ModelInferRequest) -> int:
    """Triton's ``priority`` parameter (1 highest; 0 or absent = the model's default level, as is
    a value above its levels); the batcher or the generator resolves it to a queue level."""
    if "priority" not in request.parameters:
        return 0
    priority = int_parameter("priority", request.parameters["priority"])
    if priority < 0:
        raise InvalidArgument(
            f"parameter 'priority' must be >= 0 (1 is the highest; 0 = the model's default), "
            f"got {priority}"
        )
    return priority
