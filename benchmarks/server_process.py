"""`attnserve serve` as a child process on a free port (soak runs and reliability tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.machine import process_cpu_seconds, process_tree


class ServeProcess:
    """``attnserve serve`` as a child process on a free port; ``stop`` ends it for sure."""

    def __init__(
        self, repository: Path, *args: str, grace: float = 10.0, keep_lines: int | None = None
    ) -> None:
        """``args`` are extra ``serve`` flags; ``keep_lines`` bounds the kept output (long runs)."""
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
        self.http_port: int | None = None  # HTTP/REST (started with --http-port)
        self.output: list[str] = []
        self._reader: threading.Thread | None = None
        self._keep_lines = keep_lines

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
                http = re.search(r"HTTP/REST on port (\d+)", line)
                self.http_port = int(http.group(1)) if http else None
                self._reader = threading.Thread(target=self._read, daemon=True)
                self._reader.start()
                return self
        raise RuntimeError("the server did not start in time:\n" + "".join(self.output))

    def _read(self) -> None:
        """Keep reading the output (a full pipe would block the server)."""
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if self._keep_lines is not None:
                del self.output[: -self._keep_lines]

    def saw(self, text: str, timeout: float) -> bool:
        """Wait until the output holds ``text``."""
        deadline = time.monotonic() + timeout
        while text not in "".join(self.output):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The /metrics URL (the server was started with a metrics port)."""
        if self.metrics_port is None:
            raise RuntimeError("this server serves no /metrics (started with --metrics-port -1)")
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def processes(self) -> list[int]:
        """The server's live processes: ``attnserve serve`` and, with ``--frontend-workers N``,
        its engine and frontend processes."""
        return process_tree(self.pid) if self.process is not None else []

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the server's live processes (None once it has exited)."""
        seconds = [process_cpu_seconds(pid) for pid in self.processes()]
        known = [s for s in seconds if s is not None]
        return sum(known) if known else None

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

    def stop(self) -> int | None:
        """SIGTERM, wait (kill after 30 s); the exit code (None when it never started). The
        output is read to its end then."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return self.process.returncode

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
