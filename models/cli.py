"""`attnserve train`. torch is imported only when the command runs.

`attnserve eval` lives in ``export.cli``: it evaluates checkpoints and exported entries alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from models.config import MODEL_KINDS


def add_parsers(subparsers: Any) -> None:
    """Register the train subcommand."""
    train = subparsers.add_parser(
        "train", help="train a model on generated / packaged data and write a checkpoint"
    )
    train.add_argument("kind", choices=MODEL_KINDS)
    train.add_argument("--out", type=Path, help="checkpoint directory (default: runs/KIND)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--steps", type=int, help="optimiser steps (default: the trainer's)")
    train.add_argument(
        "--time-budget", type=float, help="seconds; the schedule finishes by then (default 840)"
    )
    train.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    train.set_defaults(handler=run_train)


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
