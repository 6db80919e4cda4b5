"""The KServe v2 REST routes, each answered by the KServe servicer's RPC of the same job.

Every handler builds the RPC's protobuf request from the URL and body, awaits the servicer's
method (so drain, metrics, traces, the response cache and every check are the gRPC API's), and
writes its answer as Triton's HTTP endpoint does. A failed RPC reaches the error middleware
(``serving.rest.server``) as ``CallFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc
from aiohttp import web

from serving.errors import InvalidArgument, ServingError, status_code
from serving.kserve.request import prepare
from serving.kserve.signature import signature
from serving.kserve.stream import stream_responses
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.rest.generate import generate_json, generate_request
from serving.rest.infer import (
    HEADER_LENGTH,
    json_object,
    parse_infer,
    parse_json,
    response_body,
)
from serving.rest.json_values import parameters_json
from serving.rest.proto_json import message_json
from serving.services.common import error_message, served_call
from serving.services.kserve import KServeServicer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
HTTP_EXTENSIONS = ("binary_tensor_data", "generate")


# A failed RPC's gRPC status as an HTTP status (the error's message is the body's "error").
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 500)


class CallFailed(Exception):
    """An RPC's failure: its gRPC status and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RestContext:
    """What the servicer's methods ask of a call's context, for an HTTP request: no deadline
    (Triton's ``timeout`` parameter bounds a request), and abort as an exception."""

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise CallFailed(code, details)


def json_response(document: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(document, ensure_ascii=False).encode(), status=status, content_type=JSON
    )


def _model(request: web.Request) -> tuple[str, str]:
    return request.match_info["name"], request.match_info.get("version", "")


async def _body(request: web.Request, what: str = "request body") -> Any:
    """A body's JSON value (an empty body: an empty object)."""
    body = await request.read()
    return parse_json(body, what) if body.strip() else {}


