"""Triton's perf_analyzer: where it is installed, how it runs, what it measured.

perf_analyzer ships as a binary in the ``tritonclient`` 2.40.0 wheel (later wheels leave it
out). That release cannot share a virtual environment with the project's newer tritonclient, so
it is installed into a folder of its own (``pip install --target``; `make test` does it, see the
Makefile's ``perf-analyzer`` target) with the CUDA runtime library it links (a pip package; no
GPU is needed) and Debian's ``libb64-0d``. ``find_perf_analyzer`` returns the tool or says why it
cannot run; ``PerfAnalyzer.run`` measures one model at one concurrency and returns a figure
record (throughput, latency percentiles, errors: perf_analyzer stops at the first failed request,
so a run either has 0 errors or fails with the server's message).
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "2.40.0"
REQUIREMENTS = (f"tritonclient=={VERSION}", "nvidia-cuda-runtime-cu12==12.9.79")
ENV_VAR = "ATTNSERVE_PERF_ANALYZER"  # a perf_analyzer install folder (holding bin/perf_analyzer)
INSTALL_HINT = (
    "make perf-analyzer installs it (pip install --target .venv/perf_analyzer --no-deps "
    f"{' '.join(REQUIREMENTS)}; apt-get install libb64-0d)"
)


def default_folder() -> Path:
    """$ATTNSERVE_PERF_ANALYZER, else ``perf_analyzer`` inside the running virtual environment."""
    return Path(os.environ.get(ENV_VAR) or Path(sys.prefix) / "perf_analyzer")


@dataclass(frozen=True)
class PerfAnalyzer:
    """An installed perf_analyzer: its binary and the library path it needs."""

    binary: Path
    library_path: str

    @property
    def env(self) -> dict[str, str]:
        """The environment perf_analyzer runs in (the CUDA runtime's folder on the library path)."""
        paths = [self.library_path, os.environ.get("LD_LIBRARY_PATH", "")]
        return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in paths if p)}

    def run(self, address: str, model: str, concurrency: int, **options: Any) -> dict[str, Any]:
        """Measure ``model`` at ``concurrency`` (see ``PerfRun``); the run's record."""
        return PerfRun(self, address, model, concurrency, **options).execute()


def find_perf_analyzer(folder: Path | None = None) -> PerfAnalyzer | str:
    """The perf_analyzer installed in ``folder`` (default ``default_folder()``), or why not."""
    folder = Path(folder) if folder is not None else default_folder()
    binary = folder / "bin" / "perf_analyzer"
    if not binary.is_file():
        return f"perf_analyzer {VERSION} is not installed in {folder}: {INSTALL_HINT}"
    library = folder / "nvidia" / "cuda_runtime" / "lib"
    tool = PerfAnalyzer(binary, str(library))
    missing = _missing_libraries(tool)
    if missing:
        return f"perf_analyzer cannot load {', '.join(missing)}: {INSTALL_HINT}"
    return tool


