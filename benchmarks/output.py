"""What a benchmark run emits: progress lines on stderr, its run id, its validated JSON file."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.schema import validate

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    """One progress line on stderr, with the time of day."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timestamp() -> str:
    """A run id: the UTC time, e.g. 20261121T222211Z."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_result(result: dict[str, Any], out_dir: Path, kind: str) -> Path:
    """Validate ``result`` against its schema and write OUT/KIND-<timestamp>.json."""
    validate(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-tiny" if result["settings"].get("tiny") else ""
    path = out_dir / f"{kind}-{result['run_id']}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def write_probe(result: dict[str, Any], out_dir: Path) -> Path:
    """Write a probe's result (``transport_floor``, ``engine_loop``: no schema, ``kind``,
    ``tiny`` and ``points`` fields) as OUT/KIND-<timestamp>[-tiny].json; print each point and
    the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-tiny" if result["tiny"] else ""
    path = out_dir / f"{result['kind']}-{timestamp()}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for point in result["points"]:
        print(json.dumps(point))
    print(path)
    return path
