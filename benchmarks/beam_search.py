"""Beam search against CTranslate2 and Hugging Face ``generate``, same model, same run.

    python -m benchmarks.beam_search [--beam-size 4] [--precisions fp32,int8] [--batches 1,8]
                                     [--new-tokens 32] [--repetitions 3] [--out DIR] [--tiny]

`attnserve bench engine` times greedy decoding. Translation users often ask for beams
(CTranslate2's ``translate_batch`` defaults to 2, Marian's generation configs to 4), so this probe
times beam search on the engine benchmark's random Marian model (Marian-base shape, or the CI's
tiny one with ``--tiny``), exported and converted into the benchmark cache once: attnserve's
served engine (``benchmarks.beam_runner``; the CPU) with all threads and, as one engine per thread
(``batching.instances``), as CTranslate2's N x 1 split, CTranslate2 per precision with each thread
split (and, on an AMD CPU with AVX-512, also with its AVX-512 kernels forced, as the engine
benchmark does), and HF ``generate(num_beams=...)`` with its KV cache for fp32. Every runner
lives in its own process and decodes exactly ``--new-tokens`` tokens per row (the minimum length
set to the maximum) for ``--batches`` source rows of 24 tokens; the runners alternate within
each of ``--repetitions`` rounds after a warm-up. Writes ``benchmarks/results/beam-search-*.json``:
per (precision, batch) each runner's new tokens/s of the median round (one row's best hypothesis
counts its tokens once) and the best attnserve runner's ratios to the best CTranslate2 runner
and to HF, with the machine.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import DEFAULT_RESULTS, log, write_probe

SOURCE_TOKENS = 24


def runner_specs(
    precisions: tuple[str, ...], beam_size: int, new_tokens: int, max_batch: int, tiny: bool
) -> list[Any]:
    """The runners to build (exports and conversions done, cached): attnserve, CTranslate2 and,
    for fp32, HF per precision."""
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.machine import cpu_model_and_flags
    from benchmarks.marian import BASE, TINY, build_marian, default_cache, vocabulary
    from benchmarks.peers import (
        CT2_TYPES,
        convert_ctranslate2,
        ct2_forced_isas,
        ct2_name,
        thread_splits,
    )
    from benchmarks.runners import RunnerSpec

    shape, cache = (TINY if tiny else BASE), default_cache()
    threads = multiprocessing.cpu_count()
    marian_dir = build_marian(cache, shape)
    specs = []
    for precision in precisions:
        entry = export_attnserve(marian_dir, cache, shape, precision, fast_int8=tiny)
        beam = {"new_tokens": new_tokens, "beam_size": beam_size}
        for instances in sorted({1, threads}):  # one engine, and one per thread (as CT2's N x 1)
            kwargs = {
                "entry": entry,
                "precision": precision,
                "threads": threads,
                "max_batch": max_batch,
                "instances": instances,
                **beam,
            }
            name = f"attnserve-{precision}-beam{beam_size}"
            name += f"-{instances}x1" if instances > 1 else ""
            specs.append(RunnerSpec(name, "attnserve-beam", kwargs))
        model_dir = convert_ctranslate2(marian_dir, cache, CT2_TYPES[precision])
        isas: list[str | None] = [None, *ct2_forced_isas(*cpu_model_and_flags())]
        for isa, (inter, intra) in itertools.product(isas, thread_splits(threads)):
            kwargs = {
                "model_dir": model_dir,
                "vocabulary": vocabulary(shape),
                "precision": precision,
                "inter_threads": inter,
                "intra_threads": intra,
                "cpu_isa": isa,
                **beam,
            }
            specs.append(RunnerSpec(ct2_name(precision, inter, intra, isa), "ctranslate2", kwargs))
        if precision == "fp32":
            kwargs = {"marian_dir": marian_dir, "use_cache": True, "threads": threads, **beam}
            specs.append(RunnerSpec("hf-generate-kv", "hf", kwargs))
    return specs


def time_runners(
    runners: list[Any], ids: np.ndarray, repetitions: int
) -> dict[str, dict[str, Any]]:
    """Per runner: the rounds' seconds (one warm-up first), alternating the runners per round,
    and its output's shape check."""
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    shapes: dict[str, list[int]] = {}
    for runner in runners:
        shapes[runner.name] = list(runner.run(ids).shape)  # warm-up
    for _ in range(repetitions):
        for runner in runners:
            seconds, _ = runner.timed_run(ids)
            times[runner.name].append(seconds)
    return {name: {"runs_s": runs, "output_shape": shapes[name]} for name, runs in times.items()}


def points_of(
    precision: str, batch: int, new_tokens: int, timed: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """One (precision, batch) point: tokens/s per runner and attnserve's ratios."""
    rates = {
        name: round(batch * new_tokens / statistics.median(t["runs_s"]), 1)
        for name, t in timed.items()
    }
    ours = max(rate for name, rate in rates.items() if name.startswith("attnserve-"))
    ct2 = max((rate for name, rate in rates.items() if name.startswith("ctranslate2-")), default=0)
    hf = rates.get("hf-generate-kv")
    return {
        "precision": precision,
        "batch": batch,
        "new_tokens_per_s": rates,
        "vs_ctranslate2": round(ours / ct2, 3) if ct2 else None,
        "vs_hf": round(ours / hf, 3) if hf else None,
        "runs": timed,
    }


def measure(
    precisions: tuple[str, ...],
    beam_size: int,
    batches: tuple[int, ...],
    new_tokens: int,
    repetitions: int,
    tiny: bool,
) -> list[dict[str, Any]]:
    from benchmarks.marian import BASE, TINY, source_ids
    from benchmarks.peers import Unavailable
    from benchmarks.runners import IsolatedRunner

    shape = TINY if tiny else BASE
    context = multiprocessing.get_context("spawn")
    specs = runner_specs(precisions, beam_size, new_tokens, max(batches), tiny)
    started = [IsolatedRunner(spec, context) for spec in specs]
    runners = []
    for runner in started:
        try:
            runners.append(runner.wait_ready())
            log(f"loaded {runner.name}")
        except Unavailable as err:
            log(f"skipping {runner.spec.name}: {err}")
    rng = np.random.default_rng(0)
    points = []
    try:
        for precision, batch in itertools.product(precisions, batches):
            ids = source_ids(rng, batch, SOURCE_TOKENS, shape)
            mine = [r for r in runners if r.precision == precision or r.family == "hf"]
            if precision != "fp32":
                mine = [r for r in mine if r.family != "hf"]
            log(f"{precision}, batch {batch}: {len(mine)} runners")
            points.append(
                points_of(precision, batch, new_tokens, time_runners(mine, ids, repetitions))
            )
    finally:
        for runner in runners:
            runner.close()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.beam_search")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--precisions", default="fp32,int8")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "beam-search")
    parser.add_argument("--tiny", action="store_true", help="the CI's tiny Marian model")
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p)
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    if not 2 <= args.beam_size <= 8 or set(precisions) - {"fp32", "int8"} or not batches:
        parser.error("--beam-size takes 2-8, --precisions fp32 and/or int8, --batches sizes")
    points = measure(
        precisions, args.beam_size, batches, args.new_tokens, args.repetitions, args.tiny
    )
    write_probe(
        "beam-search",
        points,
        args.out,
        args.tiny,
        0.0,
        beam_size=args.beam_size,
        new_tokens=args.new_tokens,
        source_tokens=SOURCE_TOKENS,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