def _missing_libraries(tool: PerfAnalyzer) -> list[str]:
    """Shared libraries the binary links that the loader cannot find (``ldd``)."""
    if shutil.which("ldd") is None:
        return []
    try:
        out = subprocess.run(
            ["ldd", str(tool.binary)], env=tool.env, capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def install_perf_analyzer(folder: Path | None = None) -> PerfAnalyzer | str:
    """Install perf_analyzer into ``folder`` with pip (not the system library); the tool or why
    not."""
    folder = Path(folder) if folder is not None else default_folder()
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
    try:
        done = subprocess.run(
            [*command, str(folder), *REQUIREMENTS], capture_output=True, text=True, timeout=900
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"pip could not install perf_analyzer: {err}"
    if done.returncode != 0:
        return f"pip could not install perf_analyzer: {done.stderr.strip()[-500:]}"
    return find_perf_analyzer(folder)


@dataclass
class PerfRun:
    """One perf_analyzer measurement of a model at one concurrency over gRPC or HTTP/REST.

    Attributes:
        tool: the perf_analyzer to run.
        address: the server's HOST:PORT (the HTTP/REST port's for ``protocol="http"``).
        model: the model's name.
        concurrency: concurrent requests.
        window_ms: one measurement window (perf_analyzer reports the mean of its last 3 stable
            windows; stability is not required, so a run takes about 3 windows).
        streaming: stream requests (``--streaming``, for decoupled models).
        input_data: a JSON input-data file (``--input-data``), else generated data.
        parameters: request parameters (``--request-parameter NAME:VALUE:TYPE``).
        shared_memory: "system": inputs and outputs through POSIX shared memory regions
            (``--shared-memory system``; the server needs ``--system-shared-memory``).
        timeout_s: the run's wall-clock limit.
        protocol: "grpc" or "http" (KServe v2 over HTTP/REST, binary tensor data; no streaming).
    """

    tool: PerfAnalyzer
    address: str
    model: str
    concurrency: int
    window_ms: int = 2000
    streaming: bool = False
    input_data: Path | None = None
    parameters: dict[str, tuple[str, str]] = field(default_factory=dict)
    shared_memory: str = "none"
    timeout_s: float = 300.0
    protocol: str = "grpc"

    def flags(self, full_paths: bool = True) -> list[str]:
        """The model-specific flags (the record shows them with file names only)."""
        flags = ["--streaming"] if self.streaming else []
        if self.input_data is not None:
            data = self.input_data
            flags += ["--input-data", str(data) if full_paths else data.name]
        for name, (value, kind) in self.parameters.items():
            flags += ["--request-parameter", f"{name}:{value}:{kind}"]
        if self.shared_memory != "none":
            flags += ["--shared-memory", self.shared_memory]
        return flags

    def command(self, csv_path: Path) -> list[str]:
        """The full perf_analyzer command line."""
        return [
            str(self.tool.binary),
            *("-i", self.protocol, "-u", self.address, "-m", self.model),
            "--concurrency-range",
            f"{self.concurrency}:{self.concurrency}",
            *("--measurement-interval", str(self.window_ms)),
            *("--stability-percentage", "999", "--max-trials", "3"),
            *("-f", str(csv_path), "--verbose-csv"),
            *self.flags(),
        ]

    def execute(self) -> dict[str, Any]:
        """Run perf_analyzer; its figures, or an error record with its last output lines."""
        record: dict[str, Any] = {
            "model": self.model,
            "concurrency": self.concurrency,
            "protocol": self.protocol,
            "flags": self.flags(full_paths=False),
        }
        with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as scratch:
            csv_path = Path(scratch) / "result.csv"
            try:
                done = subprocess.run(
                    self.command(csv_path),
                    env=self.tool.env,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                )
            except subprocess.TimeoutExpired:
                return {**record, "errors": 1, "error": f"timed out after {self.timeout_s:g} s"}
            if done.returncode != 0 or not csv_path.is_file():
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-4:])
                return {**record, "errors": 1, "error": f"exit {done.returncode}: {tail}"}
            return {**record, **parse_csv(csv_path.read_text()), "errors": 0, "error": None}


# perf_analyzer's columns of the server's own figures (from the KServe ModelStatistics RPC), µs
SERVER_COLUMNS = {
    "queue": "Server Queue",
    "compute_input": "Server Compute Input",
    "compute_infer": "Server Compute Infer",
    "compute_output": "Server Compute Output",
}


def parse_csv(text: str) -> dict[str, Any]:
    """Throughput (requests/s) and latency (ms) of the first row of perf_analyzer's ``-f`` CSV,
    and the server's own times per request (ms, ``server_ms``) where it wrote them.

    Raises:
        ValueError: the CSV has no data row or lacks the throughput column.
    """
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or "Inferences/Second" not in rows[0]:
        raise ValueError(f"perf_analyzer wrote no figures: {text[:200]!r}")
    row = rows[0]

    def ms(column: str) -> float | None:
        value = row.get(column)
        return round(float(value) / 1000.0, 3) if value not in (None, "") else None

    figures: dict[str, Any] = {
        "throughput_rps": round(float(row["Inferences/Second"]), 3),
        "latency_ms": {
            "p50": ms("p50 latency"),
            "p90": ms("p90 latency"),
            "p99": ms("p99 latency"),
            "mean": ms("Avg latency"),
        },
    }
    if all(column in row for column in SERVER_COLUMNS.values()):
        figures["server_ms"] = {key: ms(column) for key, column in SERVER_COLUMNS.items()}
    return figures
