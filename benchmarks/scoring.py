"""Scoring given targets against CTranslate2's ``score_batch`` and a Hugging Face teacher-forced
forward, same model, same run.

    python -m benchmarks.scoring [--precisions fp32] [--batches 1,16,64] [--target-tokens 32]
                                 [--repetitions 3] [--reverse] [--max-foreign-share 0.1]
                                 [--out DIR] [--tiny]

attnserve's ``Score`` (``serving.scoring.Scorer``) gives each target token's log-probability
after its source from one encoder pass and one multi-token decoder pass (teacher forcing). This
probe times that pass on the engine benchmark's random Marian model (Marian-base shape, or the
CI's tiny one with ``--tiny``; exported and converted into the benchmark cache once) against
its peers, each in its own process (``benchmarks.runners.IsolatedRunner``'s protocol):

- ``attnserve-<precision>-score``: ``Scorer.score_batch`` over the backend the server builds
  (``serving.repository.make_backend`` with the server's ONNX Runtime settings, all usable
  cores as intra-op threads) and ``ScoringGraphs``, whose ``decoder.onnx`` (the server decodes
  through the in-place graphs) is loaded before timing, as the server loads it on its first
  ``Score`` request;
- ``ctranslate2-<precision>-<inter>x<intra>[-avx512]``: ``Translator.score_batch`` with the
  engine benchmark's thread splits (and, on an AMD CPU with AVX-512, its AVX-512 kernels
  forced), the batch split evenly over the translation workers; the fastest is the peer;
- ``hf-forward``: ``MarianMTModel`` (fp32) called once on the sources and the start token plus
  the targets in ``torch.no_grad()`` without a cache (as with ``labels``), then
  ``log_softmax`` and ``gather``, with the HF runners' torch threads.

Every runner scores the same pairs: ``--batches`` rows of ``SOURCE_TOKENS`` source tokens (the
other benchmarks' sources) and ``--target-tokens`` random non-special target tokens (fixed
seed), and returns each row's log-probabilities of its target tokens and of EOS. Before timing,
each point checks that the runners agree: the largest absolute difference between attnserve's
log-probabilities and each peer's (``TOLERANCE`` per precision; the benchmark model suppresses
no ids, so attnserve's removal of ``suppress_ids`` before its log-softmax changes nothing here).
The runners are then timed as the engine benchmark times its own
(``benchmarks.engine_timing.bench_batch``): a warm-up, then ``--repetitions`` rounds of every
runner, the first of each round rotating (``--reverse``: the runners in the opposite order),
each run after a pause for spinning thread pools (CTranslate2's OpenMP workers) to sleep; each
round waits for other processes to leave the CPU (``--max-foreign-share``; not with ``--tiny``)
and a run during which they used more of it is repeated. Writes
``scoring-*.json``: per (precision, batch) each runner's scored tokens/s of the median round
(batch x (target tokens + 1): EOS is scored too), attnserve's ratios to the best CTranslate2
runner and to HF, the agreement, each run's share of the CPU other processes used (and the runs
discarded for it), the runners that could not run here with the reason, the command and the
machine; and beside it a PNG of the rates by batch, one line per runner.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.beam_search import SOURCE_TOKENS
from benchmarks.marian import MarianShape
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.peers import CTranslate2Runner, HFGenerateRunner, Runner, Unavailable
from benchmarks.runners import RunnerSpec, start_isolated

HF_NAME = "hf-forward"
# the largest absolute difference of a log-probability allowed between attnserve and a peer of
# the same precision (None: recorded, not checked: int8 quantises differently in each engine)
TOLERANCE: dict[str, float | None] = {"fp32": 1e-3, "int8": None}
TARGET_SEED = 1  # the targets' random ids (the sources: seed 0, as the other benchmarks')


def attnserve_name(precision: str) -> str:
    """The results' key of attnserve's scorer, e.g. ``attnserve-fp32-score``."""
    return f"attnserve-{precision}-score"


def target_ids(rng: np.random.Generator, batch: int, length: int, shape: MarianShape) -> np.ndarray:
    """(batch, length) random target token ids: no EOS, unknown or padding token."""
    return rng.integers(2, shape.vocab_size - 1, size=(batch, length), dtype=np.int64)


def pairs_of(sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The pairs as the runners take them: each row's source ids, then its target ids (one
    array, as ``IsolatedRunner`` sends; every runner knows its source length)."""
    return np.concatenate([sources, targets], axis=1)


