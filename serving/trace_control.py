"""Changing the trace settings while the server runs (KServe ``TraceSetting``), in one process or
in every frontend process of a multi-process server.

In one process the change is made to its ``Tracer``. With several frontend processes, the one
that took the call checks the change against its own tracer, then the engine process has every
frontend apply it (``trace`` message, ``model`` item with op ``trace``; see
``serving.multiprocess.protocol``) and answers once all have: each frontend samples requests and
writes traces on its own, with the same settings.
"""

from __future__ import annotations

from typing import Any, Protocol

from serving.tracing import Changes, Tracer


class TraceControl(Protocol):
    """What the ``TraceSetting`` RPC needs: the process's tracer, and how to change it."""

    tracer: Tracer

    async def update(self, model: str, changes: Changes) -> None: ...


class LocalTraceControl:
    """A one-process server's: the change is made here."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    async def update(self, model: str, changes: Changes) -> None:
        self.tracer.update(model, changes)


class RemoteTraceControl:
    """A frontend process's: checked here, then made in every frontend through the engine
    process (``client``: the frontend's ``EngineClient``, whose ``on_trace_change`` makes it
    here)."""

    def __init__(self, tracer: Tracer, client: Any) -> None:
        self.tracer = tracer
        self.client = client

    async def update(self, model: str, changes: Changes) -> None:
        """Raises InvalidArgument (nothing changed anywhere), or what the engine answered."""
        self.tracer.check(model, changes)
        await self.client.ask({"t": "trace", "model": model, "settings": changes})
