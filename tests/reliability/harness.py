"""Shared helpers of the reliability tests: repository copies with other limits, /metrics
scraping, percentiles, status checks and a subprocess server."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.server_process import ServeProcess  # noqa: F401  (re-exported for the tests)
from contract.repository import read_model_config, write_model_config

# Status codes a malformed request may get; never UNKNOWN or INTERNAL (those are server bugs).
CLIENT_ERRORS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
# Words of a message that tells the client what to do about it.
FIX_HINTS = (
    "send",
    "use ",
    "must",
    "choose",
    "retry",
    "split",
    "leave",
    "allow",
    "at most",
    "limit",
    "one of",
    "ask",
    "raise",
    "this server has",
    "fix",
    "set ",
    "pick",
    "only",
    "instead",
    "needs",
    "name the",
    "supported",
    "accepts",
    "is empty",
    "lists",
    "valid",
    "expected",
    "range",
    "between",
    "takes",
    "must be",
    "its inputs are",
    "its outputs are",
)
BIG_MESSAGES = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def copy_repository(source: Path, target: Path, **overrides: dict[str, Any]) -> Path:
    """Copy a model repository (graphs hard-linked) and override config sections per model.

    ``copy_repository(src, dst, vit={"batching": {"max_queue_size": 4}})`` rewrites
    ``dst/vit/config.yaml`` with that batching field changed; a value that is no dict replaces a
    top-level field (``vit={"response_cache": True}``). The config files are replaced, never
    written through a link, so the source repository is untouched.
    """
    shutil.copytree(source, target, copy_function=os.link)
    for name, sections in overrides.items():
        config = read_model_config(target / name)
        changes = {
            section: dataclasses.replace(getattr(config, section), **fields)
            if isinstance(fields, dict)
            else fields
            for section, fields in sections.items()
        }
        (target / name / "config.yaml").unlink()
        write_model_config(dataclasses.replace(config, **changes), target / name)
    return target


def scrape(url: str) -> dict[str, list[Any]]:
    """GET /metrics and parse it: family name -> samples."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample(families: dict[str, list[Any]], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for samples in families.values()
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def says_what_to_fix(details: str) -> bool:
    """A non-empty, human message with a hint of what to change (not a stack trace)."""
    text = (details or "").strip()
    if len(text) < 12 or text.startswith(("Unexpected", "Traceback", "Exception")):
        return False
    lower = text.lower()
    return any(hint in lower for hint in FIX_HINTS)


def wait_until(predicate: Any, timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