class AttnServeScorer(Runner):
    """``serving.scoring.Scorer`` over ``entry`` as the server builds it; ``run`` returns each
    pair's (target tokens + 1) log-probabilities."""

    def __init__(
        self, entry: Path, precision: str, source_tokens: int, threads: int, device: str = "cpu"
    ) -> None:
        from benchmarks.serve_offline import served_config
        from contract.repository import resolve_version
        from serving.backends.base import BackendError
        from serving.repository import make_backend
        from serving.scoring import Scorer, ScoringGraphs

        config = served_config(entry, threads, device)
        version = resolve_version(entry)
        options = config.onnxruntime
        try:
            backend = make_backend(config, version)
            graphs = ScoringGraphs(backend, version, options)
            decoder = graphs.decoder()  # what the server loads on its first Score request
        except BackendError as err:
            raise Unavailable(str(err)) from err
        super().__init__(
            name=attnserve_name(precision),
            family="attnserve",
            precision=precision,
            label=f"attnserve {precision}, Scorer.score_batch (one decoder pass)",
            config={
                "entry": str(entry),
                "intra_op_threads": options.intra_op_threads,
                "allow_spinning": options.allow_spinning,
                "cpu_memory_arena": options.cpu_memory_arena,
                "providers": list(options.execution_providers),
                "server_graphs": sorted(backend.graphs()),
                "scoring_decoder": "own session" if decoder is not backend else "server's",
                "suppress_ids": list(config.decoder.suppress_ids),
            },
        )
        self.scorer = Scorer(graphs, config.decoder)
        self.source_tokens = source_tokens

    def run(self, ids: np.ndarray) -> np.ndarray:
        from serving.scoring import ScoreItem, from_result

        s = self.source_tokens
        items = [ScoreItem(row[:s], row[s:]) for row in ids]
        rows = []
        for result in self.scorer.score_batch(items):
            if isinstance(result, Exception):  # the export has no decoder.onnx
                raise result
            rows.append(from_result(result)[1])
        return np.stack(rows)

    def close(self) -> None:
        del self.scorer


