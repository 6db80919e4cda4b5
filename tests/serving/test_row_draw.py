"""``RowSampler.choose`` samples through ``row_draw`` (per-thread buffers, only top-k's tokens
carried on): every token and every generator state must be those of the reference,
``filter_logits`` then ``draw`` on a fresh float64 copy of the row."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from serving.generation import row_draw, sampling
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler

SPECIALS = [0.0, 1.0, -1.0, 2.5, -np.inf, np.inf, np.nan, -800.0]


def reference(row: np.ndarray, options: DecodingOptions, eos_id: int, generated: int, suppress):
    """(token, generator state after) of the reference path: clean copy, bans, filter, draw."""
    rng = np.random.default_rng(options.seed)
    x = sampling.clean_logits(row)
    if generated < options.min_new_tokens:
        x[eos_id] = -np.inf
    x[np.asarray(suppress, dtype=np.int64)] = -np.inf
    if not np.isfinite(x).any():
        return eos_id, rng.bit_generator.state
    filtered = sampling.filter_logits(
        x, temperature=options.temperature, top_k=options.top_k, top_p=options.top_p
    )
    return sampling.draw(filtered, rng), rng.bit_generator.state


def ours(row: np.ndarray, options: DecodingOptions, eos_id: int, generated: int, suppress):
    sampler = RowSampler(options, eos_id=eos_id, suppress_ids=tuple(suppress))
    token = sampler.choose(row, generated)
    return token, sampler.rng.bit_generator.state


@st.composite
def sampled_rows(draw: st.DrawFn):
    vocab = draw(st.integers(2, 1500))  # past NUCLEUS_PREFIX: top-p's prefix and full ranking
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    spread = draw(st.sampled_from([0.5, 4.0, 40.0]))  # flat to peaked distributions
    base = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(vocab) * spread
    row = base.astype(dtype)
    specials = draw(st.lists(st.tuples(st.integers(0, vocab - 1), st.sampled_from(SPECIALS))))
    for index, value in specials:
        row[index] = value
    if draw(st.booleans()):  # ties: a few values repeated across the row
        row = np.round(row.astype(np.float64) * 2).astype(dtype)
    options = DecodingOptions(
        temperature=draw(st.sampled_from([1e-3, 0.3, 1.0, 2.0, 50.0])),
        top_k=draw(st.sampled_from([0, 1, 2, 5, 50, 300, vocab - 1, vocab, vocab + 3])),
        top_p=draw(st.sampled_from([1.0, 0.999, 0.95, 0.5, 0.1, 1e-6])),
        min_new_tokens=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**64 - 1)),
    )
    eos_id = draw(st.integers(0, vocab - 1))
    suppress = draw(st.sets(st.integers(0, vocab - 1), max_size=4))
    return row, options, eos_id, draw(st.integers(0, 4)), sorted(suppress)


@settings(max_examples=600, deadline=None)
@given(sampled_rows())
def test_choose_draws_the_reference_token(case) -> None:
    row, options, eos_id, generated, suppress = case
    with np.errstate(all="ignore"):
        expected = reference(row, options, eos_id, generated, suppress)
        assert ours(row, options, eos_id, generated, suppress) == expected


def test_a_large_vocabulary_draws_the_reference_tokens() -> None:
    """Marian's 58,101 tokens, peaked and flat rows, every filter: 64 draws each."""
    rng = np.random.default_rng(3)
    for spread in (1.0, 6.0):
        rows = (rng.standard_normal((8, 58101)) * spread).astype(np.float32)
        for top_k, top_p in ((0, 1.0), (50, 1.0), (0, 0.95), (50, 0.9), (1000, 0.99)):
            for i, row in enumerate(rows):
                options = DecodingOptions(temperature=0.8, top_k=top_k, top_p=top_p, seed=i)
                sampler = RowSampler(options, eos_id=0)
                expected_rng = np.random.default_rng(i)
                for generated in range(8):
                    token = sampler.choose(row, generated)
                    x = sampling.clean_logits(row)
                    filtered = sampling.filter_logits(x, temperature=0.8, top_k=top_k, top_p=top_p)
                    assert token == sampling.draw(filtered, expected_rng)


