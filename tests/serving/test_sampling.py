"""Decoding options and per-row sampling (serving.generation.options / .sampling).

The filtering is checked against the PyTorch reference ``models.generation.sample_next`` (torch is
imported only inside that test); the sampler itself is numpy only.
"""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from serving.errors import InvalidArgument
from serving.generation import ranking, sampling
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler, filter_logits, log_softmax

EOS = 2


def sampler(seed: int | None = 0, eos_id: int = EOS, **options: object) -> RowSampler:
    return RowSampler(DecodingOptions(seed=seed, **options), eos_id=eos_id)  # type: ignore[arg-type]


def counts(chooser: RowSampler, logits: np.ndarray, draws: int, generated: int = 0) -> np.ndarray:
    tally = np.zeros(logits.shape[-1], dtype=np.int64)
    for _ in range(draws):
        tally[chooser.choose(logits, generated)] += 1
    return tally


# --- DecodingOptions.validate ------------------------------------------------------------------
def test_defaults_resolve_max_new_tokens_to_the_limit() -> None:
    options = DecodingOptions()
    resolved = options.validate(64)
    assert resolved.max_new_tokens == 64
    assert options.max_new_tokens is None  # validate returns a copy
    assert resolved == DecodingOptions(max_new_tokens=64)
    assert DecodingOptions(max_new_tokens=10).validate(64).max_new_tokens == 10


def test_options_are_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        DecodingOptions().temperature = 1.0  # type: ignore[misc]


def test_max_new_tokens_over_the_limit_names_the_limit() -> None:
    with pytest.raises(
        InvalidArgument, match="max_new_tokens 500 exceeds this model's limit of 64"
    ):
        DecodingOptions(max_new_tokens=500).validate(64)
    assert InvalidArgument.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_new_tokens": 0}, r"max_new_tokens 0 is out of range: must be >= 1"),
        ({"max_new_tokens": -3}, r"max_new_tokens"),
        ({"max_new_tokens": 2.5}, r"max_new_tokens must be an integer"),
        ({"min_new_tokens": -1}, r"min_new_tokens -1 is out of range"),
        ({"min_new_tokens": 9, "max_new_tokens": 8}, r"min_new_tokens 9 exceeds max_new_tokens 8"),
        ({"min_new_tokens": 65}, r"min_new_tokens 65 exceeds max_new_tokens 64.*0\.\.64"),
        ({"beam_size": 0}, r"beam_size 0 is out of range: must be in 1\.\.8"),
        ({"beam_size": 9}, r"beam_size 9 .*1\.\.8"),
        ({"beam_size": True}, r"beam_size must be an integer"),
        ({"beam_size": 2, "temperature": 0.7}, r"beam_size 2 cannot be combined with sampling"),
        ({"temperature": -0.1}, r"temperature -0\.1 is out of range.*\[0, 100\]"),
        ({"temperature": 101.0}, r"temperature 101"),
        ({"temperature": math.nan}, r"temperature nan is not finite"),
        ({"temperature": math.inf}, r"temperature inf is not finite"),
        ({"temperature": "hot"}, r"temperature must be a finite number"),
        ({"top_k": -1}, r"top_k -1 is out of range: must be >= 0"),
        ({"top_k": 1.5}, r"top_k must be an integer"),
        ({"top_p": 0.0}, r"top_p 0 keeps no token: top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p 1\.5 is out of range"),
        ({"top_p": -0.5}, r"top_p -0\.5"),
        ({"top_p": math.nan}, r"top_p nan is not finite"),
        ({"length_penalty": -1.0}, r"length_penalty -1(\.0)? is out of range.*\[0, 10\]"),
        ({"length_penalty": 10.5}, r"length_penalty 10\.5"),
        ({"length_penalty": -math.inf}, r"length_penalty -inf is not finite"),
        ({"num_alternatives": 1}, r"num_alternatives 1 .*beam_size 1.*0\.\.0"),
        ({"num_alternatives": 4, "beam_size": 4}, r"num_alternatives 4 .*0\.\.3"),
        ({"num_alternatives": -1, "beam_size": 4}, r"num_alternatives -1 is out of range"),
        ({"seed": -1}, r"seed -1 is out of range: must be in 0\.\.18446744073709551615"),
        ({"seed": 2**64}, r"seed 18446744073709551616 is out of range"),
        ({"seed": 1.0}, r"seed must be an integer"),
    ],
)
def test_invalid_options_say_what_to_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        DecodingOptions(**fields).validate(64)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"beam_size": 8, "num_alternatives": 7, "length_penalty": 0.0},
        {"beam_size": 4, "length_penalty": 10.0, "min_new_tokens": 64},
        {"temperature": 100.0, "top_k": 10**6, "top_p": 1e-9, "seed": 2**64 - 1},
        {"temperature": 0.5, "top_p": 1.0, "seed": 0, "max_new_tokens": 64},
        {"top_k": np.int64(5), "temperature": np.float32(0.5)},
    ],
)
def test_edge_values_are_accepted(fields: dict[str, object]) -> None:
    resolved = DecodingOptions(**fields).validate(64)  # type: ignore[arg-type]
    assert resolved.max_new_tokens == 64


