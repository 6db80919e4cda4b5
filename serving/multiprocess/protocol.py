"""The messages between frontend processes and the engine process, on the wire.

A message is a list of frames (``framing`` carries them over the engine's Unix socket): one
msgpack header frame, then one raw frame per array (its bytes as they lie in memory; dtype and
shape travel in the header). An array the frontend put into its shared memory arena (``shm``)
has no frame: its spec says where it lies (``"shm": offset``). Nothing is pickled.

A connection opens with the frontend's hello (``shm.send_hello``: its arena, if any), then
messages.

Frontend -> engine (each frontend on a connection of its own):

- ``generate``: ``{"t": "generate", "id", "model", "version", "options": {...}, "deadline",
  "arrival", "priority", "input": "source_ids" | "pixels", "arrays": [spec]}`` + one array
  frame (``priority``: the request's queue level, resolved by the frontend; ``version``: the
  served version the request is for, absent: the newest served; ``"prefix"``: the target
  prefix's token ids, absent: none; ``"bad_words"``: the bad words' token id lists, absent:
  none);
- ``classify``: ``{"t": "classify", "id", "model", "version", "timeout", "priority", "times"?,
  "arrays": [spec]}`` + the pixels (``priority``: the client's, which the engine's batcher
  resolves; ``times``: a traced request's, whose ``result`` then carries its batch times);
- ``score``: ``{"t": "score", "id", "model", "version", "timeout", "priority", "times"?,
  "arrays": [spec, spec]}`` + the source (token ids, or an image's pixels) and the target's
  token ids: one ``ScoreItem`` for the generator's scoring batcher, answered as ``classify``
  is (its ``result`` array: ``serving.scoring.result_array``);
- ``cancel``: ``{"t": "cancel", "id"}``: the client went away; free the request's rows. With
  ``"keep": n``: a stop string ended the output after n tokens; the engine finishes it there
  (``GenerationRequest.finish_at``) and its finish still comes;
- ``load`` / ``unload``: ``{"t": "load" | "unload", "id", "model"}``: model control
  (``serving.model_control``); answered by a ``done`` or ``error`` item once every frontend has
  applied it;
- ``trace``: ``{"t": "trace", "id", "model", "settings": {name: value | None}}``: change the
  trace settings (``serving.trace_control``) of every frontend; answered like ``load``;
- ``log``: ``{"t": "log", "id", "model": "", "settings": {name: value}}``: change the log
  settings (``serving.log_settings``) of the engine process and every frontend; the same;
- ``applied``: ``{"t": "applied", "id": seq, "error": message | None}``: this frontend has
  applied the engine's model change ``seq`` (a ``model`` item).

Engine -> frontend (each header has ``"ack"``: how many of this frontend's messages the engine
has read, whose arrays in shared memory it has copied out):

- ``events``: ``{"t": "events", "ack", "items": [[id, kind, payload], ...], "tokens": true?,
  "arrays": [...]}`` + array frames: everything one engine loop turn has for that frontend, in
  one message. Item kinds: ``token`` ([token_id, index], with ``return_log_probs`` [token_id, index,
  log_prob], with ``top_log_probs`` [token_id, index, log_prob, [[ids], [log-probs]]]),
  ``finish`` (FinishEvent fields),
  ``error`` ([status name, message]), ``result`` (index of the array frame holding a
  classifier's probabilities or a scored pair's result; a traced one's ``[index, enqueued,
  batch start, batch end]``),
  ``done`` (None: a load, unload or settings change succeeded), and, with id 0, ``model``
  (``{"op": "load" | "unload" | "trace" | "log", "model", "seq", "settings"?}``: a change
  every frontend applies to its own models, tracer or logging, then reports as ``applied``).
  With ``tokens`` the last three arrays are int64 columns of equal length, request ids, token
  ids and output indices: the decode steps' tokens for that frontend's streams, which come
  before the items (a stream's finish after its last token).

Times are ``time.monotonic()`` values: the clock is shared by every process of one machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from serving.engine.requests import ErrorEvent, Event, FinishEvent, TokenEvent
from serving.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
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
from serving.generation.top_tokens import TopTokens
from serving.multiprocess.shm import ArenaError, ArenaReader

ERRORS: dict[str, type[ServingError]] = {
    cls.code.name: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
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


def encode(
    header: dict[str, Any],
    arrays: Sequence[np.ndarray] = (),
    place: Callable[[np.ndarray], int | None] | None = None,
) -> list[bytes | memoryview]:
    """The frames of a message: the header (with the arrays' specs) and each array's bytes.

    ``place`` may put an array into shared memory instead (``shm.TensorArena``): the offset it
    returns goes into the array's spec (``"shm"``) and the array has no frame; None: a frame.
    """
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d).
    contiguous = [np.require(a, requirements="C") for a in arrays]
    specs, frames = [], []
    for a in contiguous:
        spec = array_spec(a)
        offset = None if place is None else place(a)
        if offset is None:
            frames.append(a.reshape(-1).data.cast("B"))
        else:
            spec["shm"] = offset
        specs.append(spec)
    return [msgpack.packb({**header, "arrays": specs}), *frames]


def decode(
    frames: Sequence[bytes | memoryview], arena: ArenaReader | None = None
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Header and arrays of a message: read-only views of the frames, and copies of the arrays
    in shared memory (from ``arena``, the sender's).

    Raises:
        ProtocolError: a header that is not a msgpack map with a type, array frames that do
            not match their specs, or an array in shared memory that is not there.
    """
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = msgpack.unpackb(bytes(frames[0]), strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
        raise ProtocolError(f"header is not msgpack: {err}") from err
    except TypeError as err:  # a map or list as a map key: msgpack cannot hash it
        raise ProtocolError(f"header has an unhashable map key: {err}") from err
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError("header must be a map with a string 't'")
    specs = header.get("arrays", [])
    if not isinstance(specs, list):
        raise ProtocolError(f"'arrays' must be a list, got {specs!r}")
    shared = sum(1 for spec in specs if isinstance(spec, dict) and "shm" in spec)
    if len(specs) - shared != len(frames) - 1:
        raise ProtocolError(f"{len(frames) - 1} array frames for {specs!r}")
    rest = iter(frames[1:])
    arrays = []
    for spec in specs:
        if isinstance(spec, dict) and "shm" in spec:
            arrays.append(_shared_array(spec, arena))
        else:
            arrays.append(_array(spec, next(rest)))
    return header, arrays


def _spec(spec: Any) -> tuple[np.dtype, tuple[int, ...]]:
    try:
        dtype = np.dtype(spec["dtype"])
        shape = tuple(int(n) for n in spec["shape"])
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"bad array spec {spec!r}") from err
    if dtype.hasobject or len(shape) > MAX_ARRAY_DIMS or any(n < 0 for n in shape):
        raise ProtocolError(f"unsupported array spec {spec!r}")
    return dtype, shape


def _shared_array(spec: dict[str, Any], arena: ArenaReader | None) -> np.ndarray:
    dtype, shape = _spec(spec)
    if arena is None:
        raise ProtocolError("an array in shared memory, but the sender has no arena")
    offset = spec["shm"]
    if not isinstance(offset, int):
        raise ProtocolError(f"bad shared memory offset {offset!r}")
    try:
        return arena.array(offset, dtype, shape)
    except ArenaError as err:
        raise ProtocolError(str(err)) from err


def _array(spec: Any, frame: bytes | memoryview) -> np.ndarray:
    dtype, shape = _spec(spec)
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
    if not isinstance(payload, dict):
        raise ProtocolError(f"bad decoding options {payload!r}: expected a map")
    # msgpack gives lists where the options hold tuples (``bad_words``, ``stop``)
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in payload.items()}
    try:
        return DecodingOptions(**fields)
    except TypeError as err:
        raise ProtocolError(f"bad decoding options {payload!r}: {err}") from err


