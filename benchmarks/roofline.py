"""The machine's roofline, measured in the same run as the benchmarks it scales.

- fp32 matmul peak: square ``torch.matmul`` at a few sizes with the benchmark's thread count;
  the best median rate is the peak that "fraction of peak" figures divide by. numpy's BLAS is
  measured too (informational: its thread count is fixed when numpy loads).
- memory bandwidth: a large ``torch`` copy (read + write bytes / time).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

FULL_SIZES = (1024, 2048, 3072)
TINY_SIZES = (128, 256)


def _timed(fn: Any, repeats: int, budget_s: float, sync: Any = None) -> list[float]:
    """Run ``fn`` up to ``repeats`` times (at least 3, stopping after ``budget_s``)."""
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
        if len(times) >= 3 and time.perf_counter() - started > budget_s:
            break
    return times


def matmul_peak(
    threads: int, device: str = "cpu", tiny: bool = False, budget_s: float = 3.0
) -> dict[str, Any]:
    """Best fp32 matmul rate in GFLOP/s over a few square sizes.

    Args:
        threads: torch intra-op threads (the benchmark's total thread count).
        device: "cpu" or "cuda".
        tiny: small sizes and a short budget (CI).
        budget_s: seconds per size (after one warm-up product).

    Returns:
        ``{"gflops": best, "by_size": {n: median GFLOP/s}, "threads": ..., "device": ...}``
        plus ``numpy_gflops`` on the CPU.
    """
    import torch

    sizes = TINY_SIZES if tiny else FULL_SIZES
    budget = 0.3 if tiny else budget_s
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device == "cuda" else None
    by_size: dict[str, float] = {}
    try:
        for n in sizes:
            a = torch.randn(n, n, device=device)
            b = torch.randn(n, n, device=device)
            out = torch.empty(n, n, device=device)
            torch.matmul(a, b, out=out)  # warm-up
            times = _timed(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), 50, budget, sync)
            by_size[str(n)] = round(2.0 * n**3 / statistics.median(times) / 1e9, 2)
    finally:
        torch.set_num_threads(previous)
    result: dict[str, Any] = {
        "gflops": max(by_size.values()),
        "by_size": by_size,
        "threads": threads,
        "device": device,
        "dtype": "float32",
        "method": "median time of torch.matmul(n x n, n x n) per size; best size",
    }
    if device == "cpu":
        result["numpy_gflops"] = _numpy_matmul(sizes[-1], budget)
    return result


def _numpy_matmul(n: int, budget: float) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    times = _timed(lambda: a @ b, 50, budget)
    return round(2.0 * n**3 / statistics.median(times) / 1e9, 2)


def memory_bandwidth(device: str = "cpu", tiny: bool = False) -> dict[str, Any]:
    """Copy bandwidth in GB/s (bytes read + written per second) of a large fp32 buffer."""
    import torch

    count = (4 << 20) if tiny else (64 << 20)  # 16 MB or 256 MB of fp32
    source = torch.ones(count, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    sync = torch.cuda.synchronize if device == "cuda" else None
    times = _timed(lambda: target.copy_(source), 20, 0.3 if tiny else 2.0, sync)
    moved = 2 * 4 * count
    return {"gbps": round(moved / min(times) / 1e9, 2), "bytes": moved, "method": "best copy"}


def measure(threads: int, device: str = "cpu", tiny: bool = False) -> dict[str, Any]:
    """The roofline record of a benchmark result: matmul peak and memory bandwidth."""
    return {
        "matmul": matmul_peak(threads, device, tiny),
        "memory": memory_bandwidth(device, tiny),
    }
