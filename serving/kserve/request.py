"""One inference request checked against the model's signature, and its inputs decoded.

Every check raises a ``ServingError`` that names the tensor, element or parameter and what to
send instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from serving.errors import InvalidArgument, ServingError, TooLarge
from serving.kserve.parameters import (
    int_parameter,
    request_priority,
    request_timeout,
    string_parameter,
)
from serving.kserve.shared_memory import SharedMemoryRegions, Slice, shared_inputs, tensor_slice
from serving.kserve.signature import (
    ONE_PER_ITEM,
    PREFIX_INPUT,
    WORD_INPUTS,
    Signature,
    TensorSpec,
    max_batch,
    signature,
)
from serving.kserve.tensors import BYTES, Tensor, decode_inputs, format_shape
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedModel

T = TypeVar("T")
PIXEL_LIMIT = 1e4  # normalised pixels are within a few units; larger values overflow the model


@dataclass(frozen=True)
class Wanted:
    """A requested output: its name, Triton's ``classification`` top-k (0 = plain tensor) and
    the shared memory it is written to (None: the response carries it)."""

    name: str
    classification: int = 0
    shared: Slice | None = None


@dataclass(frozen=True)
class Call:
    """A validated inference request."""

    model: ServedModel
    request: pb.ModelInferRequest
    inputs: dict[str, Tensor]
    wanted: tuple[Wanted, ...]
    batch: int
    timeout_s: float | None
    regions: SharedMemoryRegions | None = None  # the server's, when the extension is on
    priority: int = 0  # Triton's priority parameter (0: the model's default level)


def _check_inputs(model: ServedModel, sig: Signature, inputs: dict[str, Tensor]) -> None:
    for tensor in inputs.values():
        what = f"input {tensor.name[:100]!r}"
        forms = [spec for spec in sig.accepted if spec.name == tensor.name]
        if not forms:
            known = ", ".join(s.describe() for s in sig.accepted)
            raise InvalidArgument(f"model {model.name!r} has no {what}; its inputs are: {known}")
        spec = sig.input_form(tensor.name, tensor.datatype)
        if spec is None:
            accepted = " or ".join(dict.fromkeys(d for s in forms for d in s.datatypes))
            raise InvalidArgument(f"{what} must be {accepted}, got {tensor.datatype}")
        _check_shape(tensor, spec, what)
    for spec in sig.inputs:
        if not spec.optional and spec.name not in inputs:
            named = " or ".join(s.describe() for s in sig.accepted if s.name == spec.name)
            raise InvalidArgument(f"input {named} is missing; send it")


def _check_shape(tensor: Tensor, spec: TensorSpec, what: str) -> None:
    shape = tensor.shape
    if spec.datatype == BYTES and spec.dims == ONE_PER_ITEM and len(shape) == 1:
        return  # one string per item sent as [N] instead of Triton's [N,1]
    ok = len(shape) == len(spec.shape) and all(
        want in (-1, got) for want, got in zip(spec.shape[1:], shape[1:], strict=True)
    )
    if not ok:
        raise InvalidArgument(
            f"{what} has shape {format_shape(shape)}; it must be {spec.shape_text()}"
            + (" or [N]" if spec.datatype == BYTES and spec.dims == ONE_PER_ITEM else "")
        )


def _requested_outputs(
    model: ServedModel,
    sig: Signature,
    request: pb.ModelInferRequest,
    regions: SharedMemoryRegions | None,
) -> tuple[Wanted, ...]:
    if not request.outputs:
        return tuple(Wanted(spec.name) for spec in sig.outputs)
    wanted: list[Wanted] = []
    for output in request.outputs:
        spec = sig.output(output.name)
        if spec is None:
            known = ", ".join(s.describe() for s in sig.outputs)
            raise InvalidArgument(
                f"model {model.name!r} has no output {output.name[:100]!r}; "
                f"its outputs are: {known}"
            )
        if any(w.name == output.name for w in wanted):
            raise InvalidArgument(f"output {output.name!r} is requested twice; ask once")
        top_k = 0
        if "classification" in output.parameters:
            top_k = int_parameter("classification", output.parameters["classification"])
            if top_k < 1 or spec.datatype == BYTES:
                raise InvalidArgument(
                    f"output {output.name!r}: classification must be >= 1 and only applies to "
                    "numeric outputs such as 'probabilities'"
                )
        shared = tensor_slice(output.parameters, regions, f"output {output.name!r}")
        if shared is not None and top_k:
            raise InvalidArgument(
                f"output {output.name!r} sets both classification and a shared memory region; "
                "ask for one"
            )
        wanted.append(Wanted(output.name, top_k, shared))
    return tuple(wanted)


def _batch_size(model: ServedModel, inputs: dict[str, Tensor]) -> int:
    request_wide = ("target_language", *WORD_INPUTS)
    sizes = {t.name: t.batch for t in inputs.values() if t.name not in request_wide}
    if not sizes:
        names = ", ".join(s.describe() for s in signature(model.config).inputs)
        raise InvalidArgument(f"the request has no inputs; model {model.name!r} takes: {names}")
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in sizes.items())
        raise InvalidArgument(f"inputs disagree on the batch size ({listed}); send equal N")
    (name, n), *_ = sizes.items()
    if n == 0:
        raise InvalidArgument(f"input {name!r} is empty (N = 0); send at least one element")
    limit = max_batch(model.config)
    if n > limit:
        raise TooLarge(
            f"input {name!r} holds {n} elements; model {model.name!r} takes at most {limit} per "
            "request (max_batch_size): split the request"
        )
    return n


def prepare(
    model: ServedModel,
    request: pb.ModelInferRequest,
    deadline: float | None,
    regions: SharedMemoryRegions | None = None,
) -> Call:
    """Decode and validate a request against the model's signature (``regions``: the server's
    shared memory regions, None when the extension is off).

    Raises:
        InvalidArgument: bad tensors, names, datatypes, shapes, outputs or parameters.
        NotFound: a shared memory region or object that does not exist.
        TooLarge: more elements than the model takes per request.
    """
    sig = signature(model.config)
    inputs = decode_inputs(request, shared_inputs(request, regions))
    _check_inputs(model, sig, inputs)
    wanted = _requested_outputs(model, sig, request, regions)
    batch = _batch_size(model, inputs)
    timeout = request_timeout(request, deadline)
    priority = request_priority(request)
    return Call(model, request, inputs, wanted, batch, timeout, regions, priority)


# --- the inputs of each element ----------------------------------------------------------


def each(call: Call, fn: Callable[[int], T]) -> list[T]:
    """``fn(i)`` for every element; a failing element's error names its index (when N > 1)."""
    results: list[T] = []
    for index in range(call.batch):
        try:
            results.append(fn(index))
        except ServingError as err:
            if call.batch == 1:
                raise
            raise type(err)(f"element {index}: {err}") from err
    return results


