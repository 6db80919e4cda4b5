"""Build reports of the shipped models, fp32 and fp16, gathered into one JSON.

A machine with TensorRT (or TensorRT-RTX) runs::

    python -m export.tensorrt.collect --out benchmarks/results/gpu/tensorrt_builds.json

which exports translator, vit and captioner at fp32 and fp16 with ``--tensorrt`` into a scratch
repository (``attnserve export KIND --out REPO --name KIND-PRECISION --precision P --tensorrt``)
and writes every manifest's build report (``manifest.json["tensorrt"]``) plus one summary row per
engine. ``--flavour`` picks the TensorRT flavour (it sets ATTNSERVE_TENSORRT_FLAVOUR). A model
that fails is recorded with its error and the command exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from export.tensorrt.library import FLAVOUR_CHOICES, FLAVOUR_ENV

MODELS = ("translator", "vit", "captioner")
PRECISIONS = ("fp32", "fp16")
ROW_FIELDS = (
    "graph",
    "bytes",
    "build_seconds",
    "total_build_seconds",
    "layers",
    "attention_layers",
    "fused_attention_layers",
)


def summary_rows(entry: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per engine (and per skipped graph) of a build report.

    Args:
        entry: the repository entry, e.g. "vit-fp16".
        report: ``manifest.json["tensorrt"]`` (what ``build_engines`` returns).

    Returns:
        rows with the entry, flavour, version and precision, then ROW_FIELDS for engines or
        "skipped" with the reason for graphs that were not built.
    """
    common = {
        "entry": entry,
        "flavour": report.get("flavour", "tensorrt"),
        "version": report.get("tensorrt_version"),
        "precision": report.get("precision"),
    }
    rows = [{**common, **{k: engine.get(k) for k in ROW_FIELDS}} for engine in report["engines"]]
    rows += [
        {**common, "graph": skip["graph"], "skipped": skip["reason"]}
        for skip in report.get("skipped", [])
    ]
    return rows


def collect(repository: Path) -> dict[str, Any]:
    """The build reports of every entry of a repository that has one.

    Args:
        repository: the model repository (REPOSITORY/NAME/VERSION/manifest.json).

    Returns:
        {"reports": {"NAME/VERSION": report}, "rows": summary rows of them all}.
    """
    reports: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for manifest in sorted(Path(repository).glob("*/*/manifest.json")):
        report = json.loads(manifest.read_text()).get("tensorrt")
        if not isinstance(report, dict):
            continue
        entry = f"{manifest.parent.parent.name}/{manifest.parent.name}"
        reports[entry] = report
        rows += summary_rows(manifest.parent.parent.name, report)
    return {"reports": reports, "rows": rows}


def export_all(
    repository: Path, models: Sequence[str], precisions: Sequence[str]
) -> dict[str, str]:
    """Export every model at every precision with TensorRT engines into ``repository``.

    Args:
        repository: where the entries go (KIND-PRECISION/1).
        models: shipped model kinds.
        precisions: "fp32" / "fp16".

    Returns:
        entry name -> error message, for the exports that failed.
    """
    from export.errors import ExportError
    from export.exporter import ExportOptions, export

    failures: dict[str, str] = {}
    for kind in models:
        for precision in precisions:
            name = f"{kind}-{precision}"
            options = ExportOptions(name=name, precision=precision, tensorrt=True, force=True)
            try:
                export(kind, repository, options)
            except ExportError as err:
                failures[name] = str(err)
    return failures


def gpus() -> list[str]:
    """The GPUs ``nvidia-smi`` lists ("name, compute capability"); [] without one.

    Returns:
        one line per GPU.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Export, build and collect; writes --out. Returns 0, or 1 when an export failed."""
    parser = argparse.ArgumentParser(prog="python -m export.tensorrt.collect", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--flavour", choices=FLAVOUR_CHOICES, default="auto")
    parser.add_argument("--repository", type=Path, help="keep the exports here (default: temp)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    args = parser.parse_args(argv)
    os.environ[FLAVOUR_ENV] = args.flavour
    with tempfile.TemporaryDirectory() as scratch:
        repository = args.repository or Path(scratch)
        started = time.perf_counter()
        failures = export_all(repository, args.models, args.precisions)
        result = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {
                "machine": platform.machine(),
                "python": platform.python_version(),
                "gpus": gpus(),
            },
            "flavour_requested": args.flavour,
            "seconds": round(time.perf_counter() - started, 1),
            "failures": failures,
            **collect(repository),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["rows"], indent=1))
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover - command line
    sys.exit(main())
