"""What every servicer method shares: draining, error -> status mapping, request metrics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from serving import tracing
from serving.errors import ServingError, Unavailable, status_code
from serving.metrics import INFERENCE_METHODS, ServingMetrics
from serving.tracing import Trace, Tracer

if TYPE_CHECKING:
    from serving.response_cache import ResponseCache

log = logging.getLogger(__name__)

DEADLINE_TOLERANCE_S = 0.005  # a cancellation this close to the deadline counts as expiry
UNKNOWN_MODEL = "unknown"  # metrics label for names no model has (keeps label cardinality bounded)


class ServerState:
    """Shared by the servicers: whether the server still takes new work, how many calls are
    being answered (a drain waits for them), which requests are traced, and the response
    cache."""

    def __init__(self, tracer: Tracer | None = None, cache: ResponseCache | None = None) -> None:
        self.draining = False
        self.active = 0
        self.tracer = tracer or Tracer()
        self.cache = cache  # KServe ModelInfer answers kept (None: no response cache)

    def check_serving(self) -> None:
        if self.draining:
            raise Unavailable("the server is shutting down; retry on another replica")


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds the client allows this call, or None when it set no deadline."""
    remaining = context.time_remaining()
    return None if remaining is None else max(0.0, remaining)


class Servicer:
    """Base of the servicers: holds the repository, metrics and server state."""

    def __init__(self, repository: Any, metrics: ServingMetrics, state: ServerState) -> None:
        self.repository = repository
        self.metrics = metrics
        self.state = state
        # (model, version, method, code) -> the children of the request counter, the latency
        # histogram, the summed latency and (inference methods) the last-request gauge,
        # looked up once (``labels`` takes a lock and builds its key on every call); bounded, as
        # names no model has are counted as UNKNOWN_MODEL
        self._recorders: dict[tuple[str, str, str, str], tuple[Any, Any, Any, Any]] = {}

    def model_label(self, name: str, version: str = "") -> tuple[str, str]:
        """The metrics ``model`` and ``version`` labels of a request for ``name`` (and
        ``version``; empty: the newest served): ("unknown", "") where no model serves it."""
        try:
            model = self.repository.get(name, version)
        except ServingError:
            return UNKNOWN_MODEL, ""
        return model.name, str(model.version)

    def start_trace(self, name: str, version: str, request_id: str) -> Trace | None:
        """A trace of this request if it is sampled (None for a name no model has)."""
        try:
            model = self.repository.get(name, version)
        except ServingError:
            return None
        return self.state.tracer.start(model.name, model.version, request_id)

    def record(self, model: tuple[str, str], method: str, code: str, started: float) -> None:
        key = (*model, method, code)
        recorders = self._recorders.get(key)
        if recorders is None:
            m = self.metrics
            inference = method in INFERENCE_METHODS and model[0] != UNKNOWN_MODEL
            labels = {"model": model[0], "version": model[1]}
            recorders = self._recorders[key] = (
                m.requests.labels(**labels, method=method, code=code),
                m.request_latency.labels(**labels, method=method),
                m.request_seconds.labels(**labels, method=method, code=code),
                m.last_request.labels(**labels) if inference else None,
            )
        count, latency, seconds, last = recorders
        took = time.perf_counter() - started
        count.inc()
        latency.observe(took)
        seconds.inc(took)
        if last is not None:
            last.set(time.time())


def error_message(err: BaseException) -> str:
    """What the client reads: a ServingError's own message, else the internal error named."""
    if isinstance(err, ServingError):
        return str(err)
    return f"internal error: {type(err).__name__}: {err}"


def ended_early(context: grpc.aio.ServicerContext) -> str:
    """The status of a call that ended before its handler did: the client cancelled it, or its
    deadline passed (grpc cancels the handler at the deadline; the client's own timer may fire
    a hair earlier and cancel first, hence the few milliseconds of tolerance)."""
    remaining = context.time_remaining()
    expired = remaining is not None and remaining <= DEADLINE_TOLERANCE_S
    return "DEADLINE_EXCEEDED" if expired else "CANCELLED"


