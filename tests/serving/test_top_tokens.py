"""The most likely tokens of a decode step (``DecodingOptions.top_log_probs``) without a model.

``top_tokens`` against a plain reference (the finite entries sorted by descending value, then
ascending id, the first k), over random rows with -inf, NaN, +inf, ties and rows long enough for
``ranking.top_indices``' block bound; ``TopTokens.of`` (the wire form back); the engine-to-frontend
events that carry them (``protocol.event_item`` / ``event_from``, through msgpack as the
transport packs them); ``RowSampler``'s ``last_top`` (greedy, sampled, target prefix, forced EOS,
suppressed tokens, nothing possible); and ``DecodingOptions.validate``'s refusals.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from serving.engine.requests import FinishEvent, TokenEvent
from serving.errors import InvalidArgument
from serving.generation.options import MAX_TOP_LOG_PROBS, DecodingOptions
from serving.generation.sampling import RowSampler
from serving.generation.top_tokens import NONE, TopTokens, top_tokens
from serving.multiprocess import protocol
from serving.multiprocess.protocol import ProtocolError, event_from, event_item

EOS = 2
LIMIT = 32  # a model's max_new_tokens limit for validate


def reference(row: np.ndarray, count: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The ``count`` most likely finite entries of ``row``: by value descending, then id."""
    finite = [(float(v), i) for i, v in enumerate(row.tolist()) if math.isfinite(v)]
    chosen = sorted(finite, key=lambda pair: (-pair[0], pair[1]))[: max(count, 0)]
    return tuple(i for _, i in chosen), tuple(v for v, _ in chosen)


def check(row: np.ndarray, count: int) -> TopTokens:
    got = top_tokens(row, count)
    assert isinstance(got, TopTokens)
    ids, values = reference(row, count)
    assert got.token_ids == ids
    assert got.log_probs == values
    assert all(type(i) is int for i in got.token_ids)
    assert all(type(v) is float for v in got.log_probs)
    return got


# --- top_tokens ---------------------------------------------------------------------------------
SPECIAL = [-np.inf, np.nan, np.inf, 0.0, -0.0]


