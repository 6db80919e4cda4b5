"""`attnserve export` and `attnserve export-all`. torch is imported only when a command runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from serving.model_config import CONFIG_FILE  # noqa: F401 - torch-free import check

DEFAULT_OPSET = 23
PRECISIONS = ("fp32", "fp16", "int8")


def add_parsers(subparsers: Any) -> None:
    """Register the export and export-all subcommands."""
    export = subparsers.add_parser(
        "export",
        help="export a model to an ONNX model-repository entry, checked against PyTorch",
        description="SOURCE is a shipped model kind (translator, vit, captioner), a checkpoint "
        "directory from `attnserve train`, or a local Hugging Face save_pretrained directory "
        "(MarianMT, ViTForImageClassification, VisionEncoderDecoderModel).",
    )
    export.add_argument("source", metavar="SOURCE")
    export.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="REPOSITORY",
        help="model repository directory (created if needed)",
    )
    export.add_argument("--name", help="entry name (default: the model kind)")
    export.add_argument("--version", type=int, default=1, help="version folder (default 1)")
    export.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        help="ONNX opset; >= 23 gives the fused Attention op (default 23)",
    )
    export.add_argument("--precision", choices=PRECISIONS, default="fp32")
    export.add_argument(
        "--tensorrt",
        action="store_true",
        help="also build TensorRT engines (needs TensorRT and an NVIDIA GPU)",
    )
    export.add_argument("--force", action="store_true", help="overwrite an existing version")
    export.add_argument(
        "--parity-examples",
        type=int,
        default=128,
        help="held-out examples decoded end to end against PyTorch (>= 100)",
    )
    export.set_defaults(handler=run_export)

    export_all = subparsers.add_parser(
        "export-all", help="export every model of a PLAN.yaml in parallel processes"
    )
    export_all.add_argument("plan", type=Path, metavar="PLAN.yaml")
    export_all.add_argument(
        "--jobs", type=int, default=0, help="parallel processes (default: the plan's, else 2)"
    )
    export_all.add_argument(
        "--repository", type=Path, help="export into this repository instead of the plan's"
    )
    export_all.set_defaults(handler=run_export_all)


def run_export(args: argparse.Namespace) -> int:
    """Export one model and print a summary JSON line."""
    from export.exporter import ExportOptions, export

    if args.parity_examples < 100:
        raise ValueError("--parity-examples must be >= 100 (the end-to-end parity rule)")
    options = ExportOptions(
        name=args.name,
        version=args.version,
        opset=args.opset,
        precision=args.precision,
        tensorrt=args.tensorrt,
        force=args.force,
        parity_examples=args.parity_examples,
    )
    result = export(args.source, args.out, options)
    print(json.dumps(summary(result.manifest, result.version_dir)))
    return 0


def summary(manifest: dict[str, Any], version_dir: Path) -> dict[str, Any]:
    """The one-line summary of an export."""
    parity = manifest["parity"]
    return {
        "entry": str(version_dir),
        "precision": manifest["precision"],
        "opset": manifest["opset"],
        "attention_nodes": {k: g["attention_nodes"] for k, g in manifest["graphs"].items()},
        "max_abs_diff": parity["max_abs_diff"],
        "greedy_agreement": parity.get("greedy_agreement"),
        "seconds": manifest.get("export_seconds"),
    }


def run_export_all(args: argparse.Namespace) -> int:
    """Export a plan; exit code 1 when any model failed."""
    from export.batch import run_plan

    return run_plan(args.plan, jobs=args.jobs or None, repository=args.repository)
