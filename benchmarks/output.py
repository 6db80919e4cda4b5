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


def write_probe(
    kind: str,
    points: list[dict[str, Any]],
    out_dir: Path,
    tiny: bool,
    duration_s: float,
    device: str = "cpu",
    **facts: Any,
) -> Path:
    """Write a probe's result (``transport_floor``, ``engine_loop``: points measured on this
    machine's CPU, or on ``device``; no schema) as OUT/KIND-<timestamp>[-tiny].json with
    ``facts`` and the machine; print each point and the path."""
    from benchmarks.machine import machine_metadata

    result = {
        "schema": f"attnserve-{kind}/1",
        "kind": kind,
        "tiny": tiny,
        "duration_s": duration_s,
        **facts,
        "points": points,
        "machine": machine_metadata(device),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{timestamp()}{'-tiny' if tiny else ''}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for point in points:
        print(json.dumps(point))
    print(path)
    return path
