"""`attnserve trace-summary`: where traced requests spent their time, per model, from trace files
in Triton's format (``serving.tracing`` writes them; so does Triton).

Per model, over its complete traces (all five timestamps): the request (``REQUEST_START`` to
``REQUEST_END``: mean, p50, p99), its queue (``QUEUE_START`` to ``COMPUTE_START``), its compute
(``COMPUTE_START`` to ``COMPUTE_END``) and the rest, the overhead (checks, tokenising, image
decoding, the answer), all in milliseconds. Traces without all five (a request that failed before
its model's queue) are counted as ``partial``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

STAMPS = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END")
COLUMNS = (
    "model",
    "version",
    "traces",
    "partial",
    "request_ms",
    "request_p50_ms",
    "request_p99_ms",
    "queue_ms",
    "compute_ms",
    "overhead_ms",
)


class TraceFileError(ValueError):
    """A file that is not a trace file (not a JSON array of trace records)."""


def read_traces(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The traces of the files: each header's fields and ``stamps`` (name -> ns), in file order.

    Raises:
        TraceFileError: a file that cannot be read as trace records (named).
        OSError: a file that cannot be read.
    """
    traces: dict[tuple[int, Any], dict[str, Any]] = {}
    for number, path in enumerate(paths):
        try:
            records = json.loads(Path(path).read_text())
            if not isinstance(records, list):
                raise TypeError("not a JSON array")
            for record in records:
                trace = traces.setdefault((number, record["id"]), {"stamps": {}})
                for stamp in record.get("timestamps", []):
                    trace["stamps"][str(stamp["name"])] = int(stamp["ns"])
                trace.update({k: v for k, v in record.items() if k not in ("id", "timestamps")})
        except (ValueError, TypeError, KeyError) as err:
            raise TraceFileError(f"{path}: not a trace file ({type(err).__name__}: {err})") from err
    return list(traces.values())


def summary_rows(traces: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a model (and version), in the order the models first appear."""
    spans: dict[tuple[str, Any], list[list[float]]] = defaultdict(list)
    partial: dict[tuple[str, Any], int] = defaultdict(int)
    for trace in traces:
        key = (str(trace.get("model_name", "")), trace.get("model_version", ""))
        stamps = trace["stamps"]
        if not all(name in stamps for name in STAMPS):
            partial[key] += 1
            continue
        start, queued, computing, computed, end = (stamps[name] / 1e6 for name in STAMPS)
        spans[key].append([end - start, computing - queued, computed - computing])
    rows = []
    for key in dict.fromkeys([*spans, *partial]):
        times = np.array(spans.get(key, []), dtype=np.float64).reshape(-1, 3)
        request, queue, compute = times.T
        row: dict[str, Any] = {
            "model": key[0],
            "version": key[1],
            "traces": len(times),
            "partial": partial.get(key, 0),
        }
        if len(times):
            row |= {
                "request_ms": _ms(request.mean()),
                "request_p50_ms": _ms(np.percentile(request, 50)),
                "request_p99_ms": _ms(np.percentile(request, 99)),
                "queue_ms": _ms(queue.mean()),
                "compute_ms": _ms(compute.mean()),
                "overhead_ms": _ms((request - queue - compute).mean()),
            }
        rows.append({column: row.get(column) for column in COLUMNS})
    return rows


def _ms(value: float) -> float:
    return round(float(value), 3)
