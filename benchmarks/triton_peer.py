"""The Triton peer of `attnserve bench serve`: its Python environment and its server process.

``peer_python`` finds a Python that can run ``triton_peer_server.py`` (PyTriton, onnxruntime,
numpy < 2): the one given, else a virtual environment in the benchmark cache, created on first
use with ``nvidia-pytriton`` (which bundles tritonserver 2.51 and its python backend) and the
onnxruntime release the benchmark itself runs. ``TritonPeer`` runs the peer in its own process
session (tritonserver and the python backend's stub are its children), like the attnserve
server runs in ``ServeProcess``; ``vit_spec`` describes the repository's ViT entry to it with
attnserve's own batching settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.loadgen import proc_stats, session_cpu_seconds
from benchmarks.marian import default_cache
from benchmarks.triton_peer_server import READY

T = TypeVar("T")

PYTRITON = "nvidia-pytriton==0.7.0"
SERVER_SCRIPT = Path(__file__).with_name("triton_peer_server.py")
VENV_NAME = "triton-peer-venv"
PROBE = (
    "import sys, numpy, onnxruntime, pytriton.triton, importlib.metadata as m; "
    "sys.path.insert(0, sys.argv[1]); import triton_peer_server as s; s.libpython_dir(); "
    "print(m.version('nvidia-pytriton'))"
)


class PeerUnavailable(RuntimeError):
    """The Triton peer cannot run here; the message says why (recorded as the skip reason)."""


def probe(python: Path) -> str:
    """The PyTriton version ``python`` runs the peer with.

    Raises:
        PeerUnavailable: it lacks PyTriton, onnxruntime or numpy, or a shared libpython.
    """
    try:
        done = subprocess.run(
            [str(python), "-c", PROBE, str(SERVER_SCRIPT.parent)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise PeerUnavailable(f"{python} cannot run: {err}") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PeerUnavailable(f"{python} cannot run the Triton peer: {last}")
    return done.stdout.strip()


def peer_python(cache: Path, given: Path | None = None, install: bool = True) -> Path:
    """A Python that runs the peer: ``given``, else the cache's peer environment.

    Args:
        cache: the benchmark cache (its ``triton-peer-venv`` folder).
        given: an interpreter to use instead (checked, never changed).
        install: create the cache's environment when it is missing (pip, a few hundred MB).

    Raises:
        PeerUnavailable: no usable interpreter (the message says why and what to do).
    """
    if given is not None:
        probe(Path(given))
        return Path(given)
    venv = Path(cache) / VENV_NAME
    python = venv / "bin" / "python"
    if python.is_file():
        probe(python)
        return python
    if not install:
        raise PeerUnavailable(
            f"no Python with PyTriton: {venv} does not exist (a run without --tiny creates it; "
            "or pass --triton-python)"
        )
    _create_venv(venv)
    probe(python)
    return python


def _create_venv(venv: Path) -> None:
    import onnxruntime

    requirements = [PYTRITON, f"onnxruntime=={onnxruntime.__version__}"]
    steps = (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements],
    )
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as err:
            raise PeerUnavailable(f"could not create {venv}: {err}") from err
        if done.returncode != 0:
            tail = done.stderr.strip()[-400:]
            raise PeerUnavailable(f"could not create {venv} ({' '.join(step[:4])}...): {tail}")


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vit_spec(entry: Path, threads: int) -> dict[str, Any]:
    """The peer's description of a repository's ViT entry: its latest model.onnx, image
    preprocessing, labels and attnserve's dynamic batching settings; fresh loopback ports."""
    from contract.model_config import ClassifierConfig
    from contract.repository import read_model_config, version_dirs

    config = read_model_config(entry)
    if not isinstance(config, ClassifierConfig):
        raise PeerUnavailable(f"{entry} is not a classifier entry")
    version = max(version_dirs(entry))
    return {
        "name": config.name,
        "model": str((entry / str(version) / "model.onnx").resolve()),
        "size": config.image.size,
        "mean": list(config.image.mean),
        "std": list(config.image.std),
        "labels": list(config.labels),
        "max_batch_size": config.batching.max_batch_size,
        "delay_us": config.batching.max_queue_delay_us,
        "priority_levels": config.batching.priority_levels,
        "default_priority_level": config.batching.default_priority_level,
        # attnserve's batching.instances as Triton's instance count, the threads split alike
        "instances": config.batching.instances,
        "threads": max(1, threads // config.batching.instances),
        "host": "127.0.0.1",
        "grpc_port": free_port(),
        "http_port": free_port(),
        "metrics_port": free_port(),
    }


def session_processes(session: int) -> list[int]:
    """The live (not zombie) processes of a session."""
    return [pid for pid, f in proc_stats() if int(f[3]) == session and f[0] != "Z"]


class TritonPeer:
    """The peer server as a child process in its own session; ``stop`` ends it for sure."""

    def __init__(self, python: Path, spec: dict[str, Any]) -> None:
        self.command = [str(python), str(SERVER_SCRIPT), "--spec", json.dumps(spec)]
        self.spec = spec
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.spec['host']}:{self.spec['grpc_port']}"

    @property
    def http_address(self) -> str:
        """Triton's HTTP/REST endpoint (KServe v2 over HTTP)."""
        return f"{self.spec['host']}:{self.spec['http_port']}"

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the whole peer: its Python, tritonserver and the backend stub."""
        return session_cpu_seconds(self.process.pid) if self.process is not None else None

    def start(self, timeout: float = 300) -> TritonPeer:
        """Start the peer and wait for its ready line.

        Raises:
            PeerUnavailable: it exited or did not come up in time (with its last output).
        """
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # tritonserver writes to the same pipe: the line may start with its log's tail
            if any(READY in line for line in self.output):
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        tail = "".join(self.output[-15:])
        raise PeerUnavailable(f"the Triton peer did not start:\n{tail}")

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            del self.output[:-300]

    def stop(self) -> None:
        """SIGTERM (PyTriton stops tritonserver), then kill the session after 60 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while session_processes(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # the proxy's workers may still be exiting
        with contextlib.suppress(ProcessLookupError):  # anything left behind
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> TritonPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def on_vit_peer(
    entry: Path, threads: int, wanted: bool, measure: Callable[[TritonPeer], T]
) -> tuple[T | None, dict[str, Any]]:
    """``measure(peer)`` on the Triton peer serving ``entry`` (a repository's ViT), then the
    peer stopped: the result (None where not run) and the run's ``triton`` record (measured, or
    skipped with the reason: not ``wanted``, or the peer cannot run here)."""
    if not wanted:
        return None, {"status": "skipped", "reason": "--no-triton"}
    try:
        peer = TritonPeer(peer_python(default_cache()), vit_spec(entry, threads)).start()
    except PeerUnavailable as err:
        return None, {"status": "skipped", "reason": str(err)}
    try:
        return measure(peer), {"status": "measured", "reason": None}
    finally:
        peer.stop()
