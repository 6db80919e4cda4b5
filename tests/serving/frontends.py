"""A server of two frontend processes and KServe stubs on connections of their own (the port's
SO_REUSEPORT spreads them over the frontends), for the tests that a change made through one
connection holds on all of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc

from benchmarks.server_process import ServeProcess
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a connection (frontend) of its own


@contextlib.contextmanager
def two_frontends(
    repository: Path, *flags: str, connections: int = 6, models: tuple[str, ...] = ("vit",)
) -> Iterator[tuple[ServeProcess, list[pb_grpc.GRPCInferenceServiceStub]]]:
    """``attnserve serve --frontend-workers 2 --models vit`` (``models``; none: every entry, and
    ``flags``) with ``connections`` stubs; the server must exit 0 on SIGTERM."""
    server = ServeProcess(
        repository,
        *("--metrics-port", "-1", "--frontend-workers", "2"),
        *(("--models", *models) if models else ()),
        *flags,
    ).start()
    try:
        channels = [
            grpc.insecure_channel(server.address, options=OWN_CONNECTION)
            for _ in range(connections)
        ]
        try:
            yield server, [pb_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
        finally:
            for channel in channels:
                channel.close()
    finally:
        assert server.stop() == 0
