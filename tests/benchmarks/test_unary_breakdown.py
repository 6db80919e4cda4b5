"""``python -m benchmarks.unary_breakdown``: a real in-process server's unary Translate split
into stages; every stage is reached in order and the wrappers are gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.unary_breakdown import STAGES, main
from serving.engine.inflight import InFlightEngine
from serving.seq2seq import Seq2SeqRunner
from serving.services.attnserve import AttnServeServicer


def test_the_stages_come_in_order_and_the_originals_return(
    tiny_repository: Path, tmp_path: Path
) -> None:
    before = (AttnServeServicer.Translate, InFlightEngine._admit, Seq2SeqRunner.encode)
    assert (
        main(["--repository", str(tiny_repository), "--calls", "20", "--out", str(tmp_path)]) == 0
    )
    (path,) = tmp_path.glob("unary-breakdown-*.json")
    result = json.loads(path.read_text())
    points = result["points"]
    assert [p["stage"] for p in points] == list(STAGES) and result["calls"] == 20
    times = [p["ms"] for p in points]
    assert times == sorted(times) and times[0] > 0  # medians of ordered stamps stay in order
    assert sum(p["since_previous_ms"] for p in points) == pytest.approx(times[-1], abs=1e-3)
    assert (AttnServeServicer.Translate, InFlightEngine._admit, Seq2SeqRunner.encode) == before
