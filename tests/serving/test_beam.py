"""Beam search (serving.generation.beam) on small numpy "models" checked by brute force.

A model here is a function from the generated prefix (a tuple of token ids, start token
excluded) to the next-token logits. ``run_beam`` plays the engine: it keeps one history per batch
row, reorders the rows by ``parent_rows`` and appends ``next_tokens``, so a model that reads the
whole prefix also checks that the returned parents are right.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.generation.beam import BeamSearch, Hypothesis
from serving.generation.sampling import log_softmax

Model = Callable[[tuple[int, ...]], np.ndarray]
EOS = 0


def run_beam(model: Model, search: BeamSearch, first_rows: int = 1) -> list[Hypothesis]:
    """Drive ``search`` like the engine does; ``first_rows`` rows of logits on the first step."""
    histories: list[tuple[int, ...]] = [()] * first_rows
    while not search.done:
        logits = np.stack([model(history) for history in histories])
        parents, tokens = search.step(logits)
        assert parents.shape == tokens.shape == (search.beam_size,)
        assert parents.dtype == tokens.dtype == np.int64
        assert ((parents >= 0) & (parents < len(histories))).all()
        histories = [histories[p] + (int(t),) for p, t in zip(parents, tokens, strict=True)]
    return search.best()


def markov(table: np.ndarray) -> Model:
    """A Markov chain: logits depend on the last token only (row ``V`` = the start state)."""
    vocab = table.shape[1]
    return lambda prefix: table[prefix[-1] if prefix else vocab]


def random_tree(seed: int, vocab: int, viable: int | None = None) -> Model:
    """A model whose logits are a fixed random function of the whole prefix.

    With ``viable`` set, only that many tokens (EOS possibly among them) are possible after each
    prefix; the others have -inf logits.
    """

    def model(prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        logits = rng.standard_normal(vocab) * 2.0
        if viable is not None:
            blocked = rng.permutation(vocab)[viable:]
            logits[blocked] = -np.inf
        return logits

    return model


def brute_force(
    model: Model, vocab: int, max_new: int, min_new: int = 0, length_penalty: float = 1.0
) -> list[Hypothesis]:
    """Every possible output (EOS-terminated, or cut at ``max_new``), best score first."""
    found: list[Hypothesis] = []

    def walk(prefix: tuple[int, ...], log_prob: float) -> None:
        row = log_softmax(np.asarray(model(prefix), dtype=np.float64))
        length = len(prefix) + 1
        for token in range(vocab):
            total = log_prob + float(row[token])
            if total == -np.inf or (token == EOS and len(prefix) < min_new):
                continue
            if token == EOS:
                found.append(Hypothesis(list(prefix), total / length**length_penalty, True))
            elif length == max_new:
                found.append(Hypothesis([*prefix, token], total / length**length_penalty, False))
            else:
                walk((*prefix, token), total)

    walk((), 0.0)
    return sorted(found, key=lambda hyp: -hyp.score)


def rescore(model: Model, hyp: Hypothesis, length_penalty: float, min_new: int = 0) -> float:
    """The length-penalised log-prob of ``hyp`` under ``model`` (EOS suppression as in search)."""
    tokens = [*hyp.tokens, EOS] if hyp.finished else hyp.tokens
    total = 0.0
    for index, token in enumerate(tokens):
        row = log_softmax(np.asarray(model(tuple(tokens[:index])), dtype=np.float64))
        total += float(row[token])
        assert not (token == EOS and index < min_new)
    return total / len(tokens) ** length_penalty


def greedy(model: Model, max_new: int) -> list[int]:
    out: list[int] = []
    for _ in range(max_new):
        token = int(np.argmax(model(tuple(out))))
        if token == EOS:
            break
        out.append(token)
    return out


# --- a hand-made Markov chain where greedy goes wrong ------------------------------------------
def trap_table() -> np.ndarray:
    probs = np.array(
        [
            [0.97, 0.01, 0.01, 0.01],  # after EOS (unused)
            [0.00, 0.34, 0.33, 0.33],  # 1: a flat wander that never ends
            [0.90, 0.05, 0.00, 0.05],  # 2: ends at once
            [0.50, 0.00, 0.00, 0.50],  # 3
            [0.00, 0.55, 0.45, 0.00],  # start: 1 is a little more likely than 2
        ]
    )
    with np.errstate(divide="ignore"):
        return np.log(probs)


def test_finds_the_brute_force_best_on_a_hand_made_markov_chain() -> None:
    model = markov(trap_table())
    best = brute_force(model, vocab=4, max_new=4)[0]
    assert best.tokens == [2] and best.finished
    assert greedy(model, 4) == [1, 1, 1, 1]  # greedy walks into the trap
    found = run_beam(model, BeamSearch(beam_size=2, eos_id=EOS, max_new_tokens=4))
    assert (found[0].tokens, found[0].finished) == ([2], True)
    assert found[0].score == pytest.approx(best.score, abs=1e-12)
    assert found[0].score == pytest.approx((np.log(0.45) + np.log(0.9)) / 2)


@pytest.mark.parametrize("length_penalty", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("min_new", [0, 2])
def test_exhaustive_beam_equals_brute_force(length_penalty: float, min_new: int) -> None:
    # Two possible tokens after each prefix and beam 8: until the last step every continuation
    # fits in the beam, so with the exact stopping bound the search cannot miss the best output.
    for seed in range(25):
        model = random_tree(seed, vocab=4, viable=2)
        expected = brute_force(model, 4, max_new=4, min_new=min_new, length_penalty=length_penalty)
        search = BeamSearch(
            beam_size=8,
            eos_id=EOS,
            max_new_tokens=4,
            min_new_tokens=min_new,
            length_penalty=length_penalty,
            num_alternatives=2,
            early_stopping="never",
        )
        found = run_beam(model, search)
        assert found[0].tokens == expected[0].tokens, seed
        assert found[0].finished == expected[0].finished
        assert found[0].score == pytest.approx(expected[0].score, abs=1e-9)
        assert [h.score for h in found] == pytest.approx([h.score for h in expected[:3]], abs=1e-9)


def test_default_stopping_is_exact_without_length_penalty() -> None:
    # Without length penalty a live beam's score only falls, so HF's heuristic is exact: all 8
    # kept hypotheses are the 8 best outputs.
    for seed in range(25):
        model = random_tree(100 + seed, vocab=4, viable=2)
        expected = brute_force(model, 4, max_new=4, length_penalty=0.0)[:8]
        search = BeamSearch(8, EOS, max_new_tokens=4, length_penalty=0.0, num_alternatives=7)
        found = run_beam(model, search)
        assert found[0].tokens == expected[0].tokens, seed
        assert [h.score for h in found] == pytest.approx([h.score for h in expected], abs=1e-9)


def test_default_heuristic_stops_where_hf_does_and_never_looks_further() -> None:
    # Step 0: EOS (0.55) beats token 1 (0.45); then 1 -> 1 -> 1 -> EOS is (almost) certain.
    # HF's default heuristic bounds the live beam at its current length (ln .45 / 1 < ln .55 / 1)
    # and stops with the empty output; "never" bounds it at max_new_tokens and finds [1, 1, 1],
    # whose length-normalised score (~ln .45 / 4) is far better.
    table = np.full((5, 4), np.log(1e-6))
    table[4, EOS], table[4, 1] = np.log(0.55), np.log(0.45)
    table[1, 1] = 0.0
    table[1, EOS] = -2.0
    model = markov(table)

    def chain_model(prefix: tuple[int, ...]) -> np.ndarray:
        row = model(prefix).copy()
        if len(prefix) == 3:  # after three 1s, EOS
            row[:] = np.log(1e-6)
            row[EOS] = 0.0
        return row

    heuristic = BeamSearch(1, EOS, max_new_tokens=4)
    assert run_beam(chain_model, heuristic)[0].tokens == []
    assert heuristic.generated == 1
    exact = BeamSearch(1, EOS, max_new_tokens=4, early_stopping="never")
    found = run_beam(chain_model, exact)[0]
    assert (found.tokens, found.finished) == ([1, 1, 1], True)
    assert found.score == pytest.approx(brute_force(chain_model, 4, 4)[0].score)


def test_heuristic_compares_with_the_worst_finished_hypothesis() -> None:
    # After step 1 the finished hypotheses are [] (ln .5) and [2] (ln .2 + ln .9); the live
    # beam [1, 3] (ln .3 + ln .95) is worse than the best but better than the worst, so the
    # search goes on and [1, 3] replaces [2] as the alternative.
    search = BeamSearch(2, EOS, max_new_tokens=5, length_penalty=0.0, num_alternatives=1)
    with np.errstate(divide="ignore"):
        search.step(np.log(np.array([[0.5, 0.3, 0.2, 0.0]])))
        search.step(np.log(np.array([[0.05, 0.0, 0.0, 0.95], [0.9, 0.0, 0.0, 0.1]])))
        assert not search.done
        search.step(np.log(np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])))
    assert search.done
    assert [h.tokens for h in search.best()] == [[], [1, 3]]


def test_only_the_top_beam_size_candidates_may_finish() -> None:
    # Step 0: EOS is the 4th candidate with beam 3, so (as in HF) it does not become a
    # hypothesis, although its score (ln .1) would beat every later output (ln .4 + ln .2).
    search = BeamSearch(3, EOS, max_new_tokens=2, length_penalty=0.0, num_alternatives=2)
    search.step(np.log(np.array([[0.1, 0.4, 0.3, 0.15, 0.05]])))
    search.step(np.zeros((3, 5)))
    found = search.best()
    assert search.done and [] not in [h.tokens for h in found]
    assert found[0].score == pytest.approx(np.log(0.4) + np.log(0.2))


@pytest.mark.parametrize("beam_size", [1, 2, 4, 8])
def test_never_beats_brute_force_and_scores_are_true(beam_size: int) -> None:
    for seed in range(15):
        table = np.random.default_rng(seed).standard_normal((5, 4)) * 2
        model = markov(table)
        optimum = brute_force(model, 4, max_new=4)[0].score
        found = run_beam(model, BeamSearch(beam_size, EOS, max_new_tokens=4))
        for hyp in found:
            assert hyp.score <= optimum + 1e-12
            assert hyp.score == pytest.approx(rescore(model, hyp, 1.0), abs=1e-12)


# --- beam size 1, shapes and the first step ----------------------------------------------------
def test_beam_size_1_is_greedy() -> None:
    for seed in range(30):
        model = markov(np.random.default_rng(seed).standard_normal((7, 6)) * 2)
        found = run_beam(model, BeamSearch(1, EOS, max_new_tokens=8, length_penalty=1.3))
        assert len(found) == 1
        assert found[0].tokens == greedy(model, 8), seed
        ended = len(found[0].tokens) < 8 or int(np.argmax(model(tuple(found[0].tokens)))) == EOS
        assert found[0].finished == ended


def test_first_step_accepts_one_row_or_beam_size_identical_rows() -> None:
    model = random_tree(7, vocab=9)
    one = run_beam(model, BeamSearch(4, EOS, max_new_tokens=6, num_alternatives=3))
    full = run_beam(model, BeamSearch(4, EOS, max_new_tokens=6, num_alternatives=3), first_rows=4)
    assert one == full
    search = BeamSearch(3, EOS, max_new_tokens=5)
    parents, tokens = search.step(np.tile(model(()), (3, 1)))
    assert parents.tolist() == [0, 0, 0]
    assert len(set(tokens.tolist())) == 3  # three different first tokens
    assert search.generated == 1


def test_parents_and_tokens_follow_the_live_beams() -> None:
    search = BeamSearch(2, EOS, max_new_tokens=5)
    log = np.log
    # step 0: tokens 1 (0.6) and 2 (0.3) become the two beams
    parents, tokens = search.step(log(np.array([[0.05, 0.6, 0.3, 0.05]])))
    assert (parents.tolist(), tokens.tolist()) == ([0, 0], [1, 2])
    # step 1: row 1 (prefix [2]) continues strongly; row 0 ends with EOS (a finished hypothesis)
    step1 = log(np.array([[0.7, 0.1, 0.1, 0.1], [0.01, 0.01, 0.01, 0.97]]))
    parents, tokens = search.step(step1)
    assert parents.tolist()[0] == 1 and tokens.tolist()[0] == 3
    best = search.best()[0]
    assert best.finished and best.tokens == [1]
    np.testing.assert_allclose(search.live_scores[0], log(0.3) + log(0.97))


def test_wrong_shapes_and_stepping_after_done_raise() -> None:
    search = BeamSearch(3, EOS, max_new_tokens=1)
    with pytest.raises(ValueError, match=r"\(1 or 3, V\)"):
        search.step(np.zeros((2, 5)))
    with pytest.raises(ValueError, match="eos_id"):
        BeamSearch(3, 7, max_new_tokens=1).step(np.zeros((1, 5)))
    search.step(np.zeros((1, 5)))
    assert search.done
    with pytest.raises(RuntimeError, match="done"):
        search.step(np.zeros((3, 5)))
    later = BeamSearch(3, EOS, max_new_tokens=4)
    later.step(np.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"\(3, V\)"):
        later.step(np.zeros((1, 5)))


@pytest.mark.parametrize(
    "arguments",
    [
        {"beam_size": 0},
        {"eos_id": -1},
        {"max_new_tokens": 0},
        {"min_new_tokens": 9},
        {"length_penalty": float("nan")},
        {"num_alternatives": 4},
        {"early_stopping": "sometimes"},
    ],
)
def test_bad_arguments_raise(arguments: dict[str, object]) -> None:
    values: dict[str, object] = {"beam_size": 4, "eos_id": EOS, "max_new_tokens": 8}
    values.update(arguments)
    with pytest.raises(ValueError):
        BeamSearch(**values)  # type: ignore[arg-type]


# --- lengths, EOS, penalties -------------------------------------------------------------------
def test_min_new_tokens_is_respected() -> None:
    eos_first = np.full((5, 4), -1.0)
    eos_first[:, EOS] = 5.0  # EOS is always by far the most likely
    model = markov(eos_first)
    for min_new in range(5):
        search = BeamSearch(3, EOS, max_new_tokens=6, min_new_tokens=min_new, num_alternatives=2)
        found = run_beam(model, search)
        assert all(len(h.tokens) >= min_new and EOS not in h.tokens for h in found)
        assert found[0].finished and len(found[0].tokens) == min_new
        assert found[0].score == pytest.approx(rescore(model, found[0], 1.0, min_new))


def test_max_new_tokens_truncates_live_beams() -> None:
    never_ends = np.zeros((5, 4))
    never_ends[:, EOS] = -np.inf
    never_ends[:, 1] = 1.0
    search = BeamSearch(2, EOS, max_new_tokens=3, num_alternatives=1)
    found = run_beam(markov(never_ends), search)
    assert search.done and search.generated == 3
    assert [h.finished for h in found] == [False, False]
    assert found[0].tokens == [1, 1, 1]
    assert all(len(h.tokens) == 3 for h in found)
    expected = 3 * float(log_softmax(never_ends[0])[1]) / 3
    assert found[0].score == pytest.approx(expected)


def test_length_penalty_moves_the_preference_from_short_to_long() -> None:
    # short = [1] + EOS: log-prob ln .6 + ln .75 = -0.80 over 2 tokens;
    # long = [2, 3, 3] + EOS: ln .4 + 2 ln .9 + ln .95 = -1.18 over 4 tokens.
    tree = {
        (): {1: 0.6, 2: 0.4},
        (1,): {EOS: 0.75, 3: 0.25},
        (2,): {3: 0.9, 1: 0.1},
        (2, 3): {3: 0.9, 1: 0.1},
        (2, 3, 3): {EOS: 0.95, 1: 0.05},
    }

    def model(prefix: tuple[int, ...]) -> np.ndarray:
        probs = np.full(4, 0.25) if prefix not in tree else np.zeros(4)
        for token, p in tree.get(prefix, {}).items():
            probs[token] = p
        with np.errstate(divide="ignore"):
            return np.log(probs)

    short_lp = np.log(0.6) + np.log(0.75)
    long_lp = np.log(0.4) + 2 * np.log(0.9) + np.log(0.95)
    for penalty, winner in [(0.0, [1]), (0.5, [1]), (1.0, [2, 3, 3]), (2.0, [2, 3, 3])]:
        found = run_beam(model, BeamSearch(2, EOS, max_new_tokens=6, length_penalty=penalty))
        assert found[0].tokens == winner, penalty
        expected = short_lp / 2**penalty if winner == [1] else long_lp / 4**penalty
        assert found[0].score == pytest.approx(expected)
        assert brute_force(model, 4, 6, length_penalty=penalty)[0].tokens == winner


def test_alternatives_are_distinct_and_sorted() -> None:
    model = random_tree(3, vocab=12)
    search = BeamSearch(5, EOS, max_new_tokens=7, num_alternatives=4)
    found = run_beam(model, search)
    assert len(found) == 5
    assert len({tuple(h.tokens) for h in found}) == 5
    scores = [h.score for h in found]
    assert scores == sorted(scores, reverse=True)
    assert len(run_beam(model, BeamSearch(5, EOS, max_new_tokens=7))) == 1


def test_best_before_done_includes_live_beams() -> None:
    search = BeamSearch(3, EOS, max_new_tokens=50, num_alternatives=2)
    logits = np.array([[-9.0, 1.0, 2.0, 3.0]])
    assert search.best()[0].tokens == []  # nothing generated yet
    search.step(logits)
    found = search.best()
    assert [h.tokens for h in found] == [[3], [2], [1]]
    assert not any(h.finished for h in found)
    assert found[0].score == pytest.approx(float(log_softmax(logits[0])[3]))


def test_impossible_logits_end_the_search() -> None:
    search = BeamSearch(2, EOS, max_new_tokens=5)
    parents, tokens = search.step(np.full((1, 4), np.nan))
    assert search.done and parents.shape == tokens.shape == (2,)
    assert search.best() == [Hypothesis([], float("-inf"), False)]


def test_early_stopping_true_stops_when_beam_size_hypotheses_finished() -> None:
    model = random_tree(11, vocab=5)
    eager = BeamSearch(2, EOS, max_new_tokens=12, early_stopping=True)
    patient = BeamSearch(2, EOS, max_new_tokens=12, early_stopping="never")
    run_beam(model, eager)
    run_beam(model, patient)
    assert eager.generated <= patient.generated


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_logits(dtype: type) -> None:
    table = np.random.default_rng(4).standard_normal((6, 5)) * 3
    reference = run_beam(markov(table), BeamSearch(3, EOS, max_new_tokens=5))
    low: np.ndarray = table.astype(dtype)
    found = run_beam(markov(low), BeamSearch(3, EOS, max_new_tokens=5))
    assert found[0].tokens == reference[0].tokens
    assert found[0].score == pytest.approx(reference[0].score, abs=2e-2)


# --- properties ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 5),
    beam_size=st.integers(1, 8),
    max_new=st.integers(1, 4),
    min_new=st.integers(0, 4),
    length_penalty=st.floats(0.0, 3.0),
    data=st.data(),
)
def test_hypotheses_are_well_formed(
    seed: int,
    vocab: int,
    beam_size: int,
    max_new: int,
    min_new: int,
    length_penalty: float,
    data: st.DataObject,
) -> None:
    min_new = min(min_new, max_new)
    alternatives = data.draw(st.integers(0, beam_size - 1))
    model = random_tree(seed, vocab)
    search = BeamSearch(beam_size, EOS, max_new, min_new, length_penalty, alternatives)
    found = run_beam(model, search)
    optimum = brute_force(model, vocab, max_new, min_new, length_penalty)[0].score
    assert 1 <= len(found) <= 1 + alternatives
    assert [h.score for h in found] == sorted((h.score for h in found), reverse=True)
    for hyp in found:
        assert EOS not in hyp.tokens
        assert all(0 <= token < vocab for token in hyp.tokens)
        assert min_new <= len(hyp.tokens) and len(hyp.tokens) + hyp.finished <= max_new
        assert hyp.finished or len(hyp.tokens) == max_new
        assert hyp.score <= optimum + 1e-9
        assert hyp.score == pytest.approx(rescore(model, hyp, length_penalty, min_new), abs=1e-9)


def test_brute_force_helper_counts_every_output() -> None:
    model = markov(np.zeros((5, 4)))  # uniform: every output is possible
    outputs = brute_force(model, 4, max_new=3)
    expected = 1 + 3 + 9 + 27  # EOS after 0, 1 or 2 tokens, or 3 non-EOS tokens
    assert len(outputs) == expected
    assert len({(tuple(h.tokens), h.finished) for h in outputs}) == expected
    assert all(len(h.tokens) <= 3 for h in outputs)
    assert list(itertools.islice((h.finished for h in outputs), 1)) == [True]


@pytest.mark.parametrize("beam_size", [2, 4])
def test_each_hypothesis_carries_its_tokens_log_probabilities(beam_size: int) -> None:
    """Every hypothesis's ``log_probs`` are its tokens' log-softmax values along its own
    history (teacher forcing), live ones included; their sum with EOS's is its raw score."""
    for seed in range(12):
        model = random_tree(seed, 6, viable=4)
        search = BeamSearch(
            beam_size, EOS, max_new_tokens=5, length_penalty=0.0, num_alternatives=beam_size - 1
        )
        for hyp in run_beam(model, search):
            assert len(hyp.log_probs) == len(hyp.tokens)
            for index, token in enumerate(hyp.tokens):
                row = log_softmax(np.asarray(model(tuple(hyp.tokens[:index])), np.float64))
                assert hyp.log_probs[index] == pytest.approx(float(row[token]), abs=1e-12)
            assert hyp.score == pytest.approx(rescore(model, hyp, 0.0), abs=1e-12)
            eos = hyp.score - sum(hyp.log_probs)
            assert eos == pytest.approx(0.0, abs=1e-12) if not hyp.finished else eos <= 1e-12


def test_a_prefix_starts_every_hypothesis_with_log_probability_zero() -> None:
    search = BeamSearch(3, EOS, max_new_tokens=3, num_alternatives=2, prefix=(4, 2))
    found = run_beam(random_tree(3, 6), search)
    assert all(h.tokens[:2] == [4, 2] and h.log_probs[:2] == [0.0, 0.0] for h in found)
    assert all(len(h.tokens) <= 2 + 3 for h in found)