def test_a_bad_limit_is_a_configuration_bug() -> None:
    with pytest.raises(ValueError, match="max_new_tokens_limit"):
        DecodingOptions().validate(0)


# --- log_softmax -------------------------------------------------------------------------------
def test_log_softmax_matches_the_definition_and_is_stable() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 7))
    expected = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_softmax(logits), expected, rtol=1e-12, atol=1e-12)
    big = np.array([1e4, 1e4 - 1.0, -1e4])
    out = log_softmax(big)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.exp(out).sum(), 1.0)
    np.testing.assert_allclose(out[0] - out[1], 1.0)


def test_log_softmax_dtypes_and_infinities() -> None:
    half = np.array([[1.0, 2.0, -np.inf]], dtype=np.float16)
    out = log_softmax(half)
    assert out.dtype == np.float32
    assert out[0, 2] == -np.inf and np.isfinite(out[0, :2]).all()
    assert log_softmax(np.zeros(3, dtype=np.float32)).dtype == np.float32
    dead = log_softmax(np.full((2, 3), -np.inf))
    assert np.isneginf(dead).all()  # not NaN
    np.testing.assert_allclose(log_softmax(np.zeros((2, 4)), axis=0), np.log(0.5))


def _log_softmax_reference(x: np.ndarray) -> np.ndarray:
    """The formula before its passes were trimmed (2026-11-28): every value must stay the same."""
    x = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        out = shifted - lse
    return np.where(np.isneginf(lse), -np.inf, out).astype(x.dtype, copy=False)


LOGITS = hnp.arrays(
    st.sampled_from([np.float16, np.float32, np.float64]),
    hnp.array_shapes(min_dims=2, max_dims=2, max_side=40),
    elements=st.one_of(
        st.floats(-60, 60, width=16),
        st.sampled_from([-np.inf, np.inf, np.nan]),
    ),
)


@given(LOGITS)
@settings(max_examples=300, deadline=None)
def test_log_softmax_and_clean_logits_keep_every_value(logits: np.ndarray) -> None:
    """Bit for bit what the formulas gave before (beam search's scores depend on them)."""
    cleaned = sampling.clean_logits(logits)
    reference = np.nan_to_num(
        np.array(logits, dtype=np.float64),
        nan=-np.inf,
        posinf=np.finfo(np.float64).max,
        neginf=-np.inf,
    )
    np.testing.assert_array_equal(cleaned, reference)
    assert cleaned.dtype == np.float64 and not np.shares_memory(cleaned, logits)
    for x in (cleaned, logits):
        with np.errstate(invalid="ignore", over="ignore"):
            expected = _log_softmax_reference(np.asarray(x))
            got = log_softmax(x)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


@given(
    st.lists(st.sampled_from([-np.inf, -2.0, -1.0, 0.0, 0.5, 3.0]), min_size=1, max_size=3000),
    st.integers(1, 24),
    st.sampled_from([4, 16, 128]),
)
@settings(max_examples=300, deadline=None)
def test_top_indices_are_the_largest_with_ties_by_lower_index(
    values: list[float], count: int, block: int
) -> None:
    """Against a full sort by (value descending, index ascending), on values full of ties."""
    array = np.asarray(values)
    expected = np.lexsort((np.arange(array.size), -array))[:count]
    np.testing.assert_array_equal(ranking.top_indices(array, count, block), expected)