def prefix_from(payload: Any) -> tuple[int, ...]:
    """The target prefix of a ``generate`` header (a list of token ids)."""
    if not _token_ids(payload):
        raise ProtocolError(f"bad target prefix {payload!r}: expected a list of token ids")
    return tuple(payload)


def bad_words_from(payload: Any) -> tuple[tuple[int, ...], ...]:
    """The bad words of a ``generate`` header (a list of non-empty token id lists)."""
    if not isinstance(payload, list | tuple) or not all(
        _token_ids(word) and word for word in payload
    ):
        raise ProtocolError(f"bad bad_words {payload!r}: expected lists of token ids")
    return tuple(tuple(word) for word in payload)


def _token_ids(payload: Any) -> bool:
    """Whether ``payload`` is a list of token ids (ints >= 0)."""
    return isinstance(payload, list | tuple) and all(
        isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in payload
    )


def event_item(request_id: int, event: Event) -> list[Any]:
    """One ``[id, kind, payload]`` item of an ``events`` message."""
    if isinstance(event, TokenEvent):
        if event.top is not None:  # msgpack writes the TopTokens tuple as [[ids], [values]]
            payload = [event.token_id, event.index, event.log_prob, event.top]
            return [request_id, "token", payload]
        if event.log_prob is not None:
            return [request_id, "token", [event.token_id, event.index, event.log_prob]]
        return [request_id, "token", [event.token_id, event.index]]
    if isinstance(event, FinishEvent):
        # its fields as they are (dataclasses.asdict deep-copies: a sixth of the engine
        # process's loop at 128 streams); msgpack writes the tuples as lists
        return [request_id, "finish", {name: getattr(event, name) for name in _FINISH_FIELDS}]
    error = event.error
    code = error.code.name if isinstance(error, ServingError) else "INTERNAL"
    return [request_id, "error", [code, str(error)]]


