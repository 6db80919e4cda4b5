"""``python -m benchmarks.repetition_controls``: attnserve, CTranslate2 and HF ``generate`` with
the same repetition controls on the tiny Marian model, and the served engine's tokens under
those controls (and after a target prefix) equal to ``generate``'s."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import repetition_controls

PEERS = importlib.util.find_spec("ctranslate2") and importlib.util.find_spec("transformers")


@pytest.mark.skipif(not PEERS, reason="needs ctranslate2 and transformers (the peers)")
def test_each_setup_and_beam_size_is_a_point_with_its_cost(tmp_path: Path) -> None:
    # "both" and "scores": their options are checked below (and "both"'s tokens against
    # generate's in test_the_runners_decode_with_the_controls)
    setups = "none,samples,top_log_probs"
    args = ["--tiny", "--repetitions", "1", "--out", str(tmp_path), "--setups", setups]
    args += ["--beam-sizes", "1,3", "--batches", "2", "--new-tokens", "6"]
    assert repetition_controls.main(args) == 0
    (path,) = tmp_path.glob("repetition-controls-*-tiny.json")
    result = json.loads(path.read_text())
    points = {(p["setup"], p["beam_size"]): p for p in result["points"]}
    assert set(points) == {(s, b) for s in ("none", "top_log_probs") for b in (1, 3)} | {
        ("samples", 1)  # sampling has no beams
    }
    top = points[("top_log_probs", 1)]["controls"]
    assert top["attnserve-beam"] == {"return_log_probs": True, "top_log_probs": 5}
    assert top["ctranslate2"]["return_logits_vocab"] is True
    samples = points[("samples", 1)]
    assert samples["samples_per_row"] == repetition_controls.SAMPLES
    assert samples["runs"]["hf-generate-kv"]["output_shape"] == [2 * 5, 6]  # every sample
    for name, runs in samples["runs"].items():  # the rate counts all five samples of a row
        seconds = sorted(runs["runs_s"])[0]
        assert samples["new_tokens_per_s"][name] == pytest.approx(2 * 6 * 5 / seconds, rel=0.01)
    assert points[("top_log_probs", 3)]["controls"] == repetition_controls.SETUPS["top_log_probs"]
    assert not result["skipped"]  # every engine took its options
    assert {"attnserve-fp32-greedy", "hf-generate-kv"} <= set(points[("top_log_probs", 1)]["runs"])
    assert "attnserve-fp32-beam3" in points[("top_log_probs", 3)]["runs"]
    for (setup, _), point in points.items():
        for name, runs in point["runs"].items():  # every engine gave 2 rows of exactly 6 tokens
            if setup != "samples" or not name.startswith("hf-"):
                assert runs["output_shape"] == [2, 6]
    for beam in (1, 3):
        plain, top = points[("none", beam)], points[("top_log_probs", beam)]
        assert set(plain["vs_none"].values()) == {1.0}
        for name, rate in top["new_tokens_per_s"].items():
            expected = rate / plain["new_tokens_per_s"][name]
            assert top["vs_none"][name] == pytest.approx(expected, abs=1e-3)


def test_the_scores_setup_asks_greedy_rows_only_for_log_probs() -> None:
    controls = repetition_controls.setup_controls
    assert controls("scores", 1)["attnserve-beam"] == {"return_log_probs": True}
    assert controls("scores", 3)["attnserve-beam"] == {}  # beams score anyway
    assert controls("scores", 3)["hf"] == controls("scores", 1)["hf"]
    assert controls("both", 3) == repetition_controls.SETUPS["both"]


def _tiny() -> tuple[Path, Path, Path]:
    """The tiny Marian model's benchmark cache, its directory and its fp32 attnserve entry."""
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.marian import TINY, build_marian, default_cache

    cache = default_cache()
    marian_dir = build_marian(cache, TINY)
    return cache, marian_dir, export_attnserve(marian_dir, cache, TINY, "fp32", fast_int8=True)


def _served_as_hf(
    entry: Path, marian_dir: Path, ids: np.ndarray, beam_size: int, setup: dict
) -> np.ndarray:
    """The served engine's 9 tokens per row with ``setup``, checked equal to ``generate``'s."""
    from benchmarks.beam_runner import AttnServeBeamRunner
    from benchmarks.peers import HFGenerateRunner

    ours = AttnServeBeamRunner(entry, "fp32", 9, beam_size, 1, 3, controls=setup)
    try:
        served = ours.run(ids)
    finally:
        ours.close()
    hf = HFGenerateRunner(marian_dir, 9, True, 1, beam_size=beam_size, controls=setup)
    np.testing.assert_array_equal(served, hf.run(ids))
    return served


