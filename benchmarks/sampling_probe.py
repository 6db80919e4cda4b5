"""What sampling a token costs: ``RowSampler.choose`` against the reference formulas.

    python -m benchmarks.sampling_probe [--vocab 8000 58101] [--rows 64] [--rounds 3]
        [--entry REPO/NAME] [--out DIR] [--tiny]

The reference is what ``choose`` ran until 2026-11-28: a fresh float64 copy of the row, then
``sampling.filter_logits`` and ``sampling.draw`` (``reference_choose``). Per vocabulary size and
filter (temperature alone, top-k 50, top-p 0.95, both), ``--rows`` rows of random logits are
sampled by each way, the two alternated over ``--rounds``; the tokens must be the same. With
``--entry`` (an exported translator) also the served engine: 16 requests of exactly 32 sampled
tokens, ``choose`` swapped for the reference in alternate rounds. Writes
``benchmarks/results/sampling-probe-*.json``: µs per row (engine: seconds per run) per round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import DEFAULT_RESULTS, write_probe
from serving.generation import sampling
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler

FILTERS: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 1.0},
    "top_k_50": {"temperature": 0.8, "top_k": 50},
    "top_p_0.95": {"temperature": 0.8, "top_p": 0.95},
    "top_k_50_top_p_0.95": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
}
ENGINE_FILTERS = ("temperature", "top_k_50_top_p_0.95")
FAST_CHOOSE = RowSampler.choose


def reference_choose(
    sampler: RowSampler,
    logits_row: np.ndarray,
    generated: int,
    history: np.ndarray | None = None,
) -> int:
    """``RowSampler.choose`` as it was: a fresh clean copy, ``filter_logits``, ``draw`` (the
    probe's requests ask for no repetition controls, which need ``history``)."""
    if generated == sampler.forced_eos_at:
        return sampler.eos_id
    options = sampler.options
    x = sampling.clean_logits(logits_row)
    if generated < options.min_new_tokens:
        x[sampler.eos_id] = -np.inf
    x[sampler.suppress[sampler.suppress < x.size]] = -np.inf
    if not np.isfinite(x).any():
        return sampler.eos_id
    if options.temperature == 0:
        return int(np.argmax(x))
    filtered = sampling.filter_logits(
        x, temperature=options.temperature, top_k=options.top_k, top_p=options.top_p
    )
    return sampling.draw(filtered, sampler.rng)


def rows_point(vocab: int, name: str, rows: int, rounds: int) -> dict[str, Any]:
    logits = (np.random.default_rng(vocab).standard_normal((rows, vocab)) * 3).astype(np.float32)
    times: dict[str, list[float]] = {"reference": [], "choose": []}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for way in times:
            samplers = [
                RowSampler(DecodingOptions(seed=i, **FILTERS[name]), 0) for i in range(rows)
            ]
            choose = reference_choose if way == "reference" else FAST_CHOOSE
            start = time.perf_counter()
            tokens[way] = [choose(s, row, 5) for s, row in zip(samplers, logits, strict=True)]
            times[way].append((time.perf_counter() - start) / rows * 1e6)
    return {
        "vocab": vocab,
        "filter": name,
        "rows": rows,
        "us_per_row": {way: [round(t, 1) for t in ts] for way, ts in times.items()},
        "speedup": round(
            statistics.median(times["reference"]) / statistics.median(times["choose"]), 2
        ),
        "same_tokens": tokens["reference"] == tokens["choose"],
    }


def engine_points(entry: Path, rounds: int, tiny: bool) -> list[dict[str, Any]]:
    """The served engine decoding 16 requests of 32 sampled tokens, with either ``choose``."""
    from benchmarks.beam_runner import AttnServeBeamRunner

    new_tokens, batch = (4, 2) if tiny else (32, 16)
    runner = AttnServeBeamRunner(entry, "served", new_tokens, 1, 2, batch)
    sources = np.random.default_rng(0).integers(5, 60, (batch, 12))

    async def generate(options: dict[str, Any]) -> list[list[int]]:
        model = runner.model
        requests = [
            model.request(
                DecodingOptions(
                    max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=i, **options
                ),
                source_ids=row,
            )
            for i, row in enumerate(sources)
        ]
        return [r.token_ids for r in await asyncio.gather(*(model.generate(r) for r in requests))]

    points = []
    try:
        for name in ENGINE_FILTERS:
            times: dict[str, list[float]] = {"reference": [], "choose": []}
            tokens: dict[str, Any] = {}
            for _ in range(rounds):
                for way in times:
                    RowSampler.choose = reference_choose if way == "reference" else FAST_CHOOSE  # type: ignore[method-assign,assignment]
                    start = time.perf_counter()
                    tokens[way] = runner.loop.run_until_complete(generate(FILTERS[name]))
                    times[way].append(time.perf_counter() - start)
            points.append(
                {
                    "entry": str(entry),
                    "filter": name,
                    "batch": batch,
                    "new_tokens": new_tokens,
                    "seconds_per_run": {w: [round(t, 4) for t in ts] for w, ts in times.items()},
                    "same_tokens": tokens["reference"] == tokens["choose"],
                }
            )
    finally:
        RowSampler.choose = FAST_CHOOSE  # type: ignore[method-assign]
        runner.close()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampling_probe")
    parser.add_argument("--vocab", type=int, nargs="+", default=[8000, 58101])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entry", type=Path, help="an exported translator: time the engine too")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--tiny", action="store_true", help="a few small rows (CI smoke run)")
    args = parser.parse_args(argv)
    vocabs, rows = ([500], 4) if args.tiny else (args.vocab, args.rows)
    started = time.perf_counter()
    points = [rows_point(v, name, rows, args.rounds) for v in vocabs for name in FILTERS]
    if args.entry is not None:
        points += engine_points(args.entry, args.rounds, args.tiny)
    write_probe(
        "sampling-probe",
        points,
        args.out,
        args.tiny,
        round(time.perf_counter() - started, 1),
        reference="a fresh float64 copy, sampling.filter_logits, sampling.draw (choose until "
        "2026-11-28)",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