@settings(max_examples=300, deadline=None)
@given(
    row=hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64]),
        shape=st.integers(0, 40),
        elements=st.one_of(
            st.sampled_from([-1.0, -2.0, -0.5, *SPECIAL]),  # ties and non-finite values
            st.floats(-50, 0, width=32),
        ),
    ),
    count=st.integers(-2, 50),
)
def test_top_tokens_is_the_reference_on_small_rows(row: np.ndarray, count: int) -> None:
    got = check(row, count)
    assert len(got.token_ids) == max(0, min(count, int(np.isfinite(row).sum())))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([255, 256, 1000, 4096, 5200, 8000]),
    count=st.sampled_from([1, 2, 5, 20, 21, 300]),
    pool=st.integers(1, 50),  # distinct values: few of them make many ties
    masked=st.floats(0.0, 1.0),  # the share of -inf / NaN entries
)
def test_top_tokens_is_the_reference_on_long_rows(
    seed: int, size: int, count: int, pool: int, masked: float
) -> None:
    """Vocabulary-sized rows, where ``top_indices`` sorts only the values above its bound."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=pool) * 3 - 5
    row = values[rng.integers(0, pool, size)]
    hidden = rng.random(size) < masked
    row[hidden] = np.where(rng.random(int(hidden.sum())) < 0.5, -np.inf, np.nan)
    check(row, count)
    check(row.astype(np.float32), count)


def test_top_tokens_edge_cases() -> None:
    assert top_tokens(np.array([-1.0, -2.0]), 0) is NONE
    assert top_tokens(np.array([-1.0, -2.0]), -3) == NONE == TopTokens((), ())
    assert top_tokens(np.array([], dtype=np.float32), 5) == NONE
    assert top_tokens(np.full(7, -np.inf), 3) == NONE
    assert top_tokens(np.full(7, np.nan), 3) == NONE
    assert top_tokens(np.array([np.nan, np.inf, -np.inf]), 3) == NONE
    # ties go to the lowest id; fewer than asked when fewer are possible
    row = np.array([-1.0, -0.5, -np.inf, -0.5, np.nan, -1.0])
    assert top_tokens(row, 10) == ((1, 3, 0, 5), (-0.5, -0.5, -1.0, -1.0))
    assert top_tokens(row, 1) == ((1,), (-0.5,))
    # the input is not changed
    before = row.copy()
    top_tokens(row, 3)
    np.testing.assert_array_equal(row, before)
    # a probability distribution's log-softmax: the values are <= 0 and most likely first
    logits = np.random.default_rng(0).normal(size=500)
    log_probs = logits - np.log(np.exp(logits).sum())
    top = top_tokens(log_probs, 20)
    assert top.token_ids[0] == int(np.argmax(logits))
    assert all(a >= b for a, b in zip(top.log_probs, top.log_probs[1:], strict=False))
    assert max(top.log_probs) <= 0.0


# --- TopTokens.of ------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 2**31 - 1), st.floats(allow_nan=False, width=64)), max_size=25
    )
)
def test_top_tokens_of_round_trips_its_wire_form(pairs: list[tuple[int, float]]) -> None:
    top = TopTokens(tuple(i for i, _ in pairs), tuple(v for _, v in pairs))
    wire = msgpack.unpackb(msgpack.packb(top))  # a NamedTuple of tuples packs as [[ids], [vals]]
    assert wire == [list(top.token_ids), list(top.log_probs)]
    back = TopTokens.of(wire)
    assert back == top and isinstance(back, TopTokens)
    assert all(type(i) is int for i in back.token_ids)
    assert all(type(v) is float for v in back.log_probs)


def test_top_tokens_of_converts_and_refuses() -> None:
    assert TopTokens.of([[3, 1], [-0.5, -1]]) == ((3, 1), (-0.5, -1.0))
    assert TopTokens.of(((), ())) == NONE
    assert TopTokens.forced(7) == ((7,), (0.0,))
    with pytest.raises(ValueError, match="2 ids for 1 log-probabilities"):
        TopTokens.of([[1, 2], [-0.5]])
    with pytest.raises(ValueError, match="0 ids for 1 log-probabilities"):
        TopTokens.of([[], [-0.5]])
    with pytest.raises(ValueError):
        TopTokens.of([[1, 2]])  # not a pair
    with pytest.raises(ValueError):
        TopTokens.of([[1], [-0.5], [0]])


# --- the engine's events on the wire ---------------------------------------------------------
def through_msgpack(item: list[Any]) -> Any:
    """The item as the frontend reads it: ``encode`` packs a header of items with msgpack."""
    return msgpack.unpackb(msgpack.packb(item), strict_map_key=False)


def through_message(items: list[list[Any]]) -> list[Any]:
    """The items of an ``events`` message, through its frames (``events_message`` / ``decode``)."""
    header, arrays = protocol.decode(protocol.events_message(items, ack=3))
    assert header["t"] == "events" and header["ack"] == 3 and arrays == []
    return list(header["items"])


TOP = TopTokens((5, 9, 2), (-0.25, -1.5, -3.0))


@pytest.mark.parametrize(
    "event",
    [
        TokenEvent(5, 0, -0.25, TOP),
        TokenEvent(7, 3, -2.0, TopTokens((1, 7), (-0.5, -2.0))),  # sampled: not the most likely
        TokenEvent(4, 1, 0.0, TopTokens.forced(4)),  # a target prefix's token
        TokenEvent(4, 1, -np.inf, NONE),  # nothing was possible
        TokenEvent(6, 2, -0.75),  # without top_log_probs
        TokenEvent(6, 2),  # without return_log_probs
    ],
    ids=["top", "sampled", "prefix", "empty top", "log prob only", "plain"],
)
def test_token_events_round_trip(event: TokenEvent) -> None:
    item = event_item(11, event)
    request_id, kind, payload = through_msgpack(item)
    assert (request_id, kind) == (11, "token")
    if event.top is not None:
        assert payload == [
            event.token_id,
            event.index,
            event.log_prob,
            [list(event.top.token_ids), list(event.top.log_probs)],
        ]
    back = event_from(kind, payload)
    assert back == event
    assert back.top is None or isinstance(back.top, TopTokens)
    ((_, kind2, payload2),) = through_message([item])
    assert event_from(kind2, payload2) == event


def test_finish_event_round_trips_its_top_log_probs() -> None:
    tops = [TOP, TopTokens.forced(9), TopTokens((2, 5), (-0.1, -2.5)), NONE]
    event = FinishEvent(
        reason="length",
        tokens=[5, 9, 2, 4],
        score=-4.0,
        log_probs=[-0.25, 0.0, -0.1, -np.inf],
        top_log_probs=tops,
        input_tokens=6,
        queue_seconds=0.5,
        compute_seconds=1.25,
    )
    item = event_item(3, event)
    for request_id, kind, payload in (through_msgpack(item), *through_message([item])):
        assert (request_id, kind) == (3, "finish")
        assert payload["top_log_probs"] == [[list(t.token_ids), list(t.log_probs)] for t in tops]
        back = event_from(kind, payload)
        assert isinstance(back, FinishEvent)
        assert back == event
        assert back.top_log_probs is not None
        assert all(isinstance(top, TopTokens) for top in back.top_log_probs)
    plain = FinishEvent(reason="stop", tokens=[1, 2], log_probs=[-1.0, -2.0])
    back = event_from("finish", through_msgpack(event_item(1, plain))[2])
    assert back == plain and back.top_log_probs is None


@pytest.mark.parametrize(
    "payload",
    [
        [5, 0, -0.25, [[5, 9], [-0.25]]],  # mismatched lengths
        [5, 0, -0.25, [[5, 9], [-0.25, -1.0]], 1],  # too many fields
        [5, 0, -0.25, 7],  # not a pair
        [5, 0, -0.25, [["x"], [-0.25]]],  # not an id
    ],
    ids=["lengths", "extra field", "not a pair", "not an id"],
)
def test_bad_token_payloads_are_protocol_errors(payload: list[Any]) -> None:
    with pytest.raises(ProtocolError, match="token"):
        event_from("token", payload)


def test_bad_finish_top_log_probs_are_protocol_errors() -> None:
    payload = through_msgpack(event_item(1, FinishEvent(reason="stop", tokens=[5])))[2]
    payload["top_log_probs"] = [[[5, 6], [-0.5]]]
    with pytest.raises(ProtocolError, match="finish"):
        event_from("finish", payload)


# --- RowSampler --------------------------------------------------------------------------------
def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    finite = x[np.isfinite(x)]
    top = finite.max()
    return x - (top + np.log(np.exp(finite - top).sum()))


def logits(seed: int, size: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=size).astype(np.float32) * 3


def options(**fields: Any) -> DecodingOptions:
    return DecodingOptions(return_log_probs=True, **fields)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, MAX_TOP_LOG_PROBS))
def test_greedy_last_top_is_the_log_softmax(seed: int, k: int) -> None:
    row = logits(seed)
    sampler = RowSampler(options(temperature=0.0, top_log_probs=k), EOS)
    token = sampler.choose(row, 5)
    assert token == int(np.argmax(row))
    top = sampler.last_top
    assert len(top.token_ids) == k
    assert top.token_ids[0] == token
    assert top.log_probs[0] == sampler.last_log_prob
    expected = log_softmax(row)
    np.testing.assert_allclose(top.log_probs, expected[list(top.token_ids)], rtol=0, atol=1e-9)
    assert top.token_ids == reference(expected, k)[0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_greedy_last_top_of_each_dtype(dtype: type) -> None:
    row: np.ndarray = logits(3).astype(dtype)
    sampler = RowSampler(options(temperature=0.0, top_log_probs=4), EOS)
    token = sampler.choose(row, 0)
    assert sampler.last_top.token_ids[0] == token == int(np.argmax(row))
    expected = log_softmax(row.astype(np.float64))
    np.testing.assert_allclose(
        sampler.last_top.log_probs, expected[list(sampler.last_top.token_ids)], atol=1e-9
    )


def test_sampled_last_top_is_before_temperature_top_k_and_top_p() -> None:
    row = logits(7)
    expected = top_tokens(log_softmax(row), 6)
    chosen = set()
    for seed in range(20):
        sampler = RowSampler(
            options(temperature=5.0, top_k=3, top_p=0.99, seed=seed, top_log_probs=6), EOS
        )
        token = sampler.choose(row, 4)
        chosen.add(token)
        assert sampler.last_top.token_ids == expected.token_ids
        np.testing.assert_allclose(sampler.last_top.log_probs, expected.log_probs, atol=1e-9)
        assert token in expected.token_ids[:3]  # top-k 3 keeps the three most likely
        assert sampler.last_log_prob == pytest.approx(log_softmax(row)[token], abs=1e-9)
    assert len(chosen) > 1, "a sampled row should not always give one token"


def test_prefix_and_forced_eos_list_only_themselves() -> None:
    row = logits(1)
    sampler = RowSampler(options(top_log_probs=5), EOS, prefix=(17, 4), forced_eos_at=3)
    assert sampler.choose(row, 0) == 17
    assert sampler.last_top == TopTokens((17,), (0.0,)) and sampler.last_log_prob == 0.0
    assert sampler.choose(row, 1) == 4
    assert sampler.last_top == TopTokens((4,), (0.0,))
    token = sampler.choose(row, 2)
    assert sampler.last_top.token_ids[0] == token and len(sampler.last_top.token_ids) == 5
    assert sampler.choose(row, 3) == EOS
    assert sampler.last_top == TopTokens((EOS,), (0.0,)) and sampler.last_log_prob == 0.0


def test_suppressed_tokens_and_eos_are_never_listed() -> None:
    row = np.full(10, -5.0, dtype=np.float32)
    row[[EOS, 3, 8]] = [4.0, 3.0, 2.0]  # EOS, then 3 and 8 most likely
    sampler = RowSampler(options(top_log_probs=20, min_new_tokens=2), EOS, suppress_ids=(3, 99))
    token = sampler.choose(row, 0)  # EOS is suppressed below min_new_tokens
    assert token == 8
    top = sampler.last_top
    assert EOS not in top.token_ids and 3 not in top.token_ids
    assert top.token_ids == (8, 0, 1, 4, 5, 6, 7, 9)  # fewer than 20: the rest tie by id
    assert sum(math.exp(v) for v in top.log_probs) == pytest.approx(1.0)
    sampler.choose(row, 2)  # EOS allowed again
    assert sampler.last_top.token_ids[:2] == (EOS, 8)


def test_nothing_possible_gives_no_top_tokens() -> None:
    sampler = RowSampler(options(top_log_probs=3), EOS)
    sampler.choose(logits(2), 0)
    assert sampler.last_top != NONE
    assert sampler.choose(np.full(8, -np.inf, dtype=np.float32), 1) == EOS
    assert sampler.last_top == NONE and sampler.last_log_prob == -np.inf


def test_without_log_probs_there_is_no_top() -> None:
    """``top_log_probs`` alone (which ``validate`` refuses) computes nothing."""
    sampler = RowSampler(DecodingOptions(top_log_probs=3), EOS)
    sampler.choose(logits(2), 0)
    assert sampler.top == 0 and sampler.last_top == NONE
    off = RowSampler(options(top_log_probs=0), EOS)
    off.choose(logits(2), 0)
    assert off.last_top == NONE and off.last_log_prob < 0


# --- DecodingOptions.validate --------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, MAX_TOP_LOG_PROBS])
def test_valid_top_log_probs(k: int) -> None:
    assert MAX_TOP_LOG_PROBS == 20
    assert options(top_log_probs=k).validate(LIMIT).top_log_probs == k
    assert options(top_log_probs=k, temperature=0.5, seed=3).validate(LIMIT).top_log_probs == k
    assert DecodingOptions(top_log_probs=0, beam_size=4).validate(LIMIT).top_log_probs == 0
    assert options(top_log_probs=k, beam_size=4).validate(LIMIT).top_log_probs == k


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"top_log_probs": 3}, "return_log_probs"),
        ({"return_log_probs": True, "top_log_probs": 21}, "0..20"),
        ({"return_log_probs": True, "top_log_probs": -1}, "0..20"),
        ({"return_log_probs": True, "top_log_probs": 2.0}, "integer"),
        ({"return_log_probs": True, "top_log_probs": True}, "integer"),
        ({"return_log_probs": True, "top_log_probs": "2"}, "integer"),
    ],
    ids=["without log probs", "21", "negative", "float", "bool", "string"],
)
def test_invalid_top_log_probs(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match="top_log_probs") as refused:
        DecodingOptions(**fields).validate(LIMIT)
    assert words in str(refused.value)
