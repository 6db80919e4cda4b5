"""``benchmarks.soak``'s report from a tally and RSS samples (the soak itself runs in
tests/reliability/test_soak.py)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("grpc")

from benchmarks.soak import SoakRun, Tally, soak_report


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

    from benchmarks.soak import _process_rss, process_tree, rss_bytes

    code = "import sys, time; b = bytearray(64 << 20); print(flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # it holds the memory now
        assert child.pid in process_tree(os.getpid())
        alone = _process_rss(os.getpid())
        assert rss_bytes(os.getpid()) >= alone + (64 << 20)
    finally:
        child.kill()
        child.wait()
