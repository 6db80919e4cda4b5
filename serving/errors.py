"""Transport-neutral serving errors; the servicers map them to gRPC status codes.

Raise these anywhere below the servicer (schedulers, batchers, preprocessing) with a message that
says what to fix. The servicer aborts the call with ``error.code`` and ``str(error)``; anything
that is not a ``ServingError`` is reported as INTERNAL.
"""

from __future__ import annotations

from typing import ClassVar

import grpc


class ServingError(Exception):
    """Base of every error a client may see; ``code`` is the gRPC status it maps to."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class InvalidArgument(ServingError):
    """The request is malformed or a field is out of its allowed range."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServingError):
    """Unknown model, version or label."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServingError):
    """A name that must be unique is taken (a shared memory region's)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServingError):
    """The server is not set up for the call (a feature switched off); the message says how."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(ServingError):
    """A queue or capacity limit is reached, or the input exceeds a size limit."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class TooLarge(ResourceExhausted):
    """The input exceeds a size limit (too long a text, too many texts, too big an image): the
    same request fails again, unlike a full queue (HTTP answers it 400 on the OpenAI routes,
    whose clients retry a 429)."""


class OutOfRange(ServingError):
    """A value lies past a model's range (e.g. more tokens than its position table)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class DeadlineExceeded(ServingError):
    """The request was not served before its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServingError):
    """The client cancelled the request."""

    code = grpc.StatusCode.CANCELLED


class Unavailable(ServingError):
    """The server or component is not started, stopping or draining; retry elsewhere."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServingError):
    """The request carries no valid credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class Internal(ServingError):
    """A bug or backend failure; the message names the component and the cause."""

    code = grpc.StatusCode.INTERNAL


def status_code(error: BaseException) -> grpc.StatusCode:
    """The gRPC status for ``error``: its own code for a ``ServingError``, else INTERNAL.

    Args:
        error: any exception raised while serving a request.

    Returns:
        The status code to abort the call with (its ``.name`` is the metrics ``code`` label).
    """
    return error.code if isinstance(error, ServingError) else grpc.StatusCode.INTERNAL
