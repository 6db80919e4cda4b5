"""A short soak (``make soak`` runs the 10-minute one on the shipped models).

``benchmarks.soak`` drives mixed traffic (Translate, TranslateStream, Caption, CaptionStream,
Classify, KServe ModelInfer) from 8 concurrent grpc.aio workers against an ``attnserve serve``
process on the tiny repository for ``ATTNSERVE_SOAK_SECONDS`` (default 45) seconds, sampling the
server's resident memory every second. Asserted: no call failed and every repeated input got
its first answer again (whatever the API), every kind of call ran, the server exited 0 on
SIGTERM, and the resident memory grew by at most 5% between the end of the 15 s warm-up and the
end. The report goes to ``soak_summary.json`` in pytest's base temp directory and is printed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.soak import KINDS, soak

SECONDS = float(os.environ.get("ATTNSERVE_SOAK_SECONDS", "45"))
WARMUP = min(15.0, SECONDS / 3)


def test_short_soak(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    report = soak(tiny_repository, SECONDS, WARMUP, concurrency=8, interval=0.5)
    text = json.dumps({k: v for k, v in report.items() if k != "rss_samples_mb"}, indent=2)
    (tmp_path_factory.getbasetemp() / "soak_summary.json").write_text(json.dumps(report, indent=2))
    print(f"\nsoak summary: {text}")
    assert report["errors"] == 0, report["error_samples"]
    assert set(report["calls_by_kind"]) == set(KINDS)
    assert report["calls"] >= 10 * SECONDS  # it really drove traffic
    assert report["server_exit_code"] == 0
    assert report["rss_growth_after_warmup"] <= 0.05, report["rss_mb"]
    assert report["passed"]
