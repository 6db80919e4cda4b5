"""Shared helpers of the reliability tests: repository copies with other limits, /metrics
scraping, percentiles, status checks and a subprocess server."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from serving.model_config import read_model_config, write_model_config

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


def copy_repository(source: Path, target: Path, **overrides: dict[str, dict[str, Any]]) -> Path:
    """Copy a model repository (graphs hard-linked) and override config sections per model.

    ``copy_repository(src, dst, vit={"batching": {"max_queue_size": 4}})`` rewrites
    ``dst/vit/config.yaml`` with that batching field changed. The config files are replaced, never
    written through a link, so the source repository is untouched.
    """
    shutil.copytree(source, target, copy_function=os.link)
    for name, sections in overrides.items():
        config = read_model_config(target / name)
        changes = {
            section: dataclasses.replace(getattr(config, section), **fields)
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


class ServeProcess:
    """``attnserve serve`` as a child process on a free port; ``stop`` ends it for sure."""

    def __init__(self, repository: Path, *args: str, grace: float = 10.0) -> None:
        self.command = [
            sys.executable,
            "-m",
            "attnserve_cli",
            "serve",
            "--repository",
            str(repository),
            "--port",
            "0",
            "--grace-period",
            str(grace),
            *args,
        ]
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self.output: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 120) -> ServeProcess:
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the server exited before serving:\n" + "".join(self.output))
            self.output.append(line)
            match = re.match(r"attnserve serving .*? on [^\s,]+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                metrics = re.search(r"metrics on [^\s,]+:(\d+)", line)
                self.metrics_port = int(metrics.group(1)) if metrics else None
                self._reader = threading.Thread(target=self._read, daemon=True)
                self._reader.start()
                return self
        raise RuntimeError("the server did not start in time:\n" + "".join(self.output))

    def _read(self) -> None:
        """Keep reading the output (a full pipe would block the server)."""
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def saw(self, text: str, timeout: float) -> bool:
        """Wait until the output holds ``text``."""
        return wait_until(lambda: text in "".join(self.output), timeout, interval=0.005)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> tuple[int, str]:
        """Wait for the exit; its code and all its output."""
        assert self.process is not None
        code = self.process.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return code, "".join(self.output)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
