"""The GPU kernel probe: its trace arithmetic, and a clear refusal where there is no GPU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.gpu_kernels import busy_us, kernel_summary, main

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)), max_size=30)


@given(intervals)
def test_busy_time_is_the_union_of_the_intervals(spans: list[tuple[int, int]]) -> None:
    covered = {t for start, duration in spans for t in range(start, start + duration)}
    assert busy_us([(float(s), float(d)) for s, d in spans]) == len(covered)


def test_the_summary_counts_kernels_and_copies_per_step() -> None:
    def event(cat: str, name: str, ts: float, dur: float, ph: str = "X") -> dict:
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": ph}

    events = [
        event("kernel", "gemm", 0, 10),
        event("kernel", "gemm", 20, 10),
        event("kernel", "softmax", 25, 2),  # overlaps the second gemm
        event("gpu_memcpy", "Memcpy HtoD", 40, 4),
        event("cuda_runtime", "cudaGraphLaunch", 0, 50),  # host side: not GPU time
        event("kernel", "flow", 0, 0, ph="f"),  # not a complete event
    ]
    summary = kernel_summary(events, steps=2)
    assert summary["kernels_per_step"] == 1.5
    assert summary["copies_per_step"] == 0.5
    assert summary["gpu_busy_us_per_step"] == 12.0  # (10 + 10 + 4) / 2
    assert summary["kernel_us_per_step"] == 11.0
    top = summary["top_kernels"]
    assert [k["name"] for k in top] == ["gemm", "softmax"]
    assert top[0] == {"name": "gemm", "per_step": 1.0, "us_per_step": 10.0, "share": 0.9091}


def test_without_a_gpu_it_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the probe would run")
    assert main(["--batches", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
