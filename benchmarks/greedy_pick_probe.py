"""Where the greedy pick on the device pays: decode steps with and without it, on CUDA.

``python -m benchmarks.greedy_pick_probe --out DIR`` loads `bench engine`'s fp32 Marian-base
entry (exported into the benchmark cache on first use) on the CUDA provider, without and with
CUDA graphs, and decodes ``fixed_greedy`` batches twice per batch size: every step's tokens
picked on the device (``greedy_pick.onnx`` over logits left on the GPU; ``pick_min_logits`` 0)
and every step's logits copied to the host for numpy's argmax (``pick_min_logits`` past any
batch). Each point is the best of ``--repetitions`` runs (the two modes alternated), in ms per
decode step; the ratio host / pick says where the in-place cache's ``PICK_MIN_LOGITS``
threshold belongs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import DEFAULT_RESULTS, log, write_probe

NEVER = 1 << 62  # a pick_min_logits no step reaches: the host argmax always
MODES = {"pick": 0, "host": NEVER}


def time_modes(runner: Any, ids: np.ndarray, repetitions: int) -> dict[str, float]:
    """Per mode, the best-of-``repetitions`` ms per decode step of ``runner.run(ids)``, the
    modes alternated run by run (after a warm-up run each)."""
    best = dict.fromkeys(MODES, float("inf"))
    for repetition in range(repetitions + 1):
        for mode, threshold in MODES.items():
            runner.cache.pick_min_logits = threshold
            started = time.perf_counter()
            runner.run(ids)
            if repetition:
                best[mode] = min(best[mode], time.perf_counter() - started)
    return {mode: 1000 * seconds / runner.new_tokens for mode, seconds in best.items()}


def measure(
    entry: Path,
    batches: list[int],
    new_tokens: int,
    repetitions: int,
    device: str = "cuda",
    shape: Any = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The points, without and with CUDA graphs (without only off CUDA, where no step picks on
    the device: both modes then take the host path)."""
    from benchmarks.attnserve_runner import AttnServeRunner
    from benchmarks.marian import BASE, source_ids

    points = []
    for cuda_graph in (False, True) if device == "cuda" else (False,):
        runner = AttnServeRunner(
            entry, "fp32", new_tokens, 1, device, max_batch=max(batches), cuda_graph=cuda_graph
        )
        try:
            for batch in batches:
                ids = source_ids(np.random.default_rng(seed), batch, 32, shape or BASE)
                ms = time_modes(runner, ids, repetitions)
                point = {
                    "cuda_graph": cuda_graph,
                    "batch": batch,
                    "pick_ms_per_step": round(ms["pick"], 4),
                    "host_ms_per_step": round(ms["host"], 4),
                    "host_over_pick": round(ms["host"] / ms["pick"], 3),
                }
                log(str(point))
                points.append(point)
        finally:
            runner.close()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.greedy_pick_probe")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 256])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "gpu")
    args = parser.parse_args(argv)
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        parser.error("the probe runs on CUDA only: install onnxruntime-gpu on a machine with a GPU")
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.marian import BASE, build_marian, default_cache

    cache = default_cache()
    entry = export_attnserve(build_marian(cache, BASE), cache, BASE, "fp32", False)
    points = measure(entry, args.batches, args.new_tokens, args.repetitions)
    write_probe(
        "greedy-pick",
        points,
        args.out,
        False,
        0.0,
        device="cuda",
        new_tokens=args.new_tokens,
        repetitions=args.repetitions,
        entry=str(entry),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
