"""The grpc.aio server: attnserve API, KServe v2, health, reflection, metrics, graceful drain."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from serving.kserve.shared_memory import SharedMemoryRegions
from serving.log_settings import LogChanges, LogControl, LogSettings
from serving.metrics import MetricsServer, ServingMetrics
from serving.model_control import LocalModelControl, ModelControl
from serving.model_poll import PolledModelControl, RepositoryPoller
from serving.proto_gen.attnserve.v1 import attnserve_pb2, attnserve_pb2_grpc
from serving.proto_gen.inference import grpc_service_pb2, grpc_service_pb2_grpc
from serving.repository import ModelRepository
from serving.response_cache import ResponseCache
from serving.security import (
    BearerTokenInterceptor,
    accepted_tokens,
    server_credentials,
    server_ssl_context,
)
from serving.server_config import REGIONS_FOLDER_ENV, ServerConfig
from serving.services.attnserve import AttnServeServicer
from serving.services.common import ServerState
from serving.services.health import HealthServicer
from serving.services.kserve import KServeServicer
from serving.services.parsing import StrictParsing
from serving.trace_control import TraceChanges
from serving.tracing import Tracer

if TYPE_CHECKING:  # imported where the port is on (aiohttp)
    from serving.rest.server import RestServer

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.01  # how often a drain checks for calls still in flight

SERVICE_NAMES = (
    attnserve_pb2.DESCRIPTOR.services_by_name["AttnServe"].full_name,
    grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
)


@dataclass
class RunningServer:
    """A started server; ``stop`` drains it."""

    server: grpc.aio.Server
    port: int
    metrics_port: int | None
    repository: ModelRepository
    metrics: ServingMetrics
    state: ServerState
    health: Any
    metrics_server: MetricsServer | None
    tls: bool = False  # the gRPC port (and the HTTP one) speaks TLS
    authenticated: bool = False  # calls need a bearer token (health and reflection excepted)
    own_folder: Path | None = None  # removed on stop (this server's shared memory registry)
    poller: RepositoryPoller | None = None  # follows the repository folder (model control poll)
    rest: RestServer | None = None  # the HTTP/REST server, None when off

    @property
    def http_port(self) -> int | None:
        """The HTTP/REST port (None: off)."""
        return None if self.rest is None else self.rest.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING / NOT_SERVING on grpc.health.v1 (``stop`` does it too)."""
        status = health_pb2.HealthCheckResponse
        await _set_health(self.health, status.SERVING if serving else status.NOT_SERVING)

    async def stop(self, grace: float) -> None:
        """Drain: health NOT_SERVING, new requests UNAVAILABLE, in-flight ones get ``grace`` s.

        The port stays open while calls are in flight, so that a new call is answered
        UNAVAILABLE with a message (the servicers' drain check) rather than cut off by the
        transport; it closes when the last call ends or the grace period is over.
        """
        self.state.draining = True
        await _set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.poller is not None:
            await self.poller.stop()
        deadline = time.monotonic() + grace
        while self.state.active and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        await self.server.stop(max(0.0, deadline - time.monotonic()))
        if self.rest is not None:
            await self.rest.stop()
        await self.repository.stop(grace)
        self.state.tracer.flush()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.own_folder is not None:
            shutil.rmtree(self.own_folder, ignore_errors=True)


async def _set_health(servicer: Any, status: int) -> None:
    for name in ("", *SERVICE_NAMES[:2]):
        result = servicer.set(name, status)
        if inspect.isawaitable(result):
            await result


