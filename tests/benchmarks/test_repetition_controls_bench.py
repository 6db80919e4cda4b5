"""``python -m benchmarks.repetition_controls``: attnserve, CTranslate2 and HF ``generate`` with
the same repetition controls on the tiny Marian model, and the served engine's tokens under
those controls equal to ``generate``'s."""

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
    args = ["--tiny", "--repetitions", "1", "--out", str(tmp_path), "--setups", "none,both,scores"]
    args += ["--beam-sizes", "1,3", "--batches", "2", "--new-tokens", "6"]
    assert repetition_controls.main(args) == 0
    (path,) = tmp_path.glob("repetition-controls-*-tiny.json")
    result = json.loads(path.read_text())
    points = {(p["setup"], p["beam_size"]): p for p in result["points"]}
    assert set(points) == {(s, b) for s in ("none", "both", "scores") for b in (1, 3)}
    assert points[("both", 3)]["controls"] == repetition_controls.SETUPS["both"]
    assert points[("scores", 1)]["controls"]["attnserve-beam"] == {"return_log_probs": True}
    assert points[("scores", 3)]["controls"]["attnserve-beam"] == {}  # beams score anyway
    assert not result["skipped"]  # every engine took its options
    assert {"attnserve-fp32-greedy", "hf-generate-kv"} <= set(points[("both", 1)]["runs"])
    assert "attnserve-fp32-beam3" in points[("both", 3)]["runs"]
    for point in points.values():
        for runs in point["runs"].values():  # every engine gave 2 rows of exactly 6 tokens
            assert runs["output_shape"] == [2, 6]
    for beam in (1, 3):
        plain, both = points[("none", beam)], points[("both", beam)]
        assert set(plain["vs_none"].values()) == {1.0}
        assert set(points[("scores", beam)]["runs"]) == set(plain["runs"])
        for name, rate in both["new_tokens_per_s"].items():
            expected = rate / plain["new_tokens_per_s"][name]
            assert both["vs_none"][name] == pytest.approx(expected, abs=1e-3)


@pytest.mark.skipif(not PEERS, reason="needs transformers (the reference)")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_runners_decode_with_the_controls(beam_size: int) -> None:
    """The served engine's tokens with the controls (and a fixed length) are ``generate``'s
    with the same options, and differ from its tokens without them."""
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.beam_runner import AttnServeBeamRunner
    from benchmarks.marian import TINY, build_marian, default_cache, source_ids
    from benchmarks.peers import HFGenerateRunner

    cache = default_cache()
    marian_dir = build_marian(cache, TINY)
    entry = export_attnserve(marian_dir, cache, TINY, "fp32", fast_int8=True)
    ids = source_ids(np.random.default_rng(3), 3, 8, TINY)
    controls = repetition_controls.SETUPS["both"]["attnserve-beam"]
    outputs = {}
    for setup in ({}, controls):
        ours = AttnServeBeamRunner(entry, "fp32", 9, beam_size, 1, 3, controls=setup)
        try:
            served = ours.run(ids)
        finally:
            ours.close()
        hf = HFGenerateRunner(marian_dir, 9, True, 1, beam_size=beam_size, controls=setup)
        np.testing.assert_array_equal(served, hf.run(ids))
        outputs[bool(setup)] = served
    assert not np.array_equal(outputs[False], outputs[True])
