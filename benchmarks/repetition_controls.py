"""Repetition controls, scores and target prefixes against CTranslate2 and Hugging Face
``generate``, same model, same run.

    python -m benchmarks.repetition_controls [--setups none,penalty,ngram,both,scores,prefix,...]
        [--beam-sizes 1,4] [--precisions fp32] [--batches 1,16] [--new-tokens 32]
        [--repetitions 3] [--out DIR] [--tiny]

``repetition_penalty``, ``no_repeat_ngram_size`` and ``return_log_probs`` take a request off
attnserve's fast greedy path (every row's argmax in one pass, or on the device): its rows are
chosen one by one from the host logits, as sampled rows are. This probe times what that costs,
and where the peers stand with the same options: for each setup (``none``; ``penalty``:
``repetition_penalty`` 1.2; ``ngram``: ``no_repeat_ngram_size`` 3; ``both``; ``scores``:
attnserve's ``return_log_probs``, CTranslate2's ``return_scores``, ``generate``'s
``output_scores``; beam search scores its hypotheses in any case; ``prefix``: a target prefix of
each row's first 8 source tokens, which attnserve feeds one a decode step, CTranslate2 and
``generate`` in one decoder pass; ``samples``: 5 random samples of each row, attnserve's
``num_alternatives``, CTranslate2's ``num_hypotheses``, ``generate``'s ``num_return_sequences``,
all 5 counted; ``bad_words``: 16 bad words of one and two tokens, attnserve's ``bad_words``,
CTranslate2's ``suppress_sequences``, ``generate``'s ``bad_words_ids``; ``stop``: a stop string
no output holds, attnserve's ``stop``, the peers plain: its cost alone; ``top_log_probs``: each
position's 5 most likely tokens, attnserve's ``top_log_probs``, the peers' whole vocabulary per
position, CTranslate2's ``return_logits_vocab``, ``generate``'s ``output_scores``)
and beam size,
``benchmarks.beam_search``'s runners (the served engine, CTranslate2's thread splits, HF
``generate`` with its KV cache) on the engine benchmark's random Marian model (Marian-base shape,
or the CI's tiny one with ``--tiny``) decode exactly ``--new-tokens`` tokens per row,
alternating within each round. Writes ``repetition-controls-*.json``: per (setup, beam size,
precision, batch) each runner's new tokens/s, attnserve's ratios to the best CTranslate2 runner
and to HF, and each runner's rate relative to its own rate without controls (``vs_none``: from
the ``none`` setup's runners, started anew for each setup, so that ratio also holds the
machine's drift between setups).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.beam_search import SOURCE_TOKENS, measure
from benchmarks.output import DEFAULT_RESULTS, log, write_probe

FACTORIES = ("attnserve-beam", "ctranslate2", "hf")


def same(options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The same decoding options for every runner factory."""
    return {factory: options for factory in FACTORIES}


# 8 one-token and 8 two-token bad words, ids within the tiny model's vocabulary too
BAD_WORDS = [[20 + 7 * i] for i in range(8)] + [[101 + 9 * i, 103 + 9 * i] for i in range(8)]
STOP = "\u2407"  # a character no vocabulary entry holds: the check runs, nothing stops

