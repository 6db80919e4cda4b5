"""``python -m benchmarks.scoring``: attnserve's ``Scorer``, CTranslate2's ``score_batch`` and a
Hugging Face teacher-forced forward on the tiny Marian model, agreeing on every log-probability,
timed side by side."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
from pathlib import Path

import numpy as np
import pytest

from benchmarks import scoring

CT2 = importlib.util.find_spec("ctranslate2") is not None
HF = importlib.util.find_spec("transformers") is not None


def _ct2_names() -> set[str]:
    """The CTranslate2 runners the benchmark runs here (thread splits, forced ISA)."""
    from benchmarks.machine import cpu_model_and_flags
    from benchmarks.peers import ct2_forced_isas, ct2_name, thread_splits

    isas: list[str | None] = [None, *ct2_forced_isas(*cpu_model_and_flags())]
    splits = thread_splits(len(os.sched_getaffinity(0)))
    return {ct2_name("fp32", inter, intra, isa) for isa in isas for inter, intra in splits}


@pytest.mark.skipif(not HF, reason="needs transformers (the reference)")
def test_the_runners_agree_and_each_batch_is_a_point(tmp_path: Path) -> None:
    args = ["--tiny", "--batches", "1,4", "--target-tokens", "6", "--repetitions", "1"]
    assert scoring.main([*args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("scoring-*-tiny.json")
    assert path.with_suffix(".png").stat().st_size > 0
    result = json.loads(path.read_text())
    assert result["command"].startswith("python -m benchmarks.scoring --tiny")
    assert result["machine"]["cpu_model"] and result["target_tokens"] == 6
    ours = scoring.attnserve_name("fp32")
    expected = {ours, scoring.HF_NAME} | (_ct2_names() if CT2 else set())
    if CT2:
        assert not result["skipped"]
    else:  # CTranslate2's runners are skipped with the reason
        assert {s["engine"] for s in result["skipped"]} == {"ctranslate2-fp32"}
    assert [p["batch"] for p in result["points"]] == [1, 4]
    for point in result["points"]:
        batch, rates = point["batch"], point["scored_tokens_per_s"]
        assert point["scored_tokens"] == batch * 7  # the target tokens and EOS
        assert set(rates) == set(point["runs"]) == set(point["order"]) == expected
        for name, runs in point["runs"].items():
            assert runs["discarded_runs"] == []  # --tiny: no noise check
            assert rates[name] > 0
            seconds = statistics.median(runs["runs_s"])
            assert rates[name] == pytest.approx(batch * 7 / seconds, rel=0.01)
        agreement = point["agreement"]
        assert agreement["reference"] == ours and agreement["within_tolerance"] is True
        assert set(agreement["max_abs_diff"]) == expected - {ours}
        assert max(agreement["max_abs_diff"].values()) <= scoring.TOLERANCE["fp32"]
        assert point["vs_hf"] == pytest.approx(rates[ours] / rates[scoring.HF_NAME], abs=1e-3)
        if CT2:
            best = max(_ct2_names(), key=lambda name: rates[name])
            assert point["best_ctranslate2"] == best
            assert point["vs_ctranslate2"] == pytest.approx(rates[ours] / rates[best], abs=1e-3)
        else:
            assert point["best_ctranslate2"] is None and point["vs_ctranslate2"] is None


def test_a_disagreement_is_recorded_and_the_ratios_follow_the_rates() -> None:
    ours = scoring.attnserve_name("fp32")
    log_probs = np.full((2, 3), -2.0, dtype=np.float32)
    outputs = {ours: log_probs, "ctranslate2-fp32-1x2": log_probs + 0.01, "hf-forward": log_probs}
    agreed = scoring.agreement("fp32", outputs, (2, 3))
    assert agreed["within_tolerance"] is False
    assert agreed["max_abs_diff"] == pytest.approx({"ctranslate2-fp32-1x2": 0.01, "hf-forward": 0})
    with pytest.raises(RuntimeError, match="returned"):
        scoring.agreement("fp32", outputs, (2, 4))
    assert scoring.agreement("int8", {ours: log_probs}, (2, 3))["within_tolerance"] is None
    timed = {
        ours: {"runs_s": [0.1, 0.3, 0.2]},
        "ctranslate2-fp32-1x2": {"runs_s": [0.1]},
        "ctranslate2-fp32-2x1": {"runs_s": [0.4]},
        "hf-forward": {"runs_s": [0.8]},
    }
    point = scoring.point_of("fp32", 2, 3, timed, agreed)
    assert point["scored_tokens_per_s"][ours] == 40.0  # 2 x (3 + 1) tokens in 0.2 s
    assert point["best_ctranslate2"] == "ctranslate2-fp32-1x2"
    assert (point["vs_ctranslate2"], point["vs_hf"]) == (0.5, 4.0)
