"""`attnserve train` and `attnserve eval`. torch is imported only when a command runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KINDS = ("translator", "vit", "captioner")


def add_parsers(subparsers: Any) -> None:
    """Register the train and eval subcommands."""
    train = subparsers.add_parser(
        "train", help="train a model on generated / packaged data and write a checkpoint"
    )
    train.add_argument("kind", choices=KINDS)
    train.add_argument("--out", type=Path, help="checkpoint directory (default: runs/KIND)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--steps", type=int, help="optimiser steps (default: the trainer's)")
    train.add_argument(
        "--time-budget", type=float, help="seconds; the schedule finishes by then (default 840)"
    )
    train.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    train.set_defaults(handler=run_train)

    evaluate = subparsers.add_parser(
        "eval", help="print held-out metrics of a checkpoint as JSON (last line of stdout)"
    )
    evaluate.add_argument("kind", choices=KINDS)
    source = evaluate.add_mutually_exclusive_group()
    source.add_argument(
        "--checkpoint", type=Path, help="checkpoint directory (default: the shipped one)"
    )
    source.add_argument(
        "--repository",
        type=Path,
        help="an exported model-repository entry REPOSITORY/NAME, evaluated through ONNX Runtime",
    )
    evaluate.add_argument("--examples", type=int, help="held-out examples (default: all / 1500)")
    evaluate.set_defaults(handler=run_eval)


def run_train(args: argparse.Namespace) -> int:
    """Train one model kind and print its metrics JSON."""
    import importlib
    from dataclasses import replace

    import torch

    trainer = importlib.import_module(f"models.train.{args.kind}")
    overrides: dict[str, Any] = {"seed": args.seed, "threads": args.threads}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.time_budget is not None:
        overrides["time_budget_s"] = args.time_budget
    settings = replace(trainer.DEFAULTS, **overrides)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path("runs") / args.kind
    metrics = trainer.train(out, settings=settings)
    print(f"checkpoint written to {out}", file=sys.stderr)
    print(json.dumps({"kind": args.kind, "checkpoint": str(out), **metrics["held_out"]}))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint (or an exported repository entry) and print one JSON line."""
    if args.repository is not None:
        from export.evaluate import evaluate_repository  # ONNX Runtime path (export issue)

        result = evaluate_repository(args.kind, args.repository, examples=args.examples)
        print(json.dumps({"kind": args.kind, "repository": str(args.repository), **result}))
        return 0
    from models import evaluate
    from models.checkpoint import load_checkpoint, shipped_checkpoint

    directory = args.checkpoint or shipped_checkpoint(args.kind)
    checkpoint = load_checkpoint(directory, expected_kind=args.kind)
    if args.kind == "translator":
        result = evaluate.evaluate_translator(
            checkpoint.model, checkpoint.tokenizer, **_examples(args)
        )
    elif args.kind == "captioner":
        result = evaluate.evaluate_captioner(
            checkpoint.model, checkpoint.tokenizer, **_examples(args)
        )
    else:
        result = evaluate.evaluate_vit(checkpoint.model)
    print(json.dumps({"kind": args.kind, "checkpoint": str(directory), **result}))
    return 0


def _examples(args: argparse.Namespace) -> dict[str, int]:
    return {} if args.examples is None else {"examples": args.examples}
