"""What every servicer method shares: draining, error -> status mapping, request metrics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from serving.errors import ServingError, Unavailable
from serving.metrics import ServingMetrics

log = logging.getLogger(__name__)

DEADLINE_TOLERANCE_S = 0.005  # a cancellation this close to the deadline counts as expiry
UNKNOWN_MODEL = "unknown"  # metrics label for names no model has (keeps label cardinality bounded)


class ServerState:
    """Shared by the servicers: whether the server still takes new work."""

    def __init__(self) -> None:
        self.draining = False

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

    def model_label(self, name: str) -> str:
        try:
            return self.repository.get(name).name
        except ServingError:
            return UNKNOWN_MODEL

    def record(self, model: str, method: str, code: str, started: float) -> None:
        self.metrics.requests.labels(model=model, method=method, code=code).inc()
        self.metrics.request_latency.labels(model=model, method=method).observe(
            time.perf_counter() - started
        )


async def _abort(context: grpc.aio.ServicerContext, err: BaseException) -> str:
    if isinstance(err, ServingError):
        await context.abort(err.code, str(err))
    log.exception("internal error", exc_info=err)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}: {err}")
    return "INTERNAL"  # unreachable: abort raises


def ended_early(context: grpc.aio.ServicerContext) -> str:
    """The status of a call that ended before its handler did: the client cancelled it, or its
    deadline passed (grpc cancels the handler at the deadline; the client's own timer may fire
    a hair earlier and cancel first, hence the few milliseconds of tolerance)."""
    remaining = context.time_remaining()
    expired = remaining is not None and remaining <= DEADLINE_TOLERANCE_S
    return "DEADLINE_EXCEEDED" if expired else "CANCELLED"


@contextlib.asynccontextmanager
async def served_call(
    servicer: Servicer, method: str, model: str, context: grpc.aio.ServicerContext
) -> AsyncIterator[None]:
    """One RPC's envelope: refuse while draining, map errors to statuses, record metrics."""
    started = time.perf_counter()
    code = "OK"
    try:
        servicer.state.check_serving()
        yield
    except (asyncio.CancelledError, GeneratorExit):  # GeneratorExit: a stream closed early
        code = ended_early(context)
        raise
    except Exception as err:
        code = err.code.name if isinstance(err, ServingError) else "INTERNAL"
        await _abort(context, err)
    finally:
        servicer.record(servicer.model_label(model), method, code, started)


def unary(method: str, model_of: Callable[[Any], str]) -> Callable:
    """Wrap a unary servicer method in ``served_call``."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def handler(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with served_call(self, method, model_of(request), context):
                return await fn(self, request, context)

        return handler

    return decorate


def streaming(method: str, model_of: Callable[[Any], str]) -> Callable:
    """Wrap a server-streaming servicer method (an async generator) in ``served_call``."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def handler(
            self: Servicer, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            # aclosing: a stream the client abandons is closed now (its engine request
            # cancelled, its cache rows freed), not whenever the generator is collected.
            async with (
                served_call(self, method, model_of(request), context),
                contextlib.aclosing(fn(self, request, context)) as messages,
            ):
                async for message in messages:
                    yield message

        return handler

    return decorate
