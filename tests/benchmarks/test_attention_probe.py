"""The attention probe: both forms compute a decode step's attention (checked against numpy),
and the probe writes its points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import attention_probe
from benchmarks.attention_probe import HEAD_SIZE, HEADS, _models, _session


def test_both_forms_compute_the_attention_of_one_query_per_row() -> None:
    batch, positions = 3, 5
    rng = np.random.default_rng(1)
    q = rng.standard_normal((batch, HEADS, 1, HEAD_SIZE), dtype=np.float32)
    k = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    v = rng.standard_normal((batch, HEADS, positions, HEAD_SIZE), dtype=np.float32)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_SIZE)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    fused, plain = (_session(model, 1) for model in _models(batch, positions))
    lengths = np.full(batch, positions, dtype=np.int64)
    mask = np.zeros((batch, 1, 1, positions), np.float32)
    got_fused = fused.run(None, {"q": q, "k": k, "v": v, "lengths": lengths})[0]
    got_plain = plain.run(None, {"q": q, "k": k, "v": v, "mask": mask})[0]
    np.testing.assert_allclose(got_fused, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_plain, expected, rtol=1e-4, atol=1e-5)


def test_the_probe_writes_a_point_per_shape(tmp_path: Path) -> None:
    assert (
        attention_probe.main(
            [
                "--batches",
                "2",
                "--positions",
                "4",
                "8",
                "--threads",
                "1",
                "--calls",
                "3",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (path,) = tmp_path.glob("attention-probe-*.json")
    result = json.loads(path.read_text())
    assert [(p["batch"], p["positions"]) for p in result["points"]] == [(2, 4), (2, 8)]
    for point in result["points"]:
        assert point["max_abs_difference"] < 1e-5
        assert len(point["attention_us"]) == len(point["plain_us"]) == 2
        assert all(t > 0 for t in point["attention_us"] + point["plain_us"])
    assert result["machine"]["logical_cpus"] >= 1