# per setup, each runner factory's decoding options
SETUPS: dict[str, dict[str, dict[str, Any]]] = {
    "none": same({}),
    "penalty": same({"repetition_penalty": 1.2}),
    "ngram": same({"no_repeat_ngram_size": 3}),
    "both": same({"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}),
    # each token's log-probability (attnserve), the output's score (CTranslate2's
    # return_scores), generate's scores per step (output_scores)
    "scores": {
        "attnserve-beam": {"return_log_probs": True},
        "ctranslate2": {"return_scores": True},
        "hf": {"output_scores": True, "return_dict_in_generate": True},
    },
    # each position's 5 most likely tokens with their log-probabilities (with beams: of the
    # beam each token came through): attnserve's top_log_probs; the peers have no top-k of
    # their own and return every position's whole vocabulary, CTranslate2's
    # return_logits_vocab, generate's output_scores (the caller's top-k is not timed)
    "top_log_probs": {
        "attnserve-beam": {"return_log_probs": True, "top_log_probs": 5},
        "ctranslate2": {"return_scores": True, "return_logits_vocab": True},
        "hf": {"output_scores": True, "return_dict_in_generate": True},
    },
    # each row's first source tokens as its target prefix; the tokens after it are timed
    "prefix": same({"prefix_tokens": 8}),
    # SAMPLES random samples of each row at temperature 1 over the whole vocabulary (greedy
    # search only): attnserve's num_alternatives, CTranslate2's num_hypotheses, generate's
    # num_return_sequences; every sample's tokens are counted
    "samples": {
        "attnserve-beam": {"temperature": 1.0, "seed": 1, "num_alternatives": 4},
        "ctranslate2": {"sampling_topk": 0, "sampling_temperature": 1.0, "num_hypotheses": 5},
        "hf": {"do_sample": True, "temperature": 1.0, "top_k": 0, "num_return_sequences": 5},
    },
    # BAD_WORDS as token ids: attnserve's bad words (a request's ``bad_words``, tokenized),
    # CTranslate2's suppress_sequences, generate's bad_words_ids
    "bad_words": same({"bad_words_ids": BAD_WORDS}),
    # a stop string no output holds (greedy search only): attnserve matches each row's decoded
    # text as its tokens arrive; the peers decode plainly (CTranslate2 has no stop strings, its
    # end_token is a token; generate's stop_strings cannot read the benchmark model's synthetic
    # vocabulary: its vocabulary cleaning tokenizes "abcdef", which that vocabulary cannot spell)
    "stop": {"attnserve-beam": {"stop": [STOP]}, "ctranslate2": {}, "hf": {}},
}
SAMPLES = 5  # outputs per row in the ``samples`` setup
GREEDY_ONLY = ("samples", "stop")  # setups without beam search


def setup_controls(setup: str, beam_size: int) -> dict[str, dict[str, Any]]:
    """A setup's options for ``beam_size``: beam search scores its hypotheses anyway, and
    attnserve takes ``return_log_probs`` with greedy decoding and sampling only (``samples``
    runs without beams: ``main`` skips it there)."""
    controls = SETUPS[setup]
    if beam_size > 1 and setup == "scores":
        return {**controls, "attnserve-beam": {}}
    return controls


def counting_samples(point: dict[str, Any]) -> dict[str, Any]:
    """A ``samples`` point with every runner's rate counting all ``SAMPLES`` outputs of a row
    (the runners time the whole call; the ratios between them do not change)."""
    rates = point["new_tokens_per_s"]
    point["new_tokens_per_s"] = {name: round(rate * SAMPLES, 1) for name, rate in rates.items()}
    point["samples_per_row"] = SAMPLES
    return point


def with_costs(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point with ``vs_none``: every runner's rate over its rate in the ``none`` setup of
    the same beam size, precision and batch (where that setup ran)."""
    plain = {
        (p["beam_size"], p["precision"], p["batch"]): p["new_tokens_per_s"]
        for p in points
        if p["setup"] == "none"
    }
    for point in points:
        base = plain.get((point["beam_size"], point["precision"], point["batch"]), {})
        point["vs_none"] = {
            name: round(rate / base[name], 3)
            for name, rate in point["new_tokens_per_s"].items()
            if base.get(name)
        }
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.repetition_controls")
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--beam-sizes", default="1,4")
    parser.add_argument("--precisions", default="fp32")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "repetition-controls")
    parser.add_argument("--tiny", action="store_true", help="the CI's tiny Marian model")
    args = parser.parse_args(argv)
    setups = [s for s in args.setups.split(",") if s]
    beams = [int(b) for b in args.beam_sizes.split(",") if b]
    precisions = tuple(p for p in args.precisions.split(",") if p)
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    if set(setups) - set(SETUPS) or not all(1 <= b <= 8 for b in beams) or not batches:
        parser.error(f"--setups takes some of {', '.join(SETUPS)}, --beam-sizes 1-8, --batches")
    if set(precisions) - {"fp32", "int8"} or not precisions:
        parser.error("--precisions takes fp32 and / or int8 (the CPU's)")
    skipped: list[dict[str, str]] = []
    points = []
    for beam_size in beams:
        for setup in setups:
            if setup in GREEDY_ONLY and beam_size > 1:
                continue  # sampling has no beams; a beam has no single text to stop
            log(f"setup {setup}, beam size {beam_size}")
            for point in measure(
                precisions,
                beam_size,
                batches,
                args.new_tokens,
                args.repetitions,
                args.tiny,
                skipped=skipped,
                controls=setup_controls(setup, beam_size),
            ):
                controls = setup_controls(setup, beam_size)
                points.append({"setup": setup, "controls": controls, "beam_size": beam_size})
                points[-1].update(counting_samples(point) if setup == "samples" else point)
    write_probe(
        "repetition-controls",
        with_costs(points),
        args.out,
        args.tiny,
        0.0,
        new_tokens=args.new_tokens,
        source_tokens=SOURCE_TOKENS,
        skipped=skipped,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
