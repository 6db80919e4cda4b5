"""``deploy/healthcheck.py`` against a real grpc.health.v1 server: SERVING, NOT_SERVING, no
server, and a real attnserve server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.deploy_files import DEFAULTS, HEALTHCHECK, ROOT, free_port, run


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(HEALTHCHECK), *args], cwd=ROOT)


def test_healthcheck_exits_0_when_serving_and_1_when_not(
    health_server: tuple[str, health.HealthServicer],
) -> None:
    address, servicer = health_server
    status = health_pb2.HealthCheckResponse
    servicer.set("", status.SERVING)
    servicer.set("attnserve.v1.AttnServe", status.SERVING)
    result = healthcheck("--address", address)
    assert result.returncode == 0 and "SERVING" in result.stdout, result.stdout + result.stderr
    assert healthcheck("--address", address, "--service", "attnserve.v1.AttnServe").returncode == 0

    servicer.set("", status.NOT_SERVING)  # what the server sets when it starts draining
    result = healthcheck("--address", address)
    assert result.returncode == 1 and "NOT_SERVING" in result.stdout, result.stdout

    result = healthcheck("--address", address, "--service", "no.such.Service")
    assert result.returncode == 1 and "NOT_FOUND" in result.stdout, result.stdout


def test_healthcheck_exits_1_within_its_timeout_without_a_server() -> None:
    start = time.monotonic()
    result = healthcheck("--address", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNAVAILABLE" in result.stdout or "DEADLINE_EXCEEDED" in result.stdout, result.stdout
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_healthcheck_against_a_real_attnserve_server(tmp_path: Path) -> None:
    """The probe the image runs, against `create_server` on a tiny exported ViT (~10 s)."""
    from export.exporter import export
    from tests.repositories import FAST, tiny_sources
    from tests.serving.server_thread import ServerThread

    (vit,) = [source for source in tiny_sources() if source.kind == "vit"]
    export(vit, tmp_path, FAST)
    with ServerThread(tmp_path) as server:
        for service in ("", "attnserve.v1.AttnServe", "inference.GRPCInferenceService"):
            result = healthcheck("--address", server.address, "--service", service)
            assert result.returncode == 0, f"{service!r}: {result.stdout}{result.stderr}"
        assert server.running is not None
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        server.call(server.running.health.set("", not_serving))  # as a drain does
        result = healthcheck("--address", server.address)
        assert result.returncode == 1 and "NOT_SERVING" in result.stdout, result.stdout


def test_healthcheck_defaults_match_the_server() -> None:
    source = HEALTHCHECK.read_text()
    assert f'"127.0.0.1:{DEFAULTS.port}"' in source
