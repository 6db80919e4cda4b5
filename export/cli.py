"""`attnserve export`, `export-all` and `eval`. torch is imported only when a command runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from contract.graphs import (
    DECODE_ATTENTIONS,
    DEFAULT_BLOCK_STEPS,
    DEFAULT_OPSET,
    FUSED_ATTENTION_OPSET,
    KV_CACHE_DTYPES,
)
from contract.tensorrt import FLAVOUR_CHOICES
from models.config import MODEL_KINDS

PRECISIONS = ("fp32", "fp16", "int8")


def add_parsers(subparsers: Any) -> None:
    """Register the export, export-all and eval subcommands."""
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
        help=f"ONNX opset; >= {FUSED_ATTENTION_OPSET} gives the fused Attention op "
        f"(default {DEFAULT_OPSET})",
    )
    export.add_argument("--precision", choices=PRECISIONS, default="fp32")
    export.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="float",
        help="the in-place decoder's KV cache: float (the graphs' float type) or int8 (a scale "
        "per cached vector; with --precision int8: a quarter of the cache bytes, faster at large "
        "batches on the CPU)",
    )
    export.add_argument(
        "--decode-attention",
        choices=DECODE_ATTENTIONS,
        help="the in-place decoder's attention over a float KV cache: fused (ONNX's Attention "
        "op; a GPU's fused kernels) or matmul (keys x query, a masked Softmax, x values: faster "
        "on the CPU from batch 16 on, even below). Default: matmul with --precision int8, "
        "else fused",
    )
    export.add_argument(
        "--decode-block",
        type=int,
        default=DEFAULT_BLOCK_STEPS,
        metavar="K",
        help="seq2seq models: also write decoder_block.onnx, K greedy decoder steps in one run "
        f"(2-16; 0: not written; default {DEFAULT_BLOCK_STEPS}), which batching.decode_block "
        "runs (the host's work per token divided by K)",
    )
    export.add_argument(
        "--tensorrt",
        action="store_true",
        help="also build TensorRT engines (needs TensorRT and an NVIDIA GPU)",
    )
    export.add_argument(
        "--tensorrt-flavour",
        choices=FLAVOUR_CHOICES,
        help="TensorRT or TensorRT-RTX for --tensorrt (default: ATTNSERVE_TENSORRT_FLAVOUR, else "
        "auto: TensorRT if it imports, then TensorRT-RTX)",
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

    evaluate = subparsers.add_parser(
        "eval", help="print held-out metrics of a checkpoint as JSON (last line of stdout)"
    )
    evaluate.add_argument("kind", choices=MODEL_KINDS)
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
        kv_cache_dtype=args.kv_cache_dtype,
        decode_attention=args.decode_attention,
        decode_block=args.decode_block,
        tensorrt=args.tensorrt,
        tensorrt_flavour=args.tensorrt_flavour,
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
        # the in-place decoder's attention (fused | matmul | int8); None: no in-place decoder
        "decode_attention": manifest.get("decoders", {}).get("inplace", {}).get("decode_attention"),
        "max_abs_diff": parity["max_abs_diff"],
        "greedy_agreement": parity.get("greedy_agreement"),
        "seconds": manifest.get("export_seconds"),
    }


def run_export_all(args: argparse.Namespace) -> int:
    """Export a plan; exit code 1 when any model failed."""
    from export.batch import run_plan

    return run_plan(args.plan, jobs=args.jobs or None, repository=args.repository)


def run_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint (or an exported repository entry) and print one JSON line."""
    if args.repository is not None:
        from export.evaluate import evaluate_repository  # ONNX Runtime path (export issue)

        result = evaluate_repository(args.kind, args.repository, examples=args.examples)
        print(json.dumps({"kind": args.kind, "repository": str(args.repository), **result}))
        return 0
    from models import evaluate
    from models.captioner import Captioner
    from models.checkpoint import load_checkpoint, shipped_checkpoint
    from models.translator import Translator
    from models.vit import ViT

    directory = args.checkpoint or shipped_checkpoint(args.kind)
    checkpoint = load_checkpoint(directory, expected_kind=args.kind)
    # load_checkpoint checked the kind, and loads a tokenizer for every kind but vit
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    if args.kind == "translator":
        assert isinstance(model, Translator) and tokenizer is not None
        result = evaluate.evaluate_translator(model, tokenizer, **_examples(args))
    elif args.kind == "captioner":
        assert isinstance(model, Captioner) and tokenizer is not None
        result = evaluate.evaluate_captioner(model, tokenizer, **_examples(args))
    else:
        assert isinstance(model, ViT)
        result = evaluate.evaluate_vit(model)
    print(json.dumps({"kind": args.kind, "checkpoint": str(directory), **result}))
    return 0


def _examples(args: argparse.Namespace) -> dict[str, int]:
    return {} if args.examples is None else {"examples": args.examples}