def _reflection_pool() -> descriptor_pool.DescriptorPool:
    """A pool holding every served file (the inference protos live in a private pool)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (attnserve_pb2, grpc_service_pb2, health_pb2, reflection_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


async def create_server(
    config: ServerConfig,
    repository: ModelRepository | None = None,
    metrics: ServingMetrics | None = None,
    reuse_port: bool = False,
    control: ModelControl | None = None,
    traces: TraceChanges | None = None,
    logs: LogChanges | None = None,
) -> RunningServer:
    """Load the repository and start serving on ``config.host:config.port`` (0 = a free port).

    ``repository`` and ``metrics`` default to loading ``config.repository`` here with fresh
    metrics; ``reuse_port`` lets several frontend processes listen on the same port;
    ``control`` (a frontend's) defaults to loading models here where
    ``config.model_control_mode`` is explicit, and to following the repository folder here
    where it is poll (``serving.model_poll``; a frontend's engine process does that);
    ``traces`` (a frontend's) defaults to tracing here with ``config``'s trace settings;
    ``logs`` (what ``LogSettings`` changes) defaults to settings kept and answered without
    touching this process's logging (``attnserve serve`` passes its own handlers).

    Raises:
        SecurityConfigError: a TLS file or token cannot be used (checked before loading models).
        RepositoryError: the repository cannot be served.
        OSError: the port cannot be bound.
    """
    credentials = server_credentials(config)
    tokens = accepted_tokens(config)
    metrics = metrics or ServingMetrics()
    repository = repository or ModelRepository.load(config.repository, metrics, config.models)
    await repository.start()
    poller = None
    if control is None and config.model_control_mode == "explicit":
        control = LocalModelControl(repository, config.grace_period_s)
    elif control is None and config.model_control_mode == "poll":
        local = LocalModelControl(repository, config.grace_period_s)
        poller = RepositoryPoller(local, config.repository_poll_secs, config.models)
        control = PolledModelControl(config.repository_poll_secs)
    server = _grpc_server(config, tokens, reuse_port)
    traces = traces or TraceChanges(Tracer(config.trace_settings()))
    cache = (
        ResponseCache(config.response_cache_bytes, metrics) if config.response_cache_bytes else None
    )
    state = ServerState(traces.tracer, cache)
    logs = logs or LogChanges(LogControl(LogSettings.for_level(config.log_level)))
    regions, own_folder = _shared_memory(config)
    kserve = KServeServicer(repository, metrics, state, regions, control, traces, logs)
    attnserve = AttnServeServicer(repository, metrics, state)
    health = _add_services(server, attnserve, kserve)
    address = f"{config.host}:{config.port}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        await repository.stop(0)
        if own_folder is not None:
            shutil.rmtree(own_folder, ignore_errors=True)
        raise OSError(f"cannot bind {config.host}:{config.port}; is the port in use?")
    await server.start()
    try:
        rest = await _start_rest(config, kserve, attnserve, tokens, reuse_port)
    except OSError:
        await server.stop(0)
        await repository.stop(0)
        if own_folder is not None:
            shutil.rmtree(own_folder, ignore_errors=True)
        raise
    await _set_health(health, health_pb2.HealthCheckResponse.SERVING)
    if poller is not None:
        poller.start()
    metrics_server, metrics_port = None, None
    if config.metrics_port >= 0:
        metrics_server, metrics_port = metrics.start_http_server(
            config.metrics_port, config.metrics_host
        )
    log.info(
        "serving %s on %s:%d%s (%s, %s)",
        repository.names(),
        config.host,
        port,
        "" if rest is None else f", HTTP/REST on port {rest.port}",
        "TLS" if credentials else "plaintext",
        f"{len(tokens)} bearer token(s)" if tokens else "no authentication",
    )
    return RunningServer(
        server,
        port,
        metrics_port,
        repository,
        metrics,
        state,
        health,
        metrics_server,
        tls=credentials is not None,
        authenticated=bool(tokens),
        own_folder=own_folder,
        poller=poller,
        rest=rest,
    )


async def _start_rest(
    config: ServerConfig,
    kserve: KServeServicer,
    attnserve: AttnServeServicer,
    tokens: tuple[str, ...],
    reuse_port: bool,
) -> RestServer | None:
    """The HTTP/REST server on ``config.http_port`` (None where it is off; aiohttp is imported
    only then)."""
    if config.http_port < 0:
        return None
    from serving.rest.server import RestServer

    rest = RestServer(
        kserve, attnserve, tokens, server_ssl_context(config), config.max_message_bytes
    )
    await rest.start(config.host, config.http_port, reuse_port)
    return rest


def _shared_memory(config: ServerConfig) -> tuple[SharedMemoryRegions | None, Path | None]:
    """The system shared memory registry (None when off), and its folder if this server owns it."""
    if not config.system_shared_memory:
        return None, None
    shared = os.environ.get(REGIONS_FOLDER_ENV)
    folder = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="attnserve-regions-"))
    return SharedMemoryRegions(folder, config.max_message_bytes), None if shared else folder


def _grpc_server(
    config: ServerConfig, tokens: tuple[str, ...], reuse_port: bool
) -> grpc.aio.Server:
    """The grpc.aio server with message limits and the interceptors (parsing, then auth)."""
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
    ]
    # StrictParsing first: it wraps whatever the later interceptors return (an auth rejection
    # has no deserializer and is left alone), so unparsable requests get INVALID_ARGUMENT.
    interceptors: list[grpc.aio.ServerInterceptor] = [StrictParsing()]
    if tokens:
        interceptors.append(BearerTokenInterceptor(tokens))
    return grpc.aio.server(options=options, interceptors=interceptors)


def _add_services(
    server: grpc.aio.Server, attnserve: AttnServeServicer, kserve: KServeServicer
) -> HealthServicer:
    """Both APIs, health and reflection; returns the health servicer (drain turns it off)."""
    attnserve_pb2_grpc.add_AttnServeServicer_to_server(attnserve, server)
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(kserve, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, reflection.SERVICE_NAME), server, pool=_reflection_pool()
    )
    return health
