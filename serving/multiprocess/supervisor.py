"""``attnserve serve --frontend-workers N`` (N > 1): one engine process, N frontend processes.

The supervisor (the ``attnserve serve`` process itself) chooses the port, starts the engine
process and waits until it has loaded the models, starts the frontends (gRPC servers on the same
port with SO_REUSEPORT, so the kernel spreads connections over them), serves the aggregated
/metrics (prometheus-client's multiprocess mode) and watches its children:

- SIGTERM / SIGINT: the frontends drain (health NOT_SERVING, new requests UNAVAILABLE, in-flight
  ones get the grace period), then the engine stops; exit code 0.
- A child that dies on its own: logged with its exit code; the frontends see an engine loss at
  once (health NOT_SERVING, waiting requests UNAVAILABLE); the supervisor stops the others and
  exits with code 1, for the orchestrator to restart the server (no process is restarted here).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from serving.multiprocess.titles import SUPERVISOR_TITLE, set_process_title
from serving.server_config import REGIONS_FOLDER_ENV, ServerConfig

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # loading big models can take minutes
STOP_MARGIN_S = 5.0  # beyond the grace period before a child is killed
POLL_S = 0.2


class StartError(RuntimeError):
    """A child process failed to start; the message carries its own."""


class Supervisor:
    """Starts, watches and stops the engine and frontend processes of one server."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="attnserve-"))
        self.metrics_dir = self.workdir / "metrics"
        self.metrics_dir.mkdir()
        # Set before any child imports prometheus_client: every process then writes its metric
        # values into this folder, which the supervisor's /metrics adds up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        # The frontends share one system shared memory registry (a region registered through
        # one serves requests on all): every frontend opens this folder.
        os.environ[REGIONS_FOLDER_ENV] = str(self.workdir / "regions")
        self.address = str(self.workdir / "engine.sock")
        self.context = multiprocessing.get_context("spawn")
        self.engine: BaseProcess | None = None
        self.frontends: list[BaseProcess] = []
        self.stopping = False
        self.port = 0
        self.http_port: int | None = None  # HTTP/REST (None: off)
        self.models: list[str] = []  # what the engine process loaded

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine, then the frontends; returns when all of them serve.

        Raises:
            StartError: a child reported an error or died before it was ready.
        """
        from serving.multiprocess.processes import engine_main, frontend_main

        reserved = [_reserve_port(self.config.host, self.config.port)]
        self.port = reserved[0].getsockname()[1]
        config = replace(self.config, port=self.port)
        if self.config.http_port >= 0:  # every frontend serves HTTP/REST on one port too
            try:
                reserved.append(_reserve_port(self.config.host, self.config.http_port))
            except OSError:
                reserved[0].close()
                raise
            self.http_port = reserved[1].getsockname()[1]
            config = replace(config, http_port=self.http_port)
        try:
            self.engine, self.models = self._spawn(
                "attnserve-engine", engine_main, config, self.address
            )
            for i in range(self.config.frontend_workers):
                frontend, _ = self._spawn(
                    f"attnserve-frontend-{i}", frontend_main, config, self.address, self.engine.pid
                )
                self.frontends.append(frontend)
            log.info(
                "engine process pid %s, frontend process pids %s",
                self.engine.pid,
                " ".join(str(p.pid) for p in self.frontends),
            )
        finally:
            for sock in reserved:
                sock.close()  # the frontends listen on the ports now

    def _spawn(self, name: str, target: Any, *args: Any) -> tuple[BaseProcess, Any]:
        """Start a child and wait for it to serve; returns it and what it reported."""
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=target, name=name, args=(*args, send), daemon=False)
        process.start()
        send.close()
        return process, _wait_ready(process, receive)

    # --- watch and stop -------------------------------------------------------------------------
    def children(self) -> list[BaseProcess]:
        return [p for p in (self.engine, *self.frontends) if p is not None]

    def watch(self) -> int:
        """Block until a signal asks to stop (exit code 0) or a child dies (exit code 1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        while not self.stopping:
            died = [p for p in self.children() if not p.is_alive()]
            if died:
                for process in died:
                    log.error(
                        "%s (pid %s) exited with code %s",
                        process.name,
                        process.pid,
                        process.exitcode,
                    )
                self.stop()
                return 1
            wait([p.sentinel for p in self.children()], timeout=POLL_S)
        self.stop()
        return 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def stop(self) -> None:
        """Drain the frontends, then stop the engine; kill what outlives its time."""
        grace = self.config.grace_period_s
        print(f"draining (grace period {grace:g} s)", flush=True)
        _terminate(self.frontends, grace + STOP_MARGIN_S)
        _terminate([self.engine] if self.engine is not None else [], grace + STOP_MARGIN_S)
        from prometheus_client import multiprocess

        for process in self.children():
            if process.pid is not None:
                multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def _wait_ready(process: BaseProcess, pipe: Connection) -> Any:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if pipe.poll(POLL_S):
            status, info = pipe.recv()
            if status == "ready":
                return info
            raise StartError(f"{process.name}: {info}")
        if not process.is_alive():
            raise StartError(f"{process.name} exited with code {process.exitcode} while starting")
    raise StartError(f"{process.name} was not ready after {READY_TIMEOUT_S:g} s")


def _terminate(processes: list[BaseProcess], timeout: float) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: drain
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.error("%s (pid %s) did not stop in time; killing it", process.name, process.pid)
            process.kill()
            process.join(5)


def _reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding ``port`` (0: a free one) until the
    frontends listen on it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}; is the port in use?") from err
    return sock


def serve_multiprocess(config: ServerConfig) -> int:
    """Run the server until SIGTERM / SIGINT; the process exit code."""
    from serving.metrics import multiprocess_registry, start_metrics_http_server

    set_process_title(SUPERVISOR_TITLE)
    supervisor = Supervisor(config)
    try:
        supervisor.start()
        metrics = ""
        if config.metrics_port >= 0:
            registry = multiprocess_registry(str(supervisor.metrics_dir))
            _, port = start_metrics_http_server(registry, config.metrics_port, config.metrics_host)
            metrics = f", metrics on {config.metrics_host}:{port}"
        names = ", ".join(supervisor.models)
        http = "" if supervisor.http_port is None else f", HTTP/REST on port {supervisor.http_port}"
        print(
            f"attnserve serving {names} on {config.host}:{supervisor.port} "
            f"({config.frontend_workers} frontend processes, 1 engine process){http}{metrics}",
            flush=True,
        )
        return supervisor.watch()
    except StartError as err:
        log.error("%s", err)
        supervisor.stop()
        return 1
    finally:
        supervisor.cleanup()
