"""The KServe v2 servicer (``inference.GRPCInferenceService``): health, metadata, statistics,
the repository index, model control, system shared memory, inference.

The protocol's pieces live in ``serving.kserve`` (tensor contract in its docstring); this module
only maps RPCs onto them inside the shared RPC envelope (``serving.services.common``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from serving.errors import InvalidArgument, NotFound
from serving.kserve import model_control, shared_memory
from serving.kserve.execute import infer
from serving.kserve.repository_index import check_repository_name, repository_index
from serving.kserve.request import prepare
from serving.kserve.signature import platform, signature
from serving.kserve.statistics import model_statistics
from serving.kserve.stream import stream_responses
from serving.kserve.triton_config import SERVER_NAME, model_config, model_ready, server_version
from serving.log_settings import PARAMETERS, LogChanges, parse_log_changes
from serving.metrics import ServingMetrics
from serving.model_control import ModelControl
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.repository import check_model_name
from serving.response_cache import answer
from serving.served import ServedModel
from serving.services.common import ServerState, Servicer, deadline_of, served_call, unary
from serving.trace_control import TraceChanges
from serving.tracing import parse_changes

_END = object()
# Triton's protocol extensions attnserve serves (ServerMetadata lists them): top-k
# "classification" outputs, request "parameters", ModelConfig ("model_configuration") and
# ModelStatistics ("statistics"; perf_analyzer asks for the server's own figures only where it
# is listed), the request parameters "priority" and "timeout" ("schedule_policy"), and
# "system_shared_memory" where it is on, "model_repository" and
# "model_repository(unload_dependents)" with model control, request traces ("trace") and log
# settings ("logging"). Not listed: what it leaves out (cuda_shared_memory).
EXTENSIONS = (
    "classification",
    "logging",
    "model_configuration",
    "parameters",
    "schedule_policy",
    "statistics",
    "trace",
)
SHARED_MEMORY_EXTENSION = "system_shared_memory"
MODEL_CONTROL_EXTENSIONS = ("model_repository", "model_repository(unload_dependents)")


def _parameter(name: str, value: Any) -> Any:
    """A LogSettings value as Python's bool, int or str."""
    choice = value.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidArgument(
            f"{name} has no value: set its bool_param, uint32_param or string_param"
        )
    return getattr(value, choice)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen, so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()


def _version(request: Any) -> str:
    return str(request.version)