@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 600),
        elements=st.one_of(st.floats(-700, 50), st.just(-np.inf)),
    ),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=300, deadline=None)
def test_exp_from_max_and_draw_keep_every_value(row: np.ndarray, seed: int) -> None:
    """``exp(x - max)`` computed only where x is finite gives the same values, so a draw takes
    the token the plain formula took (same seed), whatever share of the row is -inf."""
    if not np.isfinite(row).any():
        row = np.append(row, 0.0)
    with np.errstate(under="ignore"):
        expected = np.exp(row - row.max())
        np.testing.assert_array_equal(sampling._exp_from_max(row), expected)
        cumulative = np.cumsum(expected)
        target = np.random.default_rng(seed).random() * cumulative[-1]
        token = int(np.searchsorted(cumulative, target, side="right"))
        if token >= expected.size:
            token = int(np.flatnonzero(expected)[-1])
        assert sampling.draw(row, np.random.default_rng(seed)) == token


@given(
    hnp.arrays(
        np.float64, st.integers(1, 3000), elements=st.sampled_from([-np.inf, -1.0, 0.0, 2.5])
    ),
    st.integers(1, 300),
)
@settings(max_examples=300, deadline=None)
def test_kth_largest_is_what_a_full_partition_gives(values: np.ndarray, k: int) -> None:
    k = min(k, values.size)
    expected = np.partition(values, values.size - k)[values.size - k]
    assert ranking.kth_largest(values, k) == expected


# --- greedy and seeding ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_greedy_is_argmax(dtype: type) -> None:
    rng = np.random.default_rng(1)
    greedy = sampler(seed=None)
    for _ in range(20):
        row: np.ndarray = (rng.standard_normal(50) * 3).astype(dtype)
        assert greedy.choose(row, 5) == int(np.argmax(row))
    assert greedy.choose(np.array([1.0, 3.0, 3.0, 0.0], dtype=dtype), 0) == 1  # lowest id on ties


def test_greedy_consumes_no_randomness() -> None:
    chooser = sampler(seed=7)
    state = chooser.rng.bit_generator.state
    chooser.choose(np.arange(5.0), 0)
    assert chooser.rng.bit_generator.state == state


def test_greedy_rows_make_no_generator_and_sampling_makes_one_on_the_first_draw() -> None:
    greedy = sampler()
    greedy.choose(np.arange(5.0), 0)
    assert greedy._rng is None  # seeding from OS entropy costs ~15 us per request
    sampling = sampler(temperature=1.0, seed=3)
    assert sampling._rng is None
    first = sampling.choose(np.zeros(50), 0)
    assert sampling._rng is not None
    assert first == sampler(temperature=1.0, seed=3).choose(np.zeros(50), 0)


def test_seeded_sampling_is_reproducible_and_seeds_differ() -> None:
    logits = np.random.default_rng(2).standard_normal(100)

    def run(seed: int | None) -> list[int]:
        chooser = sampler(seed=seed, temperature=1.5)
        return [chooser.choose(logits, step) for step in range(40)]

    assert run(1234) == run(1234)
    assert run(1234) != run(1235)
    assert run(2**64 - 1) == run(2**64 - 1)
    assert run(None) != run(None)  # OS entropy (a collision has probability ~100**-40)


def test_a_seeded_row_does_not_depend_on_its_batch_mates() -> None:
    rng = np.random.default_rng(3)
    batches = rng.standard_normal((30, 4, 64)).astype(np.float32)
    alone = sampler(seed=99, temperature=0.8, top_k=20, top_p=0.9)
    alone_tokens = [alone.choose(batch[0], step) for step, batch in enumerate(batches)]
    rows = [sampler(seed=99, temperature=0.8, top_k=20, top_p=0.9)] + [
        sampler(seed=None, temperature=1.0) for _ in range(3)
    ]
    batched_tokens = []
    for step, batch in enumerate(batches):  # other rows draw between this row's draws
        chosen = [row.choose(batch[i], step) for i, row in reversed(list(enumerate(rows)))]
        batched_tokens.append(chosen[-1])
    assert batched_tokens == alone_tokens


