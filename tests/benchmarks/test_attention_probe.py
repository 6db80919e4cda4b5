"""The attention probe: its three forms compute a decode step's attention over ragged lengths
(checked against numpy), and the probe writes its points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import attention_probe
from benchmarks.attention_probe import FORMS, HEAD_SIZE, HEADS, _models, _session


def test_every_form_computes_the_attention_of_one_query_per_row() -> None:
    batch, positions = 3, 5
    rng = np.random.default_rng(1)
    q = rng.standard_normal((batch, HEADS, 1, HEAD_SIZE), dtype=np.float32)
    k = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    v = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    lengths = np.array([5, 1, 3], dtype=np.int64)  # each row attends to its first keys only
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_SIZE)
    masked = np.arange(positions)[None, None, None, :] >= lengths[:, None, None, None]
    scores = np.where(masked, -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    models = _models(batch, positions)
    assert set(models) == set(FORMS)
    for form, model in models.items():
        got = _session(model, 1).run(None, {"q": q, "k": k, "v": v, "lengths": lengths})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=form)


def test_the_probe_writes_a_point_per_shape(tmp_path: Path) -> None:
    argv = ["--batches", "2", "--positions", "4", "8", "--threads", "1", "--calls", "3"]
    assert attention_probe.main([*argv, "--layers", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("attention-probe-*.json")
    result = json.loads(path.read_text())
    assert [(p["batch"], p["positions"]) for p in result["points"]] == [(2, 4), (2, 8)]
    for point in result["points"]:
        assert point["max_abs_difference"] < 1e-5 and point["layers"] == 2
        for form in FORMS:
            assert len(point[f"{form}_us"]) == 2 and all(t > 0 for t in point[f"{form}_us"])
        assert all(ratio > 0 for ratio in point["keys_query_vs_attention"])
    assert result["machine"]["logical_cpus"] >= 1
