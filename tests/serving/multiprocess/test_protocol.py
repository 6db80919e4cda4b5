"""The frontend <-> engine messages: every event and array survives the wire; malformed frames
are refused with ProtocolError, never another exception."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from serving.engine.requests import ErrorEvent, FinishEvent, TokenEvent
from serving.errors import DeadlineExceeded, Internal, ResourceExhausted
from serving.generation.options import DecodingOptions
from serving.multiprocess.protocol import (
    ProtocolError,
    bad_words_from,
    decode,
    encode,
    event_from,
    event_item,
    events_message,
    options_from,
    options_payload,
    prefix_from,
    tokens_from,
)

DTYPES = st.sampled_from([np.int64, np.int32, np.float32, np.float16, np.float64, np.uint8])
ARRAYS = DTYPES.flatmap(
    lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))
)
HEADERS = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in ("t", "arrays")),
    st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), st.text()),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(header=HEADERS, arrays=st.lists(ARRAYS, max_size=4))
def test_headers_and_arrays_round_trip(header: dict, arrays: list[np.ndarray]) -> None:
    frames = [bytes(f) for f in encode({**header, "t": "x"}, arrays)]
    got_header, got_arrays = decode(frames)
    assert {k: v for k, v in got_header.items() if k != "arrays"} == {**header, "t": "x"}
    assert len(got_arrays) == len(arrays)
    for got, sent in zip(got_arrays, arrays, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        np.testing.assert_array_equal(got, sent)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), min_size=0, max_size=4))
@example(frames=[b"\x81\x80\x00"])  # a map whose key is a map: msgpack raised TypeError
def test_random_frames_are_refused_cleanly(frames: list[bytes]) -> None:
    try:
        header, arrays = decode(frames)
    except ProtocolError:
        return
    assert isinstance(header, dict) and isinstance(header["t"], str)
    assert len(arrays) == len(frames) - 1


@pytest.mark.parametrize(
    ("header", "frames"),
    [
        ({"t": "x", "arrays": [{"dtype": "<f4", "shape": [2]}]}, [b"\0" * 7]),  # short
        ({"t": "x", "arrays": [{"dtype": "|O", "shape": [1]}]}, [b"\0" * 8]),  # objects
        ({"t": "x", "arrays": [{"dtype": "<f4", "shape": [-1]}]}, [b""]),
        ({"t": "x", "arrays": [{"shape": [1]}]}, [b"\0" * 4]),
        ({"t": "x", "arrays": []}, [b"\0"]),  # a frame without a spec
        ({"t": 5}, []),
    ],
)
def test_array_specs_that_do_not_fit_their_frames(header: dict, frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode([msgpack.packb(header), *frames])


EVENTS = [
    TokenEvent(17, 3),
    FinishEvent("stop", [5, 6], score=-1.25, alternatives=[([5], -2.0, True), ([7], -3.0, False)]),
    FinishEvent("length", [], queue_seconds=0.5),
    ErrorEvent(ResourceExhausted("queue full: retry later")),
    ErrorEvent(DeadlineExceeded("too slow")),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_events_round_trip(event) -> None:
    (header, _) = decode(
        [bytes(f) for f in encode({"t": "events", "items": [event_item(9, event)]})]
    )
    ((request_id, kind, payload),) = header["items"]
    got = event_from(kind, payload)
    assert request_id == 9 and type(got) is type(event)
    if isinstance(event, ErrorEvent):
        assert type(got.error) is type(event.error) and str(got.error) == str(event.error)
    else:
        assert got == event


def test_a_foreign_exception_travels_as_internal() -> None:
    got = event_from(*event_item(1, ErrorEvent(RuntimeError("boom")))[1:])
    assert isinstance(got, ErrorEvent) and isinstance(got.error, Internal)
    with pytest.raises(ProtocolError):
        event_from("nonsense", [])
    with pytest.raises(ProtocolError):
        event_from("token", "not a pair")


def test_decoding_options_round_trip() -> None:
    options = DecodingOptions(max_new_tokens=9, beam_size=3, top_p=0.5, seed=2**64 - 1)
    assert options_from(msgpack.unpackb(msgpack.packb(options_payload(options)))) == options
    listed = DecodingOptions(bad_words=("drei", "und"), stop=("\n", "."))  # tuples come back
    assert options_from(msgpack.unpackb(msgpack.packb(options_payload(listed)))) == listed
    with pytest.raises(ProtocolError):
        options_from({"beams": 3})
    with pytest.raises(ProtocolError, match="expected a map"):
        options_from([1, 2])


WIRE_INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack carries


@settings(max_examples=200, deadline=None)
@given(
    payload=st.one_of(
        st.lists(st.integers(0, 2**40), max_size=40),
        st.lists(st.one_of(WIRE_INTS, st.booleans(), st.text(), st.floats()), max_size=4),
        st.text(),
        WIRE_INTS,
        st.none(),
    )
)
def test_a_target_prefix_survives_the_wire_or_is_refused(payload: object) -> None:
    """A ``generate`` header's token ids come back as they went; anything else is refused."""
    wired = msgpack.unpackb(msgpack.packb({"prefix": payload}))["prefix"]
    valid = isinstance(payload, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in payload
    )
    if valid:
        assert prefix_from(wired) == tuple(payload)  # type: ignore[arg-type]
    else:
        with pytest.raises(ProtocolError, match="bad target prefix"):
            prefix_from(wired)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.one_of(
        st.lists(st.lists(st.integers(0, 2**40), max_size=4), max_size=6),
        st.lists(st.one_of(st.lists(WIRE_INTS, max_size=3), st.text(), WIRE_INTS), max_size=3),
        st.text(),
        st.none(),
    )
)
def test_bad_words_survive_the_wire_or_are_refused(payload: object) -> None:
    """A ``generate`` header's bad words (lists of token ids, none empty) come back as they
    went; anything else is refused."""
    wired = msgpack.unpackb(msgpack.packb({"bad_words": payload}))["bad_words"]
    valid = isinstance(payload, list) and all(
        isinstance(word, list)
        and word
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in word)
        for word in payload
    )
    if valid:
        assert bad_words_from(wired) == tuple(tuple(w) for w in payload)  # type: ignore[union-attr]
    else:
        with pytest.raises(ProtocolError, match="bad bad_words"):
            bad_words_from(wired)


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(st.tuples(INT64, INT64, INT64), max_size=300),
    results=st.lists(ARRAYS, max_size=3),
    ack=st.integers(0, 2**40),
)
def test_events_messages_carry_tokens_after_their_arrays(
    items: list[tuple[int, int, int]], results: list[np.ndarray], ack: int
) -> None:
    """A decode step's token columns ride in the loop turn's ``events`` message, after the
    items' arrays; the items' ``result`` indices still point at their own arrays."""
    routes, tokens, indices = (
        (list(column) for column in zip(*items, strict=True)) if items else ([], [], [])
    )
    answers = [[7, "result", i] for i in range(len(results))]
    frames = events_message(answers, results, (routes, tokens, indices), ack)
    header, arrays = decode([bytes(f) for f in frames])
    assert (header["t"], header["ack"], header["tokens"]) == ("events", ack, True)
    assert tokens_from(arrays[-3:]) == items
    for _, _, index in header["items"]:
        np.testing.assert_array_equal(arrays[index], results[index])
    plain, _ = decode([bytes(f) for f in events_message(answers, results, None, ack)])
    assert "tokens" not in plain


@pytest.mark.parametrize(
    "arrays",
    [
        [np.zeros(2, np.int64), np.zeros(2, np.int64)],  # two columns
        [np.zeros(2, np.int64), np.zeros(3, np.int64), np.zeros(2, np.int64)],  # lengths differ
        [np.zeros(2, np.int64), np.zeros(2, np.float32), np.zeros(2, np.int64)],  # not integers
        [np.zeros((2, 1), np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64)],  # 2-d
    ],
)
def test_malformed_tokens_messages_are_refused(arrays: list[np.ndarray]) -> None:
    with pytest.raises(ProtocolError):
        tokens_from(decode([bytes(f) for f in encode({"t": "events"}, arrays)])[1])
