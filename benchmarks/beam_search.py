"""Beam search against CTranslate2 and Hugging Face ``generate``, same model, same run.

    python -m benchmarks.beam_search [--beam-size 4] [--precisions fp32,int8] [--batches 1,8]
                                     [--new-tokens 32] [--repetitions 3] [--out DIR] [--tiny]
                                     [--device cuda --precisions fp32,fp16]

`attnserve bench engine` times greedy decoding. Translation users often ask for beams
(CTranslate2's ``translate_batch`` defaults to 2, Marian's generation configs to 4), so this probe
times beam search on the engine benchmark's random Marian model (Marian-base shape, or the CI's
tiny one with ``--tiny``), exported and converted into the benchmark cache once: attnserve's
served engine (``benchmarks.beam_runner``) with all threads and, on the CPU, as one engine per
thread (``batching.instances``), as CTranslate2's N x 1 split, CTranslate2 per precision with each
thread split (and, on an AMD CPU with AVX-512, also with its AVX-512 kernels forced, as the engine
benchmark does), and HF ``generate(num_beams=...)`` with its KV cache for fp32 (and fp16 on a
GPU, ``--device cuda``, where CTranslate2 runs one translation of one thread). Every runner
lives in its own process and decodes exactly ``--new-tokens`` tokens per row (the minimum length
set to the maximum) for ``--batches`` source rows of 24 tokens; the runners alternate within
each of ``--repetitions`` rounds after a warm-up. Writes ``benchmarks/results/beam-search-*.json``:
per (precision, batch) each runner's new tokens/s of the median round (one row's best hypothesis
counts its tokens once) and the best attnserve runner's ratios to the best CTranslate2 runner
and to HF, the runners that could not run here with the reason, and the machine.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import DEFAULT_RESULTS, log, write_probe

SOURCE_TOKENS = 24


def runner_specs(
    precisions: tuple[str, ...],
    beam_size: int,
    new_tokens: int,
    max_batch: int,
    tiny: bool,
    device: str = "cpu",
    skipped: list[dict[str, str]] | None = None,
    controls: dict[str, dict[str, Any]] | None = None,
) -> list[Any]:
    """The runners to build (exports and conversions done, cached): attnserve, and the engine
    benchmark's CTranslate2 runners and HF ``generate`` with its KV cache (fp32, fp16), each
    given ``beam_size`` (and further decoding options, ``controls`` by runner factory:
    ``attnserve-beam``, ``ctranslate2``, ``hf``); peers that cannot run here land in
    ``skipped``."""
    controls = controls or {}
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.beam_runner import beam_runner_name
    from benchmarks.engine_settings import EngineSettings
    from benchmarks.marian import BASE, TINY, build_marian, default_cache
    from benchmarks.peers import hf_name
    from benchmarks.runners import RunnerSpec, ctranslate2_specs, hf_specs

    shape, cache = (TINY if tiny else BASE), default_cache()
    threads = len(os.sched_getaffinity(0))
    marian_dir = build_marian(cache, shape)
    skipped = skipped if skipped is not None else []
    settings = EngineSettings(
        shape=shape, new_tokens=new_tokens, threads=threads, device=device, precisions=precisions
    )
    specs = []
    for precision in precisions:
        entry = export_attnserve(marian_dir, cache, shape, precision, fast_int8=tiny)
        # one engine, and on the CPU one per thread (as CTranslate2's N x 1)
        for instances in sorted({1, threads if device == "cpu" else 1}):
            kwargs = {
                "entry": entry,
                "precision": precision,
                "new_tokens": new_tokens,
                "beam_size": beam_size,
                "device": device,
                "threads": threads,
                "max_batch": max_batch,
                "instances": instances,
                "controls": controls.get("attnserve-beam"),
            }
            name = beam_runner_name(precision, beam_size, instances, threads)
            specs.append(RunnerSpec(name, "attnserve-beam", kwargs))
    hf_skipped: list[dict[str, str]] = []
    peers = ctranslate2_specs(settings, marian_dir, cache, skipped) + [
        spec
        for spec in hf_specs(settings, marian_dir, hf_skipped)
        if spec.kwargs["use_cache"] and spec.kwargs["precision"] in precisions
    ]
    wanted = {hf_name(True, precision) for precision in precisions}
    skipped += [entry for entry in hf_skipped if entry["engine"] in wanted]
    specs += [
        RunnerSpec(
            p.name,
            p.factory,
            {**p.kwargs, "beam_size": beam_size, "controls": controls.get(p.factory)},
        )
        for p in peers
    ]
    return specs


def time_runners(
    runners: list[Any], ids: np.ndarray, repetitions: int, failed: list[dict[str, str]]
) -> dict[str, dict[str, Any]]:
    """Per runner: the rounds' seconds (one warm-up first), alternating the runners per round,
    and its output's shape check. A runner whose warm-up fails lands in ``failed`` with the
    error and is left out of the rounds."""
    shapes: dict[str, list[int]] = {}
    working = []
    for runner in runners:
        try:
            shapes[runner.name] = list(runner.run(ids).shape)  # warm-up
        except Exception as err:  # e.g. a provider that cannot run this step
            failed.append({"engine": runner.name, "reason": f"{type(err).__name__}: {err}"})
            log(f"{runner.name} failed: {err}")
            continue
        working.append(runner)
    runners = working
    times: dict[str, list[float]] = {r.name: [] for r in runners}
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
    ours = max((rate for name, rate in rates.items() if name.startswith("attnserve-")), default=0)
    ct2 = max((rate for name, rate in rates.items() if name.startswith("ctranslate2-")), default=0)
    hf = next((rate for name, rate in rates.items() if name.startswith("hf-generate-kv")), None)
    return {
        "precision": precision,
        "batch": batch,
        "new_tokens_per_s": rates,
        "vs_ctranslate2": round(ours / ct2, 3) if ours and ct2 else None,
        "vs_hf": round(ours / hf, 3) if ours and hf else None,
        "runs": timed,
    }


def measure(
    precisions: tuple[str, ...],
    beam_size: int,
    batches: tuple[int, ...],
    new_tokens: int,
    repetitions: int,
    tiny: bool,
    device: str = "cpu",
    skipped: list[dict[str, str]] | None = None,
    controls: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The points per (precision, batch), every runner decoding with its factory's
    ``controls`` besides ``beam_size``; runners that cannot run here land in ``skipped``."""
    from benchmarks.marian import BASE, TINY, source_ids
    from benchmarks.runners import start_isolated

    shape = TINY if tiny else BASE
    context = multiprocessing.get_context("spawn")
    skipped = skipped if skipped is not None else []
    specs = runner_specs(
        precisions, beam_size, new_tokens, max(batches), tiny, device, skipped, controls
    )
    runners = start_isolated(specs, context, skipped)
    rng = np.random.default_rng(0)
    points = []
    try:
        for precision, batch in itertools.product(precisions, batches):
            ids = source_ids(rng, batch, SOURCE_TOKENS, shape)
            mine = [r for r in runners if r.precision == precision]
            log(f"{precision}, batch {batch}: {len(mine)} runners")
            points.append(
                points_of(
                    precision, batch, new_tokens, time_runners(mine, ids, repetitions, skipped)
                )
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
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: ONNX Runtime's CUDA provider, CTranslate2 and HF on the GPU (fp32, fp16)",
    )
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p)
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    allowed = {"cpu": {"fp32", "int8"}, "cuda": {"fp32", "fp16"}}[args.device]
    if not 2 <= args.beam_size <= 8 or set(precisions) - allowed or not precisions or not batches:
        parser.error(
            f"--beam-size takes 2-8, --precisions some of {', '.join(sorted(allowed))} on "
            f"{args.device}, --batches sizes"
        )
    skipped: list[dict[str, str]] = []
    points = measure(
        precisions,
        args.beam_size,
        batches,
        args.new_tokens,
        args.repetitions,
        args.tiny,
        args.device,
        skipped,
    )
    write_probe(
        "beam-search",
        points,
        args.out,
        args.tiny,
        0.0,
        args.device,
        beam_size=args.beam_size,
        new_tokens=args.new_tokens,
        source_tokens=SOURCE_TOKENS,
        skipped=skipped,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
