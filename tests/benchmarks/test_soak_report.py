"""``benchmarks.soak``'s report from a tally and RSS samples (the soak itself runs in
tests/reliability/test_soak.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("grpc")

from benchmarks.soak import ProcessSamples, SoakRun, Tally, soak_report


def run(**overrides: object) -> SoakRun:
    fields = {
        "repository": "repo",
        "address": "127.0.0.1:1",
        "elapsed": 10.0,
        "warmup": 4.0,
        "window": 2.0,
        "concurrency": 2,
        "processes": 1,
        "max_growth": 0.05,
        "distinct_texts": 3,
        "exit_code": 0,
    }
    return SoakRun(**{**fields, **overrides})  # type: ignore[arg-type]


def test_growth_is_measured_after_the_warmup() -> None:
    tally = Tally()
    tally.calls.update(translate=8, classify=2)
    tally.latency["translate"] += [0.001, 0.003]
    mib = 2**20
    samples = [(0.0, 50 * mib), (3.0, 100 * mib), (4.0, 100 * mib), (9.0, 104 * mib)]
    samples.append((10.0, 104 * mib))
    report = soak_report(run(), tally, samples)
    assert report["rss_growth_after_warmup"] == 0.04 and report["passed"] is True
    assert report["rss_mb"] == {"start": 50.0, "after_warmup": 100.0, "end": 104.0, "max": 104.0}
    assert report["calls"] == 10 and report["calls_per_s"] == 1.0 and report["errors"] == 0
    assert report["latency_ms"] == {"translate": {"p50": 3.0, "p99": 3.0}}
    assert list(report)[:3] == ["repository", "address", "duration_s"]
    assert report["server_exit_code"] == 0 and report["distinct_texts"] == 3


def test_each_process_gets_its_own_growth() -> None:
    """The tree's growth is judged; each process's own figures say which one grew."""
    mib = 2**20
    times = (3.0, 4.0, 10.0)
    grown = zip(times, (100, 100, 103), strict=True)
    engine = ProcessSamples("attnserve-eng", [(t, m * mib) for t, m in grown])
    frontend = ProcessSamples("attnserve-fe0", [(t, 50 * mib) for t in times])
    totals = [(3.0, 150 * mib), (4.0, 150 * mib), (10.0, 153 * mib)]
    report = soak_report(run(), Tally(), totals, {11: engine, 12: frontend})
    assert report["rss_growth_after_warmup"] == 0.02
    assert report["rss_by_process"] == [
        {
            "pid": 11,
            "name": "attnserve-eng",
            "after_warmup_mb": 100.0,
            "end_mb": 103.0,
            "growth_mb": 3.0,
            "growth": 0.03,
        },
        {
            "pid": 12,
            "name": "attnserve-fe0",
            "after_warmup_mb": 50.0,
            "end_mb": 50.0,
            "growth_mb": 0.0,
            "growth": 0.0,
        },
    ]
    assert soak_report(run(), Tally(), totals)["rss_by_process"] == []


def test_an_error_or_too_much_growth_fails() -> None:
    samples = [(4.0, 100), (10.0, 110)]
    assert soak_report(run(), Tally(), samples)["passed"] is False  # 10% growth
    tally = Tally()
    tally.error("classify", "UNAVAILABLE: gone")
    report = soak_report(run(max_growth=1.0), tally, samples)
    assert report["passed"] is False and report["errors_by_kind"] == {"classify": 1}
    assert report["error_samples"] == ["classify: UNAVAILABLE: gone"]


def test_rss_sums_the_process_tree() -> None:
    """A child holding 64 MB counts towards its parent's figure; the tree lists it."""
    import subprocess
    import sys

    from benchmarks.soak import _process_rss, process_tree, rss_bytes, tree_rss

    code = "import sys, time; b = bytearray(64 << 20); print(flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # it holds the memory now
        assert child.pid in process_tree(os.getpid())
        alone = _process_rss(os.getpid())
        assert rss_bytes(os.getpid()) >= alone + (64 << 20)
        name, rss = tree_rss(os.getpid())[child.pid]
        assert name == Path(sys.executable).name[:15] and rss >= 64 << 20  # comm: the binary
    finally:
        child.kill()
        child.wait()