class Routes:
    """The handlers, around one KServe servicer."""

    def __init__(self, servicer: KServeServicer) -> None:
        self.servicer = servicer
        self.context = RestContext()

    def _refused(self, method: str, name: str, version: str, err: ServingError) -> NoReturn:
        """A request refused before its RPC ran (a body that does not parse): counted in the
        metrics as the RPC would count it."""
        model = self.servicer.model_label(name, version)
        self.servicer.record(model, method, status_code(err).name, time.perf_counter())
        raise CallFailed(status_code(err), error_message(err))

    # --- health and metadata --------------------------------------------------------------------
    async def live(self, request: web.Request) -> web.Response:
        answer = await self.servicer.ServerLive(pb.ServerLiveRequest(), self.context)
        return web.Response(status=200 if answer.live else 400)

    async def ready(self, request: web.Request) -> web.Response:
        answer = await self.servicer.ServerReady(pb.ServerReadyRequest(), self.context)
        return web.Response(status=200 if answer.ready else 400)

    async def model_ready(self, request: web.Request) -> web.Response:
        name, version = _model(request)
        message = pb.ModelReadyRequest(name=name, version=version)
        answer = await self.servicer.ModelReady(message, self.context)
        return web.Response(status=200 if answer.ready else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        answer = await self.servicer.ServerMetadata(pb.ServerMetadataRequest(), self.context)
        document = message_json(answer)
        document["extensions"] = sorted({*document["extensions"], *HTTP_EXTENSIONS})
        return json_response(document)

    async def model_metadata(self, request: web.Request) -> web.Response:
        name, version = _model(request)
        message = pb.ModelMetadataRequest(name=name, version=version)
        return json_response(message_json(await self.servicer.ModelMetadata(message, self.context)))

    async def model_config(self, request: web.Request) -> web.Response:
        name, version = _model(request)
        message = pb.ModelConfigRequest(name=name, version=version)
        answer = await self.servicer.ModelConfig(message, self.context)
        return json_response(message_json(answer.config))

    async def statistics(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "")
        message = pb.ModelStatisticsRequest(
            name=name, version=request.match_info.get("version", "")
        )
        return json_response(
            message_json(await self.servicer.ModelStatistics(message, self.context))
        )

    # --- inference ------------------------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.Response:
        name, version = _model(request)
        body = await request.read()
        try:
            parsed = parse_infer(body, request.headers.get(HEADER_LENGTH), name, version)
        except ServingError as err:
            self._refused("ModelInfer", name, version, err)
        answer = await self.servicer.ModelInfer(parsed.message, self.context)
        content, length = response_body(answer, parsed.binary, parsed.all_binary)
        if length is None:
            response = web.Response(body=content, content_type=JSON)
        else:
            response = web.Response(
                body=content,
                content_type="application/octet-stream",
                headers={HEADER_LENGTH: str(length)},
            )
        if request.headers.get("Accept-Encoding"):
            response.enable_compression()
        return response

    def _generate_request(
        self, request: web.Request, body: bytes, method: str
    ) -> pb.ModelInferRequest:
        name, version = _model(request)
        try:
            document = parse_json(body) if body.strip() else None
            model = self.servicer.model(name, version)
            return generate_request(document, signature(model.config), name, version)
        except ServingError as err:
            self._refused(method, name, version, err)

    async def generate(self, request: web.Request) -> web.Response:
        message = self._generate_request(request, await request.read(), "ModelInfer")
        answer = await self.servicer.ModelInfer(message, self.context)
        return json_response(generate_json(answer))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events, a ``data:`` event per response; a failure before the first one
        is the HTTP answer, a later one an ``{"error": ...}`` event that ends the stream."""
        body = await request.read()
        message = self._generate_request(request, body, "ModelStreamInfer")
        stream = web.StreamResponse(headers=SSE_HEADERS)
        servicer = self.servicer
        try:
            async with served_call(
                servicer,
                "ModelStreamInfer",
                message.model_name,
                self.context,
                request_id=message.id,
                version=message.model_version,
            ):
                model = servicer.model(message.model_name, message.model_version)
                call = prepare(model, message, None, servicer.regions)
                async with contextlib.aclosing(stream_responses(call)) as responses:
                    async for answer in responses:
                        await send_event(stream, request, sse_event(generate_json(answer)))
        except CallFailed as err:
            if not stream.prepared:
                raise
            await stream.write(sse_event({"error": err.message}))
        await stream.write_eof()
        return stream

    # --- repository and model control -----------------------------------------------------------
    async def repository_index(self, request: web.Request) -> web.Response:
        document = await _body(request)
        ready = document.get("ready", False) if isinstance(document, dict) else None
        if not isinstance(ready, bool):
            raise InvalidArgument('the index request body is {"ready": true | false}, or empty')
        message = pb.RepositoryIndexRequest(ready=ready)
        answer = await self.servicer.RepositoryIndex(message, self.context)
        return json_response([message_json(model) for model in answer.models])

    async def load(self, request: web.Request) -> web.Response:
        message = pb.RepositoryModelLoadRequest(model_name=request.match_info["name"])
        _repository_parameters(await _body(request), message.parameters)
        await self.servicer.RepositoryModelLoad(message, self.context)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        message = pb.RepositoryModelUnloadRequest(model_name=request.match_info["name"])
        _repository_parameters(await _body(request), message.parameters)
        await self.servicer.RepositoryModelUnload(message, self.context)
        return web.Response(status=200)

    # --- traces and logs ------------------------------------------------------------------------
    async def trace_setting(self, request: web.Request) -> web.Response:
        message = pb.TraceSettingRequest(model_name=request.match_info.get("name", ""))
        if request.method == "POST":
            for key, value in json_object(await _body(request), "trace settings").items():
                values = [value] if isinstance(value, str) else [] if value is None else value
                if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                    raise InvalidArgument(
                        f"trace setting {key[:100]!r} must be a string, an array of strings or "
                        "null (back to the server's)"
                    )
                message.settings[key].value.extend(values)
        answer = await self.servicer.TraceSetting(message, self.context)
        return json_response(
            {
                key: list(value.value)
                if key == "trace_level" or len(value.value) != 1
                else value.value[0]
                for key, value in answer.settings.items()
            }
        )

    async def log_settings(self, request: web.Request) -> web.Response:
        message = pb.LogSettingsRequest()
        if request.method == "POST":
            for key, value in json_object(await _body(request), "log settings").items():
                setting = message.settings[key]
                if isinstance(value, bool):
                    setting.bool_param = value
                elif isinstance(value, int) and 0 <= value < 2**32:
                    setting.uint32_param = value
                elif isinstance(value, str):
                    setting.string_param = value
                else:
                    raise InvalidArgument(
                        f"log setting {key[:100]!r} must be a boolean, an integer 0..2**32-1 or "
                        "a string"
                    )
        answer = await self.servicer.LogSettings(message, self.context)
        return json_response(parameters_json(answer.settings))

    # --- system shared memory -------------------------------------------------------------------
    async def shm_status(self, request: web.Request) -> web.Response:
        message = pb.SystemSharedMemoryStatusRequest(name=request.match_info.get("region", ""))
        answer = await self.servicer.SystemSharedMemoryStatus(message, self.context)
        return json_response([message_json(region) for region in answer.regions.values()])

    async def shm_register(self, request: web.Request) -> web.Response:
        document = json_object(await _body(request), "the register request body")
        key, offset, size = (
            document.get("key"),
            document.get("offset", 0),
            document.get("byte_size"),
        )
        if not isinstance(key, str) or not _count(offset) or not _count(size):
            raise InvalidArgument(
                'the register request body is {"key": "/name", "offset": bytes, "byte_size": '
                "bytes}, the numbers integers >= 0"
            )
        message = pb.SystemSharedMemoryRegisterRequest(
            name=request.match_info["region"], key=key, offset=offset, byte_size=size
        )
        await self.servicer.SystemSharedMemoryRegister(message, self.context)
        return web.Response(status=200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        message = pb.SystemSharedMemoryUnregisterRequest(name=request.match_info.get("region", ""))
        await self.servicer.SystemSharedMemoryUnregister(message, self.context)
        return web.Response(status=200)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _repository_parameters(document: Any, parameters: Any) -> None:
    """A load / unload body's ``parameters`` into the request's (their checks are the RPC's)."""
    values = json_object(document, "the request body").get("parameters", {})
    for key, value in json_object(values, '"parameters"').items():
        if isinstance(value, bool):
            parameters[key].bool_param = value
        elif isinstance(value, int) and -(2**63) <= value < 2**63:
            parameters[key].int64_param = value
        elif isinstance(value, str):
            parameters[key].string_param = value
        else:
            raise InvalidArgument(
                f"parameter {key[:100]!r} must be a boolean, a 64-bit integer or a string"
            )


async def send_event(stream: web.StreamResponse, request: web.Request, event: bytes) -> None:
    """Write an event (the headers first); a client that went away cancels the call, as a
    cancelled gRPC stream does (counted CANCELLED, not as a server error)."""
    try:
        if not stream.prepared:
            await stream.prepare(request)
        await stream.write(event)
    except ConnectionResetError:
        raise asyncio.CancelledError from None


def sse_event(document: Any) -> bytes:
    return b"data: " + json.dumps(document, ensure_ascii=False).encode() + b"\n\n"