# --- top-k / top-p ------------------------------------------------------------------------------
def test_top_k_1_is_greedy() -> None:
    rng = np.random.default_rng(4)
    chooser = sampler(seed=5, temperature=2.0, top_k=1)
    for _ in range(50):
        row = rng.standard_normal(30)
        assert chooser.choose(row, 3) == int(np.argmax(row))


def test_top_k_never_draws_outside_the_k_best() -> None:
    logits = np.random.default_rng(5).standard_normal(40) * 0.1  # nearly flat: all would appear
    tally = counts(sampler(seed=6, temperature=1.0, top_k=5), logits, 2000)
    best = set(np.argsort(-logits)[:5].tolist())
    assert set(np.flatnonzero(tally).tolist()) == best


def test_top_p_keeps_the_nucleus() -> None:
    probs = np.array([0.05, 0.3, 0.5, 0.1, 0.05])
    logits = np.log(probs)
    # ranked 2 (0.5), 1 (0.3), 3 (0.1), ...: mass before 3 is 0.8 >= 0.75, so the nucleus is {2, 1}
    tally = counts(sampler(seed=7, eos_id=4, temperature=1.0, top_p=0.75), logits, 3000)
    assert set(np.flatnonzero(tally).tolist()) == {1, 2}
    np.testing.assert_allclose(tally[2] / tally.sum(), 0.5 / 0.8, atol=0.03)
    tiny = counts(sampler(seed=8, eos_id=4, temperature=1.0, top_p=0.01), logits, 200)
    assert set(np.flatnonzero(tiny).tolist()) == {2}  # the most likely token always stays


def test_top_p_prefix_shortcut_equals_a_full_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    rows = [rng.standard_normal(3000) * scale for scale in (0.5, 3.0, 8.0)]
    rows.append(np.round(rng.standard_normal(3000) * 4))  # many ties
    for row in rows:
        for top_p in (0.3, 0.9, 0.999):
            short = filter_logits(row, temperature=0.7, top_p=top_p)
            monkeypatch.setattr(sampling, "NUCLEUS_PREFIX", 10**9)
            full = filter_logits(row, temperature=0.7, top_p=top_p)
            monkeypatch.undo()
            np.testing.assert_array_equal(short, full)


def test_top_p_boundary_drops_a_token_whose_prior_mass_equals_top_p() -> None:
    # four equal tokens (exactly 0.25 each), ranked in vocabulary order: masses before them are
    # 0, 0.25, 0.5, 0.75; as in sample_next a token is dropped once that mass reaches top_p.
    out = filter_logits(np.zeros(4), temperature=1.0, top_p=0.5)
    assert np.isfinite(out).tolist() == [True, True, False, False]
    out = filter_logits(np.zeros(4), temperature=1.0, top_p=0.5000001)
    assert np.isfinite(out).tolist() == [True, True, True, False]


