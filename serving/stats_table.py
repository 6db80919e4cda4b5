"""`attnserve stats`: a server's KServe ModelStatistics as a table, or one JSON line a model
(``render`` also draws `attnserve models`' repository index).

Means per request between the server's start and now: the latency of its successes, the queue
wait, the compute time (each over its own count), inferences per model execution; and the
requests answered from the response cache.
"""

from __future__ import annotations

import json
from typing import Any

COLUMNS = (
    "model",
    "version",
    "ok",
    "failed",
    "latency_ms",
    "queue_ms",
    "compute_ms",
    "per_execution",
    "cache_hits",
    "last_s_ago",
)


def _mean_ms(duration: Any) -> float | None:
    return round(duration.ns / duration.count / 1e6, 3) if duration.count else None


def statistics_row(stats: Any, now_s: float) -> dict[str, Any]:
    """One model's ModelStatistics as the table's columns (None: nothing counted yet)."""
    s = stats.inference_stats
    executions = stats.execution_count
    return {
        "model": stats.name,
        "version": stats.version,
        "ok": s.success.count,
        "failed": s.fail.count,
        "latency_ms": _mean_ms(s.success),
        "queue_ms": _mean_ms(s.queue),
        "compute_ms": _mean_ms(s.compute_infer),
        "per_execution": round(stats.inference_count / executions, 2) if executions else None,
        "cache_hits": s.cache_hit.count,
        "last_s_ago": round(now_s - stats.last_inference / 1000, 1)
        if stats.last_inference
        else None,
    }


def render(
    rows: list[dict[str, Any]], as_json: bool, columns: tuple[str, ...] = COLUMNS
) -> list[str]:
    """The lines to print: an aligned table with a header, or one JSON object per model."""
    if as_json:
        return [json.dumps(row) for row in rows]
    cells = [list(columns)] + [
        ["-" if row[c] in (None, "") else str(row[c]) for c in columns] for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]
