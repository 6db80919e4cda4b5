"""Changing the trace settings while the server runs (KServe ``TraceSetting``), in one process or
in every frontend process of a multi-process server.

In one process the change is made to its ``Tracer``. With several frontend processes, the one
that took the call checks the change against its own tracer, then the engine process has every
frontend apply it (``trace`` message, ``model`` item with op ``trace``; see
``serving.multiprocess.protocol``) and answers once all have: each frontend samples requests and
writes traces on its own, with the same settings. (``serving.log_settings.LogChanges`` does the
same for the log settings.)
"""

from __future__ import annotations

from typing import Any

from serving.tracing import Changes, Tracer


class TraceChanges:
    """How ``TraceSetting`` changes the settings of ``tracer`` (this process's): here, or with
    ``client`` (a frontend's ``EngineClient``, whose ``on_settings["trace"]`` applies it here),
    in every frontend through the engine process."""

    def __init__(self, tracer: Tracer, client: Any = None) -> None:
        self.tracer = tracer
        self.client = client

    async def update(self, model: str, changes: Changes) -> None:
        """Raises InvalidArgument (nothing changed anywhere), or what the engine answered."""
        if self.client is None:
            self.tracer.update(model, changes)
            return
        self.tracer.check(model, changes)
        await self.client.ask({"t": "trace", "model": model, "settings": changes})
