"""The HTTP/REST server (aiohttp): routes, errors as JSON, bearer tokens, TLS, start and stop."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import grpc
from aiohttp import web

from serving.errors import ServingError, TooLarge
from serving.openai.responses import error_document
from serving.openai.routes import OpenAIRoutes
from serving.rest.routes import CallFailed, Handler, Routes, http_status, json_response
from serving.security import BearerTokenInterceptor
from serving.services.attnserve import AttnServeServicer
from serving.services.kserve import KServeServicer

log = logging.getLogger(__name__)
SHUTDOWN_S = 0.05  # what a request still running after the drain's grace period gets
OPEN_PREFIX = "/v2/health/"  # health answers without a token, as grpc.health.v1 does

OPENAI_PREFIX = "/v1/"  # the OpenAI-compatible routes answer errors in OpenAI's shape


def error_response(
    path: str, status: int, message: str, code: grpc.StatusCode | None = None
) -> web.Response:
    """An error answer: Triton's ``{"error": message}``, or OpenAI's error object on the
    OpenAI-compatible routes."""
    if path.startswith(OPENAI_PREFIX):
        name = None if code is None else code.name
        return json_response(error_document(status, message, name), status)
    return json_response({"error": message}, status)


def _status(path: str, code: grpc.StatusCode, error: BaseException | None) -> int:
    """The HTTP status of a failure; on the OpenAI routes a size limit is 400, not 429: OpenAI's
    clients retry a 429, and the same request fails again (OpenAI answers a prompt past the
    context length 400 too)."""
    if path.startswith(OPENAI_PREFIX) and isinstance(error, TooLarge):
        return 400
    return http_status(code)


def _route_table(routes: Routes, openai: OpenAIRoutes) -> list[tuple[str, str, Handler]]:
    """(method, path, handler) of every route, in matching order."""
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/v1/models", openai.models),
        ("GET", "/v1/models/{model}", openai.model),
        ("POST", "/v1/completions", openai.completions),
        ("POST", "/v1/chat/completions", openai.chat),
        ("GET", "/v2/health/live", routes.live),
        ("GET", "/v2/health/ready", routes.ready),
        ("GET", "/v2", routes.server_metadata),
        ("GET", "/v2/models/stats", routes.statistics),
        ("POST", "/v2/repository/index", routes.repository_index),
        ("POST", "/v2/repository/models/{name}/load", routes.load),
        ("POST", "/v2/repository/models/{name}/unload", routes.unload),
        ("GET", "/v2/trace/setting", routes.trace_setting),
        ("POST", "/v2/trace/setting", routes.trace_setting),
        ("GET", "/v2/models/{name}/trace/setting", routes.trace_setting),
        ("POST", "/v2/models/{name}/trace/setting", routes.trace_setting),
        ("GET", "/v2/logging", routes.log_settings),
        ("POST", "/v2/logging", routes.log_settings),
        ("GET", "/v2/systemsharedmemory/status", routes.shm_status),
        ("GET", "/v2/systemsharedmemory/region/{region}/status", routes.shm_status),
        ("POST", "/v2/systemsharedmemory/region/{region}/register", routes.shm_register),
        ("POST", "/v2/systemsharedmemory/region/{region}/unregister", routes.shm_unregister),
        ("POST", "/v2/systemsharedmemory/unregister", routes.shm_unregister),
    ]
    for model in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        table += [
            ("GET", model, routes.model_metadata),
            ("GET", f"{model}/ready", routes.model_ready),
            ("GET", f"{model}/config", routes.model_config),
            ("GET", f"{model}/stats", routes.statistics),
            ("POST", f"{model}/infer", routes.infer),
            ("POST", f"{model}/generate", routes.generate),
            ("POST", f"{model}/generate_stream", routes.generate_stream),
        ]
    return table


class RestServer:
    """KServe v2 and the OpenAI-compatible routes over HTTP/REST beside the gRPC port,
    answered by the same servicers.

    ``tokens``: accepted bearer tokens (empty: no authentication); ``ssl_context``: TLS (None:
    plain HTTP); ``max_body_bytes``: the largest request body (the gRPC message limit).
    """

    def __init__(
        self,
        servicer: KServeServicer,
        attnserve: AttnServeServicer,
        tokens: tuple[str, ...],
        ssl_context: ssl.SSLContext | None,
        max_body_bytes: int,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.ssl_context = ssl_context
        self.auth = BearerTokenInterceptor(tokens) if tokens else None
        app = web.Application(
            client_max_size=max_body_bytes, middlewares=[self._errors, self._authenticate]
        )
        for method, path, handler in _route_table(Routes(servicer), OpenAIRoutes(attnserve)):
            app.router.add_route(method, path, handler)
        # handler_cancellation: a client that hangs up cancels its request (its engine rows
        # are freed), as a cancelled gRPC call does. Hardly a shutdown wait of its own: the
        # server's drain (RunningServer.stop) has given calls their grace period before it stops
        # this one, and what still runs then is cancelled, as grpc.aio's stop does (aiohttp
        # reads a timeout of 0 as none at all).
        self.runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_S
        )
        self.port = 0

    async def start(self, host: str, port: int, reuse_port: bool) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        await self.runner.setup()
        site = web.TCPSite(
            self.runner, host, port, ssl_context=self.ssl_context, reuse_port=reuse_port or None
        )
        try:
            await site.start()
        except OSError as err:
            await self.runner.cleanup()
            raise OSError(f"cannot bind HTTP {host}:{port}; is the port in use? ({err})") from err
        self.port = self.runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        await self.runner.cleanup()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure as an error body (``error_response``) with an HTTP status that says
        what kind."""
        path = request.path
        try:
            return await handler(request)
        except CallFailed as err:  # raised while the servicer handled the ServingError
            status = _status(path, err.code, err.__context__)
            return error_response(path, status, err.message, err.code)
        except ServingError as err:
            return error_response(path, _status(path, err.code, err), str(err), err.code)
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                path,
                413,
                f"the request body is larger than {self.max_body_bytes} bytes, the server's "
                "max_message_bytes; send less, or raise --max-message-bytes",
            )
        except web.HTTPMethodNotAllowed as err:
            allowed = ", ".join(sorted(err.allowed_methods))
            message = f"{request.method} is not served on {path[:200]}; use {allowed}"
            response = error_response(path, 405, message)
            response.headers["Allow"] = allowed
            return response
        except web.HTTPNotFound:
            routes = (
                "an OpenAI route: GET /v1/models, POST /v1/completions or POST /v1/chat/completions"
                if path.startswith(OPENAI_PREFIX)
                else "a KServe v2 REST route such as GET /v2/models/NAME or POST "
                "/v2/models/NAME/infer"
            )
            return error_response(
                path,
                404,
                f"no route {request.method} {path[:200]}: use {routes} (README: HTTP/REST)",
            )
        except web.HTTPException as err:
            return error_response(path, err.status, err.text or err.reason)
        except Exception as err:  # a bug: logged, and the client still gets a JSON answer
            log.exception("internal error in %s %s", request.method, path[:200])
            code = grpc.StatusCode.INTERNAL
            return error_response(path, 500, f"internal error: {type(err).__name__}", code)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.auth is None or request.path.startswith(OPEN_PREFIX):
            return await handler(request)
        values: list[tuple[str, Any]] = [
            ("authorization", v) for v in request.headers.getall("Authorization", [])
        ]
        problem = self.auth.problem(values)
        if problem is None:
            return await handler(request)
        code = grpc.StatusCode.UNAUTHENTICATED
        response = error_response(request.path, 401, problem, code)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