class CTranslate2Scorer(CTranslate2Runner):
    """``Translator.score_batch`` on token strings, the batch split evenly over the translation
    workers; ``run`` returns each pair's log-probabilities (its target tokens' and EOS's)."""

    def __init__(self, source_tokens: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for key in ("beam_size", "controls"):
            self.config.pop(key)
        self.config["call"] = "score_batch"
        self.label = self.label.replace("CTranslate2", "CTranslate2 score_batch", 1)
        self.source_tokens = source_tokens

    def run(self, ids: np.ndarray) -> np.ndarray:
        s, vocabulary = self.source_tokens, self.vocabulary
        rows = ids.tolist()
        results = self.translator.score_batch(
            [[vocabulary[i] for i in row[:s]] for row in rows],
            [[vocabulary[i] for i in row[s:]] for row in rows],
            max_batch_size=max(1, math.ceil(len(rows) / self.inter_threads)),
            batch_type="examples",
        )
        return np.array([result.log_probs for result in results], dtype=np.float32)


class HFScorer(HFGenerateRunner):
    """``MarianMTModel`` called once per batch (teacher forcing, no cache), then
    ``log_softmax`` and ``gather``; ``run`` returns each pair's log-probabilities."""

    def __init__(self, marian_dir: Path, source_tokens: int, threads: int) -> None:
        super().__init__(marian_dir, 0, use_cache=False, threads=threads)
        self.name = HF_NAME
        self.label = "HF transformers forward (teacher forcing) + log_softmax + gather"
        for key in ("use_cache", "beam_size", "controls"):
            self.config.pop(key)
        self.config["call"] = "model(input_ids, attention_mask, decoder_input_ids)"
        self.source_tokens = source_tokens

    def run(self, ids: np.ndarray) -> np.ndarray:
        torch, config, s = self.torch, self.model.config, self.source_tokens
        pairs = torch.from_numpy(ids)
        sources, targets = pairs[:, :s], pairs[:, s:]
        start = torch.full((len(ids), 1), config.decoder_start_token_id, dtype=torch.long)
        eos = torch.full((len(ids), 1), config.eos_token_id, dtype=torch.long)
        with torch.no_grad():
            logits = self.model(
                input_ids=sources,
                attention_mask=torch.ones_like(sources),
                decoder_input_ids=torch.cat([start, targets], 1),
                use_cache=False,
            ).logits
            chosen = torch.cat([targets, eos], 1)
            log_probs = torch.log_softmax(logits, -1).gather(-1, chosen[..., None])[..., 0]
        return log_probs.numpy()


SCORERS: dict[str, type[Runner]] = {
    "attnserve-score": AttnServeScorer,
    "ctranslate2-score": CTranslate2Scorer,
    "hf-score": HFScorer,
}


def make_scorer(spec: RunnerSpec) -> Runner:
    """Build the scorer ``spec`` describes (raises Unavailable when it cannot run here)."""
    return SCORERS[spec.factory](**spec.kwargs)


def scorer_specs(
    precisions: tuple[str, ...],
    target_tokens: int,
    tiny: bool,
    skipped: list[dict[str, str]],
) -> list[RunnerSpec]:
    """The scorers to build (exports and conversions done, cached): attnserve per precision,
    the engine benchmark's CTranslate2 runners (thread splits, forced ISA) and HF (fp32);
    peers that cannot run here land in ``skipped``."""
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.engine_settings import EngineSettings
    from benchmarks.marian import BASE, TINY, build_marian, default_cache
    from benchmarks.peers import hf_available
    from benchmarks.runners import ctranslate2_specs

    shape, cache = (TINY if tiny else BASE), default_cache()
    threads = len(os.sched_getaffinity(0))
    marian_dir = build_marian(cache, shape)
    settings = EngineSettings(
        shape=shape, new_tokens=target_tokens, threads=threads, precisions=precisions
    )
    specs = []
    for precision in precisions:
        entry = export_attnserve(marian_dir, cache, shape, precision, fast_int8=tiny)
        kwargs = {
            "entry": entry,
            "precision": precision,
            "source_tokens": SOURCE_TOKENS,
            "threads": threads,
        }
        specs.append(RunnerSpec(attnserve_name(precision), "attnserve-score", kwargs))
    specs += [
        RunnerSpec(p.name, "ctranslate2-score", {**p.kwargs, "source_tokens": SOURCE_TOKENS})
        for p in ctranslate2_specs(settings, marian_dir, cache, skipped)
    ]
    if "fp32" in precisions:
        reason = hf_available("cpu")
        if reason is None:
            kwargs = {"marian_dir": marian_dir, "source_tokens": SOURCE_TOKENS, "threads": threads}
            specs.append(RunnerSpec(HF_NAME, "hf-score", kwargs))
        else:
            skipped.append({"engine": HF_NAME, "reason": reason})
    return specs


def agreement(
    precision: str, outputs: dict[str, np.ndarray], expected_shape: tuple[int, int]
) -> dict[str, Any]:
    """The largest absolute difference between attnserve's log-probabilities and each peer's
    (every output checked to be ``expected_shape`` first), and whether all are within
    ``TOLERANCE``."""
    for name, out in outputs.items():
        if out.shape != expected_shape:
            raise RuntimeError(f"{name} returned {out.shape} log-probabilities, {expected_shape}")
    ours = outputs.get(attnserve_name(precision))
    tolerance = TOLERANCE.get(precision)
    diffs = {}
    if ours is not None:
        diffs = {
            name: float(np.abs(ours.astype(np.float64) - out).max())
            for name, out in outputs.items()
            if name != attnserve_name(precision)
        }
    within = None if tolerance is None or not diffs else max(diffs.values()) <= tolerance
    if within is False:
        log(f"{precision}: attnserve differs from its peers by {diffs} (tolerance {tolerance})")
    return {
        "reference": attnserve_name(precision),
        "tolerance": tolerance,
        "max_abs_diff": diffs,
        "within_tolerance": within,
    }


def point_of(
    precision: str,
    batch: int,
    target_tokens: int,
    timed: dict[str, dict[str, Any]],
    agreed: dict[str, Any],
) -> dict[str, Any]:
    """One (precision, batch) point: scored tokens/s per runner and attnserve's ratios."""
    scored = batch * (target_tokens + 1)
    rates = {name: round(scored / statistics.median(t["runs_s"]), 1) for name, t in timed.items()}
    ours = rates.get(attnserve_name(precision))
    ct2 = {name: rate for name, rate in rates.items() if name.startswith("ctranslate2-")}
    best = max(ct2, key=lambda name: ct2[name]) if ct2 else None
    hf = rates.get(HF_NAME)
    return {
        "precision": precision,
        "batch": batch,
        "scored_tokens": scored,
        "scored_tokens_per_s": rates,
        "best_ctranslate2": best,
        "vs_ctranslate2": round(ours / ct2[best], 3) if ours and best else None,
        "vs_hf": round(ours / hf, 3) if ours and hf else None,
        "agreement": agreed,
        "runs": timed,
    }


def measure(
    precisions: tuple[str, ...],
    batches: tuple[int, ...],
    target_tokens: int,
    repetitions: int,
    tiny: bool,
    reverse: bool = False,
    skipped: list[dict[str, str]] | None = None,
    max_foreign_share: float | None = None,
) -> list[dict[str, Any]]:
    """The points per (precision, batch), timed as the engine benchmark times its runners
    (``benchmarks.engine_timing.bench_batch``: a warm-up, then rounds of every runner, the first
    rotating, each run after a pause for spinning thread pools to sleep; with
    ``max_foreign_share`` each round waits for that quiet and a run during which other processes
    used more of the CPU is repeated). Runners that cannot run here, or fail on a batch, land in
    ``skipped``."""
    from benchmarks.engine_settings import EngineSettings
    from benchmarks.engine_timing import bench_batch
    from benchmarks.marian import BASE, TINY, source_ids

    shape = TINY if tiny else BASE
    skipped = skipped if skipped is not None else []
    timing = EngineSettings(
        shape=shape,
        new_tokens=target_tokens + 1,  # every runner's log-probabilities per row
        repetitions=repetitions,
        warmup=1,
        pause_s=0.0 if tiny else 0.2,
        max_foreign_share=max_foreign_share,
        tiny=tiny,
    )
    context = multiprocessing.get_context("spawn")
    specs = scorer_specs(precisions, target_tokens, tiny, skipped)
    runners = start_isolated(specs, context, skipped, make_scorer)
    if reverse:
        runners.reverse()
    sources_rng, targets_rng = np.random.default_rng(0), np.random.default_rng(TARGET_SEED)
    failed: dict[str, str] = {}
    points = []
    try:
        for precision, batch in itertools.product(precisions, batches):
            sources = source_ids(sources_rng, batch, SOURCE_TOKENS, shape)
            pairs = pairs_of(sources, target_ids(targets_rng, batch, target_tokens, shape))
            mine = [r for r in runners if r.precision == precision and r.name not in failed]
            log(f"{precision}, batch {batch}: {len(mine)} runners")
            outputs = {}
            for runner in mine:
                try:
                    outputs[runner.name] = runner.run(pairs)
                except Exception as err:
                    failed[runner.name] = f"{type(err).__name__}: {err}"
                    log(f"{runner.name} failed: {err}")
            agreed = agreement(precision, outputs, (batch, target_tokens + 1))
            rows = bench_batch(timing, [r for r in mine if r.name in outputs], pairs, failed)
            timed = {
                row["engine"]: {
                    key: row[key] for key in ("runs_s", "foreign_cpu_share_runs", "discarded_runs")
                }
                for row in rows
                if row["runs_s"]
            }
            points.append(point_of(precision, batch, target_tokens, timed, agreed))
            points[-1]["order"] = list(timed)  # the first round's; later rounds rotate it
    finally:
        for runner in runners:
            runner.close()
    skipped += [{"engine": name, "reason": reason} for name, reason in failed.items()]
    return points


def plot(result: dict[str, Any], path: Path) -> Path:
    """Scored tokens/s by batch (log-log), one line per runner, a panel per precision."""
    from benchmarks.plots import ENGINE_COLOURS, _pyplot, _title

    plt = _pyplot()
    points = result["points"]
    precisions = list(dict.fromkeys(p["precision"] for p in points))
    fig, axes = plt.subplots(
        1, len(precisions), figsize=(6.5 * len(precisions), 4.8), squeeze=False
    )
    styles = itertools.cycle(["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))])
    for ax, precision in zip(axes[0], precisions, strict=True):
        mine = sorted((p for p in points if p["precision"] == precision), key=lambda p: p["batch"])
        families = list(ENGINE_COLOURS)  # attnserve, then CTranslate2's, then HF, whatever order
        names = sorted(
            {n for p in mine for n in p["scored_tokens_per_s"]},
            key=lambda n: (next(i for i, f in enumerate(families) if n.startswith(f)), n),
        )
        for name in names:
            line = [p for p in mine if name in p["scored_tokens_per_s"]]
            family = next(f for f in ENGINE_COLOURS if name.startswith(f))
            ax.plot(
                [p["batch"] for p in line],
                [p["scored_tokens_per_s"][name] for p in line],
                linestyle=next(styles) if family == "ctranslate2" else "-",
                marker="o",
                color=ENGINE_COLOURS[family],
                label=name,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        batches = [p["batch"] for p in mine]
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch (pairs)")
        ax.set_ylabel("scored target tokens / s (log)")
        ax.set_title(f"{precision}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Scoring (teacher forcing): source {result['source_tokens']}, target "
        f"{result['target_tokens']} + EOS tokens\n{_title(result)}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scoring")
    parser.add_argument("--precisions", default="fp32")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--target-tokens", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--reverse", action="store_true", help="alternate the runners backwards")
    parser.add_argument(
        "--max-foreign-share",
        type=float,
        default=0.1,
        help="time a point again where other processes used more of the CPU (--tiny: never)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "scoring")
    parser.add_argument("--tiny", action="store_true", help="the CI's tiny Marian model")
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p)
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    if set(precisions) - {"fp32", "int8"} or not precisions:
        parser.error("--precisions takes fp32 and / or int8 (the CPU's)")
    from benchmarks.marian import BASE, TINY

    positions = (TINY if args.tiny else BASE).max_positions
    if not batches or min(batches) < 1 or not 1 <= args.target_tokens < positions:
        parser.error(f"--batches takes sizes >= 1, --target-tokens 1-{positions - 1}")
    if args.repetitions < 1:
        parser.error("--repetitions takes 1 or more")
    skipped: list[dict[str, str]] = []
    started = time.perf_counter()
    quiet = None if args.tiny else args.max_foreign_share
    points = measure(
        precisions,
        batches,
        args.target_tokens,
        args.repetitions,
        args.tiny,
        args.reverse,
        skipped,
        quiet,
    )
    path = write_probe(
        "scoring",
        points,
        args.out,
        args.tiny,
        round(time.perf_counter() - started, 1),
        command=shlex.join(["python", "-m", "benchmarks.scoring", *argv]),
        source_tokens=SOURCE_TOKENS,
        target_tokens=args.target_tokens,
        repetitions=args.repetitions,
        reverse=args.reverse,
        max_foreign_share=quiet,
        skipped=skipped,
    )
    print(plot(json.loads(path.read_text()), path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