def elements(tensor: Tensor) -> list[bytes]:
    """The BYTES elements of a tensor, flattened."""
    return [bytes(v) for v in tensor.data.reshape(-1)]


def utf8(tensor: Tensor) -> list[str]:
    """The BYTES elements of a tensor as text; INVALID_ARGUMENT names a non-UTF-8 element."""
    texts = []
    for index, value in enumerate(elements(tensor)):
        try:
            texts.append(value.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InvalidArgument(
                f"input {tensor.name!r} element {index} is not valid UTF-8 ({err.reason} at byte "
                f"{err.start}); send UTF-8 text"
            ) from err
    return texts


def target_languages(call: Call, languages: tuple[str, ...]) -> list[str]:
    """The target language of every element: from the input, the parameter, or none needed
    (a model with no or one target language; TextSource takes "" as that one)."""
    tensor = call.inputs.get("target_language")
    parameter = call.request.parameters.get("target_language")
    if tensor is not None and parameter is not None:
        raise InvalidArgument(
            "target_language is sent both as an input and as a request parameter; send it once"
        )
    if tensor is not None:
        values = [v.strip() for v in utf8(tensor)]
        if len(values) not in (1, call.batch):
            raise InvalidArgument(
                f"input 'target_language' holds {len(values)} elements; send 1 (for every text) "
                f"or {call.batch} (one per text)"
            )
        return values * call.batch if len(values) == 1 else values
    if parameter is not None:
        return [string_parameter("target_language", parameter).strip()] * call.batch
    if len(languages) > 1:  # a model with one target language needs none (as the attnserve API)
        raise InvalidArgument(
            "target_language is missing: send request parameter 'target_language' (string) or "
            f"input 'target_language' (BYTES [N] or [1]); choose one of: {', '.join(languages)}"
        )
    return [""] * call.batch


def prefixes(call: Call) -> list[str]:
    """The target prefix of every element ("" for none): the generator's optional prefix input
    (``PREFIX_INPUT``), one string per element."""
    tensor = call.inputs.get(PREFIX_INPUT[call.model.config.task])
    return [""] * call.batch if tensor is None else utf8(tensor)


def word_lists(call: Call) -> dict[str, Any]:
    """The request's bad words and stop strings (``WORD_INPUTS`` sent, each BYTES [K] for every
    element), by their ``DecodingOptions`` field."""
    return {name: tuple(utf8(call.inputs[name])) for name in WORD_INPUTS if name in call.inputs}


def element_pixels(call: Call) -> list[np.ndarray]:
    """One (3, S, S) array per element, from ``pixel_values``, decoded ``image`` pixels (UINT8)
    or encoded ``image`` bytes."""
    model = call.model
    pixels = call.inputs.get("pixel_values")
    image = call.inputs.get("image")
    if pixels is not None and image is not None:
        raise InvalidArgument("send either input 'pixel_values' or input 'image', not both")
    if pixels is not None:
        return _normalised_pixels(call, pixels)
    if image is None or model.images is None:
        described = ", ".join(s.describe() for s in signature(model.config).accepted)
        raise InvalidArgument(f"model {model.name!r} needs one of the inputs {described}")
    images = model.images
    if image.datatype == BYTES:
        encoded = elements(image)
        return each(call, lambda i: images.pixels(encoded[i]))
    return [images.normalise(image.data[i]) for i in range(call.batch)]


def _normalised_pixels(call: Call, pixels: Tensor) -> list[np.ndarray]:
    """The elements of ``pixel_values``, checked: finite and within the normalised range."""
    data: np.ndarray = pixels.data.astype(call.model.float_dtype, copy=False)
    if not np.isfinite(data).all():
        raise InvalidArgument("input 'pixel_values' holds NaN or infinite values")
    if data.size and float(np.abs(data).max()) > PIXEL_LIMIT:
        raise InvalidArgument(
            f"input 'pixel_values' holds values up to {float(np.abs(data).max()):.3g}; send "
            f"normalised pixels ((x/255 - mean) / std, |value| <= {PIXEL_LIMIT:g}), or RGB "
            "bytes as input 'image' (UINT8)"
        )
    return [np.ascontiguousarray(data[i]) for i in range(call.batch)]