class _FixedUniform:
    """Stands in for np.random.Generator: random() returns a chosen number."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_draw_never_returns_a_zero_probability_token() -> None:
    filtered = np.array([-np.inf, -np.inf, 0.0, -np.inf, 0.0, -np.inf])
    assert sampling.draw(filtered, _FixedUniform(0.0)) == 2  # type: ignore[arg-type]
    assert sampling.draw(filtered, _FixedUniform(0.5)) == 4  # type: ignore[arg-type]
    assert sampling.draw(filtered, _FixedUniform(1.0 - 2**-53)) == 4  # type: ignore[arg-type]
    assert sampling.draw(filtered, _FixedUniform(1.0)) == 4  # type: ignore[arg-type]


def test_filter_logits_shifts_and_scales() -> None:
    out = filter_logits(np.array([1.0, 3.0, 2.0]), temperature=0.5)
    np.testing.assert_allclose(out, [-4.0, 0.0, -2.0])
    tiny = filter_logits(np.array([1.0, 3.0, np.nan, np.inf]), temperature=1e-300)
    assert tiny[3] == 0.0 and np.isneginf(tiny[2])  # NaN -> -inf, +inf -> largest; no overflow
    with pytest.raises(ValueError, match="temperature > 0"):
        filter_logits(np.zeros(3), temperature=0.0)
    with pytest.raises(ValueError, match="no token"):
        filter_logits(np.full(3, -np.inf), temperature=1.0)


# --- min_new_tokens and degenerate rows ----------------------------------------------------------
def test_min_new_tokens_suppresses_eos() -> None:
    logits = np.array([0.0, 1.0, 9.0, 0.5])  # EOS (2) is by far the most likely
    greedy = sampler(min_new_tokens=3)
    assert [greedy.choose(logits, step) for step in range(5)] == [1, 1, 1, EOS, EOS]
    hot = sampler(seed=10, min_new_tokens=3, temperature=1.0)
    assert EOS not in [hot.choose(logits, step) for step in range(3) for _ in range(200)]
    assert counts(hot, logits, 50, generated=3)[EOS] > 40


def test_impossible_rows_end_the_sequence() -> None:
    only_eos = np.array([-np.inf, -np.inf, 0.0, -np.inf])
    assert sampler(min_new_tokens=2).choose(only_eos, 0) == EOS
    assert sampler(temperature=1.0).choose(np.full(4, np.nan), 0) == EOS
    assert sampler(temperature=1.0).choose(np.array([0.0, np.inf, 1.0, np.inf]), 0) in (1, 3)


def test_bad_rows_and_options_raise() -> None:
    with pytest.raises(ValueError, match="one row"):
        sampler().choose(np.zeros((2, 4)), 0)
    with pytest.raises(ValueError, match="eos_id 7"):
        sampler(eos_id=7).choose(np.zeros(4), 0)
    with pytest.raises(ValueError, match="bad sampling options"):
        sampler(top_p=0.0)
    with pytest.raises(ValueError, match="eos_id"):
        sampler(eos_id=-1)


# --- statistics and the PyTorch reference --------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_temperature_frequencies_match_softmax(temperature: float) -> None:
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -1.5], dtype=np.float32)
    draws = 6000
    tally = counts(sampler(seed=11, eos_id=5, temperature=temperature), logits, draws)
    expected = np.exp(logits / temperature)
    expected = draws * expected / expected.sum()
    chi2 = float(((tally - expected) ** 2 / expected).sum())
    assert chi2 < 30.0, (chi2, tally, expected)  # 5 degrees of freedom: p(chi2 > 30) ~ 1.5e-5


OPTION_GRID = [
    (1.0, 0, 1.0),
    (0.7, 5, 1.0),
    (1.3, 0, 0.8),
    (0.5, 20, 0.5),
    (2.0, 3, 0.95),
    (1.0, 0, 0.05),
    (0.9, 400, 0.97),
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), OPTION_GRID)
def test_filtering_equals_models_generation_sample_next(
    temperature: float, top_k: int, top_p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from models.generation import sample_next

    captured: list[np.ndarray] = []

    def capture(probs: object, num_samples: int, generator: object = None) -> object:
        captured.append(probs.double().numpy())  # type: ignore[attr-defined]
        return torch.zeros(probs.shape[0], num_samples, dtype=torch.long)  # type: ignore[attr-defined]

    monkeypatch.setattr(torch, "multinomial", capture)
    rng = np.random.default_rng(12)
    logits = rng.standard_normal((8, 50)) * 2
    wide = rng.standard_normal((3, 1000)) * 4  # exercises the top-p prefix shortcut
    for batch in (logits, wide):
        captured.clear()
        sample_next(
            torch.from_numpy(batch.astype(np.float32)),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        (reference,) = captured
        for row, probs in zip(batch.astype(np.float32), reference, strict=True):
            ours = filter_logits(row, temperature=temperature, top_k=top_k, top_p=top_p)
            allowed = np.isfinite(ours)
            np.testing.assert_array_equal(allowed, probs > 0)
            mine = np.exp(ours - ours.max())
            np.testing.assert_allclose(mine / mine.sum(), probs, atol=1e-6)


# --- properties ---------------------------------------------------------------------------------
@st.composite
def rows_and_options(draw: st.DrawFn) -> tuple[np.ndarray, DecodingOptions, int, int]:
    vocab = draw(st.integers(2, 40))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    row = draw(hnp.arrays(dtype, vocab, elements=st.floats(-30, 30, allow_nan=False, width=16)))
    greedy = draw(st.booleans())
    options = DecodingOptions(
        temperature=0.0 if greedy else draw(st.floats(0.01, 100.0)),
        top_k=draw(st.integers(0, vocab + 2)),
        top_p=draw(st.floats(1e-6, 1.0)),
        min_new_tokens=draw(st.integers(0, 5)),
        seed=draw(st.integers(0, 2**64 - 1)),
    )
    options.validate(64)
    return row, options, draw(st.integers(0, vocab - 1)), draw(st.integers(0, 8))


@settings(max_examples=300, deadline=None)
@given(rows_and_options())
def test_choose_returns_an_allowed_token(
    case: tuple[np.ndarray, DecodingOptions, int, int],
) -> None:
    row, options, eos_id, generated = case
    token = RowSampler(options, eos_id=eos_id).choose(row, generated)
    assert isinstance(token, int) and 0 <= token < row.size
    suppressed = generated < options.min_new_tokens
    if suppressed:
        assert token != eos_id
    values = row.astype(np.float64)
    if suppressed:
        values[eos_id] = -np.inf
    if options.temperature == 0:
        assert values[token] == values.max()
    elif 0 < options.top_k < row.size:
        assert values[token] >= np.sort(values)[-options.top_k]  # within the top-k (ties kept)


GreedyBatch = tuple[np.ndarray, np.ndarray, np.ndarray, int, tuple, np.ndarray]


@st.composite
def greedy_batches(draw: st.DrawFn) -> GreedyBatch:
    """Rows of logits with ties, NaN, +-inf, and per-row generated / min_new_tokens / forced EOS."""
    vocab = draw(st.integers(2, 12))
    n = draw(st.integers(1, 8))
    values = st.one_of(
        st.sampled_from([0.0, 1.0, -np.inf, np.inf, np.nan]), st.floats(-5, 5, width=32)
    )
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    logits = draw(hnp.arrays(dtype, (n, vocab), elements=values))
    eos_id = draw(st.integers(0, vocab - 1))
    suppress = tuple(draw(st.sets(st.integers(0, vocab - 1), max_size=3)))
    generated = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    min_new = np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    forced = np.array(draw(st.lists(st.integers(-1, 6), min_size=n, max_size=n)))
    return logits, generated, min_new, eos_id, suppress, forced


@settings(max_examples=400, deadline=None)
@given(greedy_batches())
def test_greedy_rows_choose_what_each_row_s_sampler_chooses(case: GreedyBatch) -> None:
    """The engine's one-pass greedy choice: every row it decides gets the token its own
    RowSampler would choose; it defers only rows whose winner is NaN, suppressed, or an EOS
    before min_new_tokens."""
    from serving.generation.sampling import greedy_rows

    logits, generated, min_new, eos_id, suppress, forced = case
    samplers = [
        RowSampler(
            DecodingOptions(temperature=0.0, min_new_tokens=int(m)),
            eos_id=eos_id,
            suppress_ids=suppress,
            forced_eos_at=None if f < 0 else int(f),
        )
        for m, f in zip(min_new, forced, strict=True)
    ]
    chosen = greedy_rows(logits, generated, min_new, eos_id, samplers[0].suppress, forced)
    for row, token, sampler, done in zip(logits, chosen, samplers, generated, strict=True):
        expected = sampler.choose(row, int(done))
        if token >= 0:
            assert token == expected
        else:
            winner = int(np.argmax(row))
            assert (
                np.isnan(row[winner])
                or winner in suppress
                or (winner == eos_id and done < sampler.options.min_new_tokens)
            )


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(-3, 60)),
    hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(-3, 60)),
)
def test_is_in_is_numpy_isin(values: np.ndarray, ids: np.ndarray) -> None:
    """The step's membership test (by comparison up to 16 ids, ``np.isin`` beyond)."""
    from serving.generation.sampling import is_in

    assert is_in(values, ids).tolist() == np.isin(values, ids).tolist()