@pytest.mark.skipif(not PEERS, reason="needs transformers (the reference)")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_runners_decode_with_the_controls(beam_size: int) -> None:
    """The served engine's tokens with the controls (and a fixed length) are ``generate``'s
    with the same options, and differ from its tokens without them."""
    from benchmarks.marian import TINY, source_ids

    _, marian_dir, entry = _tiny()
    ids = source_ids(np.random.default_rng(3), 3, 8, TINY)
    controls = repetition_controls.SETUPS["both"]["attnserve-beam"]
    outputs = {
        bool(setup): _served_as_hf(entry, marian_dir, ids, beam_size, setup)
        for setup in ({}, controls)
    }
    assert not np.array_equal(outputs[False], outputs[True])


@pytest.mark.skipif(not PEERS, reason="needs ctranslate2 and transformers (the peers)")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_runners_decode_after_the_same_target_prefix(beam_size: int) -> None:
    """With the ``prefix`` setup (each row's first source tokens as its target prefix) the
    served engine's tokens after the prefix are ``generate``'s after ``decoder_input_ids``, and
    CTranslate2's after ``target_prefix`` (greedy), and differ from those without a prefix."""
    from benchmarks.marian import TINY, source_ids, vocabulary
    from benchmarks.peers import CTranslate2Runner, convert_ctranslate2

    cache, marian_dir, entry = _tiny()
    ids = source_ids(np.random.default_rng(4), 3, 12, TINY)
    prefix = repetition_controls.SETUPS["prefix"]["attnserve-beam"]
    outputs = {}
    for setup in ({}, prefix):
        served = _served_as_hf(entry, marian_dir, ids, beam_size, setup)
        if beam_size == 1:
            model = convert_ctranslate2(marian_dir, cache, "float32")
            ct2 = CTranslate2Runner(model, vocabulary(TINY), "fp32", 9, 1, 1, controls=setup)
            np.testing.assert_array_equal(served, ct2.run(ids))
        outputs[bool(setup)] = served
    assert not np.array_equal(outputs[False], outputs[True])


@pytest.mark.skipif(not PEERS, reason="needs ctranslate2 and transformers (the peers)")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_runners_decode_without_the_same_bad_words(beam_size: int) -> None:
    """With the ``bad_words`` setup the served engine's tokens are ``generate``'s with
    ``bad_words_ids`` and CTranslate2's with ``suppress_sequences``, hold none of the words,
    and differ from those without them."""
    from benchmarks.marian import TINY, source_ids, vocabulary
    from benchmarks.peers import CTranslate2Runner, convert_ctranslate2

    cache, marian_dir, entry = _tiny()
    ids = source_ids(np.random.default_rng(5), 6, 12, TINY)
    setup = repetition_controls.SETUPS["bad_words"]["attnserve-beam"]
    plain = _served_as_hf(entry, marian_dir, ids, beam_size, {})
    banned = _served_as_hf(entry, marian_dir, ids, beam_size, setup)
    model = convert_ctranslate2(marian_dir, cache, "float32")
    ct2 = CTranslate2Runner(
        model, vocabulary(TINY), "fp32", 9, 1, 1, beam_size=beam_size, controls=setup
    )
    np.testing.assert_array_equal(banned, ct2.run(ids))
    assert not np.array_equal(plain, banned)
    for row in banned.tolist():
        for word in repetition_controls.BAD_WORDS:
            assert all(row[i : i + len(word)] != word for i in range(len(row)))


@pytest.mark.skipif(not PEERS, reason="needs transformers (the reference)")
def test_the_stop_setup_stops_nothing() -> None:
    """The ``stop`` setup's stop string is checked and never found: the served engine's tokens
    are those without it, so the setup times the check alone."""
    from benchmarks.beam_runner import AttnServeBeamRunner
    from benchmarks.marian import TINY, source_ids

    _, marian_dir, entry = _tiny()
    ids = source_ids(np.random.default_rng(6), 3, 12, TINY)
    plain = _served_as_hf(entry, marian_dir, ids, 1, {})
    stop = repetition_controls.SETUPS["stop"]["attnserve-beam"]
    ours = AttnServeBeamRunner(entry, "fp32", 9, 1, 1, 3, controls=stop)
    try:
        np.testing.assert_array_equal(ours.run(ids), plain)
    finally:
        ours.close()