ErrorSink = Callable[[str, str], None]  # (status code name, message) of a failed call


@contextlib.asynccontextmanager
async def served_call(
    servicer: Servicer,
    method: str,
    model: str,
    context: grpc.aio.ServicerContext,
    *,
    refuse_when_draining: bool = True,
    report: ErrorSink | None = None,
    request_id: str = "",
    version: str = "",
) -> AsyncIterator[None]:
    """The envelope of every RPC: map errors to statuses, record the request metrics, and
    trace the inference requests that the trace settings sample (``serving.tracing``).

    Args:
        servicer: holds the server state and metrics.
        method: the metrics ``method`` label.
        model: the requested model name (an unknown one is counted as "unknown").
        context: the call's context.
        refuse_when_draining: answer UNAVAILABLE while the server drains (health and metadata
            probes keep answering, as Triton's do).
        report: where a failure goes instead of aborting the call (one request of a KServe
            stream fails into its response's error_message; the stream stays open).
        request_id: the request's own id (KServe's), written into its trace.
        version: the requested version (empty: the newest served), for the metrics and trace.
    """
    started = time.perf_counter()
    code = "OK"
    ended = False
    servicer.state.active += 1
    trace = None
    if servicer.state.tracer.enabled and method in INFERENCE_METHODS:
        trace = servicer.start_trace(model, version, request_id)
        if trace is not None:
            trace.stamp("REQUEST_START", time.monotonic_ns())
            token = tracing.current.set(trace)

    def end() -> None:
        """Count the call once, before its status leaves: a client that has its answer finds
        it in /metrics (``context.abort`` sends the status before it returns)."""
        nonlocal ended
        if not ended:
            ended = True
            servicer.state.active -= 1
            servicer.record(servicer.model_label(model, version), method, code, started)

    try:
        if refuse_when_draining:
            servicer.state.check_serving()
        yield
    except (asyncio.CancelledError, GeneratorExit):  # GeneratorExit: a stream closed early
        code = ended_early(context)
        raise
    except Exception as err:
        code = status_code(err).name
        if not isinstance(err, ServingError):
            log.exception("internal error in %s", method)
        if report is None:
            end()
            await context.abort(status_code(err), error_message(err))
        else:
            report(code, error_message(err))
    finally:
        end()
        if trace is not None:
            trace.stamp("REQUEST_END", time.monotonic_ns())
            servicer.state.tracer.end(trace)
            with contextlib.suppress(ValueError):  # a stream closed from another context
                tracing.current.reset(token)


def unary(
    method: str,
    model_of: Callable[[Any], str],
    *,
    refuse_when_draining: bool = True,
    version_of: Callable[[Any], str] | None = None,
) -> Callable:
    """Wrap a unary servicer method in ``served_call`` (``refuse_when_draining``: see there;
    ``version_of``: the request's model version, for the metrics)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def handler(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with served_call(
                self,
                method,
                model_of(request),
                context,
                refuse_when_draining=refuse_when_draining,
                request_id=getattr(request, "id", ""),
                version=version_of(request) if version_of is not None else "",
            ):
                return await fn(self, request, context)

        return handler

    return decorate


def streaming(
    method: str, model_of: Callable[[Any], str], version_of: Callable[[Any], str]
) -> Callable:
    """Wrap a server-streaming servicer method (an async generator) in ``served_call``
    (``version_of``: the request's model version, for the metrics)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def handler(
            self: Servicer, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            # aclosing: a stream the client abandons is closed now (its engine request
            # cancelled, its cache rows freed), not whenever the generator is collected.
            async with (
                served_call(self, method, model_of(request), context, version=version_of(request)),
                contextlib.aclosing(fn(self, request, context)) as messages,
            ):
                async for message in messages:
                    yield message

        return handler

    return decorate
