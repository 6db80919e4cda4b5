"""One real server for all KServe v2 / Triton protocol tests of this package (a package-scoped
fixture: started before the package's first test, stopped after its last; system shared memory
on), with a stub of our generated code and an unmodified tritonclient on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.server_thread import ServerThread

TRITON = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"


@pytest.fixture(scope="package")
def server(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, metrics_port=-1, system_shared_memory=True) as running:
        yield running


@pytest.fixture(scope="package")
def stub(server: ServerThread) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="package")
def triton(server: ServerThread) -> Iterator[tuple[ModuleType, Any]]:
    """(tritonclient.grpc, an InferenceServerClient of the server); skips without tritonclient."""
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON)
    client = grpcclient.InferenceServerClient(url=server.address)
    yield grpcclient, client
    client.close()
