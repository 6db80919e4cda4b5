"""served_call counts a failed call before its status leaves the server.

``context.abort`` sends the status to the client before it returns, so a call counted after it
could be missing from /metrics when the client, holding its answer, scrapes (a clean-clone CI
run across processes saw 0 where 1 was due). The context here stands in for grpc's only at
that one point: its ``abort`` snapshots the counters the moment the status would go out.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from serving.errors import InvalidArgument, NotFound
from serving.metrics import ServingMetrics
from serving.services.common import ServerState, Servicer, served_call


class _NoModels:
    def get(self, name: str, version: str = "") -> None:
        raise NotFound(f"no model {name!r}")


class _Aborted(Exception):
    pass


class _Context:
    """What served_call uses of a grpc.aio context; ``abort`` records what /metrics says then."""

    def __init__(self, servicer: Servicer) -> None:
        self.servicer = servicer
        self.at_abort: tuple[float, int] | None = None
        self.status: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.at_abort = (count(self.servicer, code.name), self.servicer.state.active)
        self.status = (code, details)
        raise _Aborted


def count(servicer: Servicer, code: str) -> float:
    value = servicer.metrics.registry.get_sample_value(
        "attnserve_requests_total",
        {"model": "unknown", "version": "", "method": "Translate", "code": code},
    )
    return value or 0.0


async def _fail(servicer: Servicer, context: _Context, error: Exception) -> None:
    with pytest.raises(_Aborted):
        async with served_call(servicer, "Translate", "m", context):
            raise error


@pytest.mark.parametrize(
    ("error", "code"),
    [(InvalidArgument("bad text"), "INVALID_ARGUMENT"), (RuntimeError("boom"), "INTERNAL")],
)
def test_a_failed_call_is_counted_once_before_its_status_is_sent(
    error: Exception, code: str
) -> None:
    servicer = Servicer(_NoModels(), ServingMetrics(), ServerState())
    context = _Context(servicer)
    asyncio.run(_fail(servicer, context, error))
    assert context.at_abort == (1.0, 0)  # counted and no longer active when the status left
    assert context.status is not None and context.status[0].name == code
    assert count(servicer, code) == 1.0  # and not a second time on the way out
    assert servicer.state.active == 0


def test_a_call_that_succeeds_is_counted_once_and_never_aborted() -> None:
    servicer = Servicer(_NoModels(), ServingMetrics(), ServerState())
    context = _Context(servicer)

    async def succeed() -> None:
        async with served_call(servicer, "Translate", "m", context):
            assert servicer.state.active == 1

    asyncio.run(succeed())
    assert context.status is None
    assert count(servicer, "OK") == 1.0
    assert servicer.state.active == 0
