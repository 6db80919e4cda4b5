"""``python -m benchmarks.sampling_probe``: ``RowSampler.choose`` timed against the reference
formulas, row by row and in the served engine, with the same tokens both ways."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import sampling_probe
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler


def test_both_ways_are_timed_and_draw_the_same_tokens(
    tiny_repository: Path, tmp_path: Path
) -> None:
    entry = tiny_repository / "translator"
    args = ["--tiny", "--rounds", "2", "--entry", str(entry), "--out", str(tmp_path)]
    assert sampling_probe.main(args) == 0
    (path,) = tmp_path.glob("sampling-probe-*-tiny.json")
    result = json.loads(path.read_text())
    rows = [p for p in result["points"] if "vocab" in p]
    engine = [p for p in result["points"] if "entry" in p]
    assert {p["filter"] for p in rows} == set(sampling_probe.FILTERS)
    assert [p["filter"] for p in engine] == list(sampling_probe.ENGINE_FILTERS)
    for point in rows:
        assert point["same_tokens"] and point["speedup"] > 0
        assert all(len(times) == 2 for times in point["us_per_row"].values())
    for point in engine:
        assert point["same_tokens"] and len(point["seconds_per_run"]["choose"]) == 2
    assert RowSampler.choose is sampling_probe.FAST_CHOOSE  # put back after the engine runs


def test_the_reference_is_the_plain_formulas() -> None:
    """The reference draws what ``choose`` draws (and ends a row with no finite logit)."""
    row = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    for options in sampling_probe.FILTERS.values():
        a = RowSampler(DecodingOptions(seed=3, **options), 0)
        b = RowSampler(DecodingOptions(seed=3, **options), 0)
        assert [sampling_probe.reference_choose(a, row, 2) for _ in range(5)] == [
            b.choose(row, 2) for _ in range(5)
        ]
    dead = np.full(4, np.nan, dtype=np.float32)
    assert sampling_probe.reference_choose(RowSampler(DecodingOptions(seed=1), 2), dead, 0) == 2
