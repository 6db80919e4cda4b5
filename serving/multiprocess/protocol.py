"""The messages between frontend processes and the engine process, on the wire.

A message is a list of frames (``framing`` carries them over the engine's Unix socket): one
msgpack header frame, then one raw frame per array (its bytes as they lie in memory; dtype and
shape travel in the header). Nothing is pickled.

Frontend -> engine (each frontend on a connection of its own):

- ``generate``: ``{"t": "generate", "id", "model", "options": {...}, "deadline", "arrival",
  "input": "source_ids" | "pixels", "arrays": [spec]}`` + one array frame;
- ``classify``: ``{"t": "classify", "id", "model", "timeout", "arrays": [spec]}`` + the pixels;
- ``cancel``: ``{"t": "cancel", "id"}``: the client went away; free the request's rows.

Engine -> frontend:

- ``events``: ``{"t": "events", "items": [[id, kind, payload], ...], "arrays": [...]}`` + array
  frames, every event of one engine loop turn for that frontend in one message. Kinds:
  ``token`` ([token_id, index]), ``finish`` (FinishEvent fields), ``error`` ([status name,
  message]), ``result`` (index of the array frame holding a classifier's probabilities);
- ``tokens``: ``{"t": "tokens", "arrays": [...]}`` + three int64 frames of equal length: request
  ids, token ids, output indices: one decode step's tokens for that frontend's streams (a
  stream's finish follows in a later ``events`` message).

Times are ``time.monotonic()`` values: the clock is shared by every process of one machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from serving.engine.requests import ErrorEvent, Event, FinishEvent, TokenEvent
from serving.errors import (
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
    ServingError,
    Unauthenticated,
    Unavailable,
)
from serving.generation.options import DecodingOptions

ERRORS: dict[str, type[ServingError]] = {
    cls.code.name: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        OutOfRange,
        DeadlineExceeded,
        Cancelled,
        Unavailable,
        Unauthenticated,
        Internal,
    )
}
MAX_ARRAY_DIMS = 8
_FINISH_FIELDS = tuple(field.name for field in dataclasses.fields(FinishEvent))


class ProtocolError(ValueError):
    """A message that does not follow this module's format (a bug or a foreign peer)."""


def array_spec(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": array.dtype.str, "shape": list(array.shape)}


def encode(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> list[bytes | memoryview]:
    """The frames of a message: the header (with the arrays' specs) and each array's bytes."""
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d).
    contiguous = [np.require(a, requirements="C") for a in arrays]
    frames: list[bytes | memoryview] = [
        msgpack.packb({**header, "arrays": [array_spec(a) for a in contiguous]})
    ]
    frames += [memoryview(a.reshape(-1)).cast("B") for a in contiguous]
    return frames


def decode(frames: Sequence[bytes | memoryview]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Header and arrays of a message (arrays are read-only views of the frames).

    Raises:
        ProtocolError: a header that is not a msgpack map with a type, or array frames that do
            not match their specs.
    """
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = msgpack.unpackb(bytes(frames[0]), strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
        raise ProtocolError(f"header is not msgpack: {err}") from err
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError("header must be a map with a string 't'")
    specs = header.get("arrays", [])
    if not isinstance(specs, list) or len(specs) != len(frames) - 1:
        raise ProtocolError(f"{len(frames) - 1} array frames for {specs!r}")
    return header, [_array(spec, frame) for spec, frame in zip(specs, frames[1:], strict=True)]


def _array(spec: Any, frame: bytes | memoryview) -> np.ndarray:
    try:
        dtype = np.dtype(spec["dtype"])
        shape = tuple(int(n) for n in spec["shape"])
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"bad array spec {spec!r}") from err
    if dtype.hasobject or len(shape) > MAX_ARRAY_DIMS or any(n < 0 for n in shape):
        raise ProtocolError(f"unsupported array spec {spec!r}")
    if math.prod(shape) * dtype.itemsize != len(memoryview(frame)):  # exact (Python ints)
        raise ProtocolError(f"{len(memoryview(frame))} bytes do not hold {spec!r}")
    return np.frombuffer(frame, dtype=dtype).reshape(shape)


# --- the pieces of a header ---------------------------------------------------------------------


_OPTION_FIELDS = tuple(field.name for field in dataclasses.fields(DecodingOptions))


def options_payload(options: DecodingOptions) -> dict[str, Any]:
    """The options' fields as they are (all scalars; ``dataclasses.asdict`` deep-copies)."""
    return {name: getattr(options, name) for name in _OPTION_FIELDS}


def options_from(payload: Any) -> DecodingOptions:
    """Decoding options of a ``generate`` header.

    Raises:
        ProtocolError: unknown fields or wrong types.
    """
    try:
        return DecodingOptions(**payload)
    except TypeError as err:
        raise ProtocolError(f"bad decoding options {payload!r}: {err}") from err


def event_item(request_id: int, event: Event) -> list[Any]:
    """One ``[id, kind, payload]`` item of an ``events`` message."""
    if isinstance(event, TokenEvent):
        return [request_id, "token", [event.token_id, event.index]]
    if isinstance(event, FinishEvent):
        # its fields as they are (dataclasses.asdict deep-copies: a sixth of the engine
        # process's loop at 128 streams); msgpack writes the tuples as lists
        return [request_id, "finish", {name: getattr(event, name) for name in _FINISH_FIELDS}]
    error = event.error
    code = error.code.name if isinstance(error, ServingError) else "INTERNAL"
    return [request_id, "error", [code, str(error)]]


def tokens_message(
    routes: Sequence[int], tokens: Sequence[int], indices: Sequence[int]
) -> list[bytes | memoryview]:
    """The frames of a ``tokens`` message."""
    return encode(
        {"t": "tokens"},
        [np.asarray(routes, np.int64), np.asarray(tokens, np.int64), np.asarray(indices, np.int64)],
    )


def tokens_from(arrays: Sequence[np.ndarray]) -> list[tuple[int, int, int]]:
    """(request id, token, index) of each token a ``tokens`` message carries.

    Raises:
        ProtocolError: not three one-dimensional integer arrays of one length.
    """
    if (
        len(arrays) != 3
        or any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays)
        or not len(arrays[0]) == len(arrays[1]) == len(arrays[2])
    ):
        raise ProtocolError("a tokens message holds three 1-d integer arrays of one length")
    return list(zip(arrays[0].tolist(), arrays[1].tolist(), arrays[2].tolist(), strict=True))


def event_from(kind: str, payload: Any) -> Event:
    """The engine event an ``events`` item carries (not ``result`` items).

    Raises:
        ProtocolError: an unknown kind or a payload of the wrong shape.
    """
    try:
        if kind == "token":
            token, index = payload
            return TokenEvent(int(token), int(index))
        if kind == "finish":
            finish = FinishEvent(**payload)
            finish.alternatives = [(list(ids), float(score)) for ids, score in finish.alternatives]
            return finish
        if kind == "error":
            code, message = payload
            return ErrorEvent(ERRORS.get(code, Internal)(str(message)))
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"bad {kind!r} payload {payload!r}: {err}") from err
    raise ProtocolError(f"unknown event kind {kind!r}")