class KServeServicer(Servicer, pb_grpc.GRPCInferenceServiceServicer):
    """KServe v2 health, metadata, config, unary and streaming inference.

    Health and metadata answer while the server drains (Triton: live stays true and ready turns
    false while the server shuts down); inference is refused with UNAVAILABLE then.
    ``regions``: the server's system shared memory regions (None: the extension is off);
    ``control``: its model control (None: off, ``--model-control-mode none``); ``traces`` and
    ``logs``: how its trace and log settings change (``TraceSetting``, ``LogSettings``).
    """

    def __init__(
        self,
        repository: Any,
        metrics: ServingMetrics,
        state: ServerState,
        regions: shared_memory.SharedMemoryRegions | None,
        control: ModelControl | None,
        traces: TraceChanges,
        logs: LogChanges,
    ) -> None:
        super().__init__(repository, metrics, state)
        self.regions = regions
        self.control = control
        self.traces = traces
        self.logs = logs
        self.extensions = sorted(
            [
                *EXTENSIONS,
                *([SHARED_MEMORY_EXTENSION] if regions else []),
                *(MODEL_CONTROL_EXTENSIONS if control else []),
            ]
        )

    def model(self, name: str, version: str) -> ServedModel:
        if not name:
            raise InvalidArgument(
                "model_name is empty; name the model (ServerMetadata lists none, "
                "ModelMetadata describes one)"
            )
        return self.repository.get(name, version)

    # --- health and metadata --------------------------------------------------------------------
    @unary("ServerLive", lambda r: "", refuse_when_draining=False)
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any):
        return pb.ServerLiveResponse(live=True)

    @unary("ServerReady", lambda r: "", refuse_when_draining=False)
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any):
        # every served model ready (a server whose models were all unloaded is ready, as Triton's)
        models = self.repository.models()
        ready = not self.state.draining and all(map(model_ready, models))
        return pb.ServerReadyResponse(ready=ready)

    @unary("ModelReady", lambda r: r.name, refuse_when_draining=False, version_of=_version)
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any):
        try:
            model = self.model(request.name, request.version)
        except (NotFound, InvalidArgument):  # Triton answers ready=false for unknown models
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not self.state.draining and model_ready(model))

    @unary("ServerMetadata", lambda r: "", refuse_when_draining=False)
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any):
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=server_version(), extensions=self.extensions
        )

    @unary("ModelMetadata", lambda r: r.name, refuse_when_draining=False, version_of=_version)
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any):
        model = self.model(request.name, request.version)
        sig = signature(model.config)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=list(map(str, self.repository.versions(model.name))),
            platform=platform(model.config),
            inputs=[spec.metadata() for spec in sig.inputs],
            outputs=[spec.metadata() for spec in sig.outputs],
        )

    @unary("ModelConfig", lambda r: r.name, refuse_when_draining=False, version_of=_version)
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any):
        return pb.ModelConfigResponse(
            config=model_config(self.model(request.name, request.version))
        )

    @unary("ModelStatistics", lambda r: r.name, refuse_when_draining=False, version_of=_version)
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any):
        if request.name and request.version:
            models = [self.model(request.name, request.version)]
        elif request.name:  # every served version, as Triton's
            versions = self.repository.versions(request.name)
            models = [self.repository.get(request.name, str(v)) for v in versions]
        elif request.version:
            raise InvalidArgument(
                f"version {request.version[:40]!r} without a model name: name the model, or "
                "leave both empty for every model's statistics"
            )
        else:
            models = self.repository.models()
        # every process's metric files are read in a multi-process server: off the event loop
        stats = await asyncio.to_thread(model_statistics, self.metrics.aggregated(), models)
        return pb.ModelStatisticsResponse(model_stats=stats)

    @unary("RepositoryIndex", lambda r: "", refuse_when_draining=False)
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any):
        return repository_index(self.repository, request.repository_name, request.ready)

    # --- model control --------------------------------------------------------------------------
    def _control(self, repository_name: str, model_name: str) -> ModelControl:
        if self.control is None:
            raise model_control.off()
        check_repository_name(self.repository, repository_name)
        check_model_name(model_name)
        return self.control

    @unary("RepositoryModelLoad", lambda r: r.model_name)
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Any):
        control = self._control(request.repository_name, request.model_name)
        model_control.check_load_parameters(request.parameters)
        await control.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @unary("RepositoryModelUnload", lambda r: r.model_name)
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Any):
        control = self._control(request.repository_name, request.model_name)
        model_control.check_unload_parameters(request.parameters)
        await control.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # --- request traces -------------------------------------------------------------------------
    @unary("TraceSetting", lambda r: r.model_name, refuse_when_draining=False)
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any):
        name = self.repository.get(request.model_name).name if request.model_name else ""
        if "trace_file" in request.settings:  # as Triton's since 2024: no path a client chose
            raise InvalidArgument(
                "trace_file can only be set when the server starts (--trace-file): TraceSetting "
                "does not let a client choose where the server writes; leave it out"
            )
        changes = parse_changes({key: value.value for key, value in request.settings.items()})
        if changes:
            await self.traces.update(name, changes)
        response = pb.TraceSettingResponse()
        for key, values in self.traces.tracer.settings(name).items():
            response.settings[key].value.extend(values)
        return response

    # --- log settings ---------------------------------------------------------------------------
    @unary("LogSettings", lambda r: "", refuse_when_draining=False)
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any):
        changes = parse_log_changes(
            {name: _parameter(name, value) for name, value in request.settings.items()}
        )
        if changes:
            await self.logs.update(changes)
        response = pb.LogSettingsResponse()
        for name, value in self.logs.control.settings.values().items():
            setattr(response.settings[name], PARAMETERS[type(value)], value)
        return response

    # --- system shared memory -------------------------------------------------------------------
    def _regions(self) -> shared_memory.SharedMemoryRegions:
        if self.regions is None:
            raise shared_memory.off()
        return self.regions

    @unary("SystemSharedMemoryStatus", lambda r: "")
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ):
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._regions().status(request.name):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**dataclasses.asdict(region))
            )
        return response

    @unary("SystemSharedMemoryRegister", lambda r: "")
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ):
        self._regions().register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @unary("SystemSharedMemoryUnregister", lambda r: "")
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ):
        self._regions().unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    # --- inference ------------------------------------------------------------------------------
    @unary("ModelInfer", lambda r: r.model_name, version_of=lambda r: r.model_version)
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext):
        model = self.model(request.model_name, request.model_version)
        call = prepare(model, request, deadline_of(context), self.regions)
        if self.state.cache is None or not model.config.response_cache:
            return await infer(call)
        return await answer(self.state.cache, call)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Bidirectional stream: every request runs concurrently; see the module docstring.

        Draining refuses new streams (UNAVAILABLE) and new requests on open ones (error_message).
        Metrics count each request of the stream (method "ModelStreamInfer").
        """
        if self.state.draining:
            self.record(
                self.model_label(""), "ModelStreamInfer", "UNAVAILABLE", time.perf_counter()
            )
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry on another replica"
            )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        pump = asyncio.ensure_future(self._pump(request_iterator, queue.put_nowait, context))
        pump.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while (item := await queue.get()) is not _END:
                yield item
            error = None if pump.cancelled() else pump.exception()
            if error is not None:
                raise error
        finally:
            pump.cancel()
            pump.add_done_callback(_retrieve)  # a late failure of a cancelled stream is not news

    async def _pump(
        self,
        requests: AsyncIterator[pb.ModelInferRequest],
        send: Callable[[pb.ModelStreamInferResponse], None],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Read the stream's requests, run each in its own task; return when all are done."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                task = asyncio.ensure_future(self._stream_one(request, send, context))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_one(
        self,
        request: pb.ModelInferRequest,
        send: Callable[[pb.ModelStreamInferResponse], None],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Serve one request of a stream; its failure goes into error_message, not the stream."""

        def report(code: str, message: str) -> None:
            send(
                pb.ModelStreamInferResponse(
                    error_message=f"{code}: {message}",
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    ),
                )
            )

        async with served_call(
            self,
            "ModelStreamInfer",
            request.model_name,
            context,
            report=report,
            request_id=request.id,
            version=request.model_version,
        ):
            model = self.model(request.model_name, request.model_version)
            call = prepare(model, request, deadline_of(context), self.regions)
            async for response in stream_responses(call):
                send(pb.ModelStreamInferResponse(infer_response=response))
