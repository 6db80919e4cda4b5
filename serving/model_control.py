"""Model control (Triton's ``--model-control-mode explicit``): load, reload and unload models
while the server runs.

- One process: ``LocalModelControl`` loads the entry here (graphs, engine or batcher) and swaps
  it in once it runs; a reload's old version, and an unloaded model, then finish their running
  requests (at most the grace period) before they stop, and their memory is released
  (``serving.gc_policy.release``: a model of the frozen start-up heap is collected too).
- Several processes: a frontend's ``RemoteModelControl`` asks the engine process, which does the
  same with the graphs, tells every frontend to load the entry's config and tokenizer (or to drop
  the model) and answers once all of them have (``serving.multiprocess.engine_server``), so a
  client that got its answer finds the change on every frontend.

Loads and unloads run one at a time (``ModelRepository.control``); inference never waits for
them: a model keeps serving while its new version loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from serving.errors import Internal, NotFound
from serving.gc_policy import release
from serving.repository import REMOVED, UNLOADED, ModelRepository

log = logging.getLogger(__name__)


class ModelControl(Protocol):
    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


# tells the other processes of a change (op "load" | "unload" | "remove": an unload because the
# entry left the repository folder; the model's name) and waits until they have applied it; the
# errors they reported
Announce = Callable[[str, str], Awaitable[list[str]]]


async def _nobody(op: str, name: str) -> list[str]:
    return []


class LocalModelControl:
    """Model control where the graphs are (``grace``: seconds a stopped model's running
    requests get): a one-process server's, and the engine process's, whose ``announce`` has
    every frontend apply the change before a replaced or unloaded model stops.

    A change runs to its end even when the client that asked for it goes away (its call's
    deadline, a cancel): stopping halfway would leave a replaced model running.
    """

    def __init__(
        self, repository: ModelRepository, grace: float, announce: Announce = _nobody
    ) -> None:
        self.repository = repository
        self.grace = grace
        self.announce = announce

    async def load(self, name: str) -> None:
        """Load or reload ``name``; returns once it serves and the version it replaced has
        stopped (see ``ModelRepository.load_model`` for the errors)."""
        await _to_the_end(self._load(name))

    async def unload(self, name: str, removed: bool = False) -> None:
        """Stop serving ``name``; returns once it has stopped (``ModelRepository.withdraw``).
        ``removed``: because its entry left the repository folder (model polling), which is
        the reason NOT_FOUND then gives."""
        await _to_the_end(self._unload(name, removed))

    async def _load(self, name: str) -> None:
        async with self.repository.control:
            old = await self.repository.load_model(name)
            errors = await self.announce("load", name)
            if old:
                await asyncio.gather(*(model.stop(self.grace) for model in old))
                del old
                release()
        _raise_for(errors, "load", name)

    async def _unload(self, name: str, removed: bool) -> None:
        async with self.repository.control:
            self.repository.get(name)  # NotFound where it is not served
            # the other processes stop sending requests for it first: those they sent before
            # reach it here
            op = "remove" if removed else "unload"
            errors = await self.announce(op, name)
            models = self.repository.withdraw(name, REMOVED if removed else UNLOADED)
            await asyncio.gather(*(model.stop(self.grace) for model in models))
            del models
            release()
        _raise_for(errors, "unload", name)


def _raise_for(errors: list[str], op: str, name: str) -> None:
    if errors:
        raise Internal(f"{op} of {name!r}: frontend processes failed: {'; '.join(errors)}")


async def _to_the_end(change: Coroutine[Any, Any, None]) -> None:
    """Run ``change`` in a task of its own that the caller's cancellation does not stop (its
    outcome is then only logged)."""
    task = asyncio.ensure_future(change)
    task.add_done_callback(_log_failure)
    await asyncio.shield(task)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.info("model control: %s", error)


class RemoteModelControl:
    """Model control of a frontend process: the engine process does it (``client``: the
    frontend's ``EngineClient``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def load(self, name: str) -> None:
        await self._ask("load", name)

    async def unload(self, name: str) -> None:
        await self._ask("unload", name)

    async def _ask(self, op: str, name: str) -> None:
        """Raises what the engine process answered (NotFound, FailedPrecondition, ...)."""
        await self.client.ask({"t": op, "model": name})


def frontend_changes(repository: ModelRepository) -> Callable[[str, str], Awaitable[None]]:
    """How a frontend applies the engine process's model change (``op`` "load" | "unload" |
    "remove", the model's name) to its own models: the entry's config and tokenizer loaded (the
    graphs stay in the engine process), or the model dropped."""

    async def apply(op: str, name: str) -> None:
        async with repository.control:
            if op == "load":
                await repository.load_model(name)
            else:
                with contextlib.suppress(NotFound):  # not served here: nothing to drop
                    repository.withdraw(name, REMOVED if op == "remove" else UNLOADED)
        release()

    return apply