def events_message(
    items: list[Any],
    arrays: Sequence[np.ndarray] = (),
    tokens: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ack: int = 0,
) -> list[bytes | memoryview]:
    """The frames of an ``events`` message: ``items`` (whose ``result`` payloads index
    ``arrays``), a decode step's ``tokens`` columns (request ids, tokens, output indices) after
    the arrays, and ``ack``: how many of the frontend's messages the engine has read."""
    if tokens is None:
        return encode({"t": "events", "ack": ack, "items": items}, arrays)
    columns = [np.asarray(column, np.int64) for column in tokens]
    return encode({"t": "events", "ack": ack, "items": items, "tokens": True}, [*arrays, *columns])


def tokens_from(arrays: Sequence[np.ndarray]) -> list[tuple[int, int, int]]:
    """(request id, token, index) of each token of an ``events`` message's token columns.

    Raises:
        ProtocolError: not three one-dimensional integer arrays of one length.
    """
    if (
        len(arrays) != 3
        or any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays)
        or not len(arrays[0]) == len(arrays[1]) == len(arrays[2])
    ):
        raise ProtocolError("a step's tokens are three 1-d integer arrays of one length")
    return list(zip(arrays[0].tolist(), arrays[1].tolist(), arrays[2].tolist(), strict=True))


def event_from(kind: str, payload: Any) -> Event:
    """The engine event an ``events`` item carries (not ``result`` items).

    Raises:
        ProtocolError: an unknown kind or a payload of the wrong shape.
    """
    try:
        if kind == "token":
            token, index, *scored = payload
            if len(scored) > 2:
                raise ValueError("a token is [id, index], [id, index, log_prob] or with its top")
            log_prob = float(scored[0]) if scored else None
            top = TopTokens.of(scored[1]) if len(scored) == 2 else None
            return TokenEvent(int(token), int(index), log_prob, top)
        if kind == "finish":
            finish = FinishEvent(**payload)
            finish.alternatives = [
                (list(ids), float(score), bool(ended)) for ids, score, ended in finish.alternatives
            ]
            if finish.alternative_log_probs is not None:
                finish.alternative_log_probs = [
                    [float(p) for p in values] for values in finish.alternative_log_probs
                ]
            if finish.top_log_probs is not None:
                finish.top_log_probs = [TopTokens.of(top) for top in finish.top_log_probs]
            if finish.alternative_top_log_probs is not None:
                finish.alternative_top_log_probs = [
                    [TopTokens.of(top) for top in tops] for tops in finish.alternative_top_log_probs
                ]
            return finish
        if kind == "error":
            code, message = payload
            return ErrorEvent(ERRORS.get(code, Internal)(str(message)))
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"bad {kind!r} payload {payload!r}: {err}") from err
    raise ProtocolError(f"unknown event kind {kind!r}")
