"""Requests that are not valid protobuf get INVALID_ARGUMENT, not grpc's default UNKNOWN.

grpc.aio parses a request with the handler's ``request_deserializer`` before any servicer code
runs, and a parse failure ends the call with UNKNOWN ("Unexpected <class DecodeError>"), which
tells the client nothing it can fix. ``StrictParsing`` (a server interceptor) hands the raw bytes
to the handler instead and parses them there: a message that does not parse ends the call with
INVALID_ARGUMENT and a message naming the expected type. Handlers without a deserializer (e.g. an
interceptor's own rejection handler) are left alone. Streaming requests are parsed one by one;
the first broken one aborts the stream.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


def _expected_type(deserializer: Callable[[bytes], Any]) -> str:
    owner = getattr(deserializer, "__self__", None)  # bound classmethod FromString
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "") or "the method's request type"


class Unparsable(Exception):
    """A request message that does not parse; ``str()`` is the message for the client."""


def _parse(deserializer: Callable[[bytes], Any], raw: bytes, method: str) -> Any:
    try:
        return deserializer(raw)
    except Exception as err:  # DecodeError, or whatever a custom deserializer raises
        raise Unparsable(
            f"the request to {method} is not a valid {_expected_type(deserializer)} protobuf "
            f"message ({len(raw)} bytes; {type(err).__name__}: {err}); send a message serialised "
            "from the published .proto files"
        ) from err


async def _abort(context: grpc.aio.ServicerContext, err: Unparsable) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


async def _result(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _responses(value: Any) -> AsyncGenerator[Any, None]:
    """The messages of a streaming behavior: async generator, sync iterator or coroutine.

    Use it under ``contextlib.aclosing``: closing it closes ``value`` too, at once (a stream
    the client abandons must stop its work now, not when the generator is collected).
    """
    if inspect.isawaitable(value):  # a coroutine writing with context.write()
        await value
        return
    if hasattr(value, "__aiter__"):
        try:
            async for message in value:
                yield message
        finally:
            close = getattr(value, "aclose", None)
            if close is not None:
                await close()
        return
    for message in value or ():
        yield message


def _parsed_stream(
    requests: Any, deserializer: Callable[[bytes], Any], method: str
) -> AsyncIterator[Any]:
    """The requests of a stream, parsed; a broken one raises ``Unparsable`` to whoever reads
    (the servicer may read in a task of its own: the handler's task aborts the call, never that
    task, since aborting from another task while a response is being written hangs the call)."""

    async def parsed() -> AsyncIterator[Any]:
        async for raw in requests:
            yield _parse(deserializer, raw, method)

    return parsed()


def strict(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with its request parsing moved into the call (see the module docstring)."""
    parse = handler.request_deserializer
    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                request = _parse(parse, raw, method)
            except Unparsable as err:
                await _abort(context, err)
            return await _result(inner_uu(request, context))

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, serialize)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator:
            try:
                request = _parse(parse, raw, method)
            except Unparsable as err:
                await _abort(context, err)
            async with contextlib.aclosing(_responses(inner_us(request, context))) as messages:
                async for message in messages:
                    yield message

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, serialize)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(raws: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await _result(inner_su(_parsed_stream(raws, parse, method), context))
            except Unparsable as err:
                await _abort(context, err)

        return grpc.stream_unary_rpc_method_handler(stream_unary, None, serialize)
    inner_ss = handler.stream_stream

    async def stream_stream(raws: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
        requests = _parsed_stream(raws, parse, method)
        try:
            async with contextlib.aclosing(_responses(inner_ss(requests, context))) as messages:
                async for message in messages:
                    yield message
        except Unparsable as err:
            await _abort(context, err)

    return grpc.stream_stream_rpc_method_handler(stream_stream, None, serialize)


class StrictParsing(grpc.aio.ServerInterceptor):
    """Server interceptor: unparsable requests end with INVALID_ARGUMENT and a message."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return strict(handler, handler_call_details.method)