def test_threads_and_row_sizes_do_not_share_a_row() -> None:
    """Each thread samples into its own buffers; rows of another size in between do not leak
    into the next draw."""
    rng = np.random.default_rng(9)
    rows = [rng.standard_normal(size).astype(np.float32) * 3 for size in (7, 58101, 300, 58101)]
    options = DecodingOptions(temperature=1.0, top_k=20, top_p=0.9, seed=5)
    expected = [reference(row, options, 0, 5, [])[0] for row in rows]
    results: dict[int, list[int]] = {}

    def work(key: int) -> None:
        results[key] = [
            RowSampler(options, eos_id=0).choose(row, 5) for _ in range(20) for row in rows
        ]

    threads = [threading.Thread(target=work, args=(key,)) for key in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(tokens == expected * 20 for tokens in results.values())


@settings(max_examples=300, deadline=None)
@given(sampled_rows())
def test_each_stage_holds_the_reference_values(case) -> None:
    """The scaled row bit for bit, the possible tokens exactly the reference's finite ones."""
    row, options, *_ = case
    x = sampling.clean_logits(row)
    if not np.isfinite(x).any():
        return
    with np.errstate(all="ignore"):
        expected = (x - x.max()) / options.temperature
        filtered = sampling.filter_logits(
            x, temperature=options.temperature, top_k=options.top_k, top_p=options.top_p
        )
        mine = row_draw.float_row(row)
        row_draw.scale_row(mine, options.temperature)
        np.testing.assert_array_equal(mine, expected)
        ids = row_draw.possible_tokens(mine, options.top_k, options.top_p)
    finite = np.flatnonzero(np.isfinite(filtered))
    possible = ids if ids is not None else np.flatnonzero(np.isfinite(mine))
    np.testing.assert_array_equal(possible, finite)
    np.testing.assert_array_equal(mine[finite], filtered[finite])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3000),
    st.data(),
)
def test_masked_sum_groups_as_numpy_sums_the_whole_row(size: int, data) -> None:
    """Numpy's pairwise sum of a row of zeros and values, whose rounding depends on where the
    values lie (a sum of the values alone differs in the last bits)."""
    ids = np.asarray(sorted(data.draw(st.sets(st.integers(0, size - 1), min_size=1))))
    values = data.draw(
        hnp.arrays(np.float64, ids.size, elements=st.floats(1e-30, 1.0, allow_subnormal=False))
    )
    full = np.zeros(size)
    full[ids] = values
    assert row_draw.masked_sum(values, ids, size) == full.sum()
    assert not row_draw._BUFFERS.of(size)[2].any()  # the zero row is zeros again


@settings(max_examples=200, deadline=None)
@given(st.integers(60, 3000), st.integers(0, 2**32 - 1), st.integers(1, 49))
def test_top_p_on_a_boundary_keeps_the_reference_tokens(size: int, seed: int, rank: int) -> None:
    """``top_p`` set to exactly the mass the reference ranks before some token of top-k's 50
    (ties impossible): that token is out only by the last bits, which a normaliser summed in
    another order would move."""
    rng = np.random.default_rng(seed)
    x = sampling.clean_logits(rng.standard_normal(size) * 2)
    scaled = (x - x.max()) / 0.7
    kept = scaled.copy()
    kept[kept < sampling.kth_largest(kept, 50)] = -np.inf
    probs = sampling._exp_from_max(kept)
    probs /= probs.sum()
    _, before, _ = sampling._ranked_mass(probs, np.flatnonzero(probs > 0))
    top_p = float(before[rank])
    filtered = sampling.filter_logits(x, temperature=0.7, top_k=50, top_p=top_p)
    mine = row_draw.float_row(x)
    row_draw.scale_row(mine, 0.7)
    ids = row_draw.possible_tokens(mine, 50, top_p)
    np.testing.assert_array_equal(ids, np.flatnonzero(np.isfinite(filtered)))
    assert ids is not None and ids.size == rank
