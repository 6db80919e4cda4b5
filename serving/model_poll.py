"""Model polling (Triton's ``--model-control-mode poll``): the server looks at its repository
folder every ``repository_poll_secs`` and follows it.

- An entry that appears (a folder with a ``config.yaml``) is loaded; an entry whose files
  changed (``config.yaml``, a new version folder, a re-export: any file's size, modification
  time or inode) is reloaded; a served entry whose folder (or ``config.yaml``) is gone is
  unloaded. With ``--models`` only those entries are watched.
- A change is acted on once the entry looks the same at two looks in a row: files being
  written or copied are not loaded half-way, and a ``config.yaml`` deleted and written again
  (as some editors and tools save) does not unload the model in between. A change is served
  one to two intervals after it is made, plus the load.
- Changes go through model control (``serving.model_control.LocalModelControl``): a reload swaps
  the new version in once it runs, the old one's requests finish on it, and with several
  frontend processes the poller runs in the engine process, which has every frontend apply the
  change.
- An entry that cannot be loaded is logged (WARNING, with the cause) and listed by
  RepositoryIndex with ``load failed: ...``; a served model keeps serving the version it had.
  It is tried again when its files change again, not at every look (an export being written
  fails, then loads once its files stop changing).
- The RPCs ``RepositoryModelLoad`` / ``RepositoryModelUnload`` answer FAILED_PRECONDITION, as
  Triton's do in poll mode: the folder decides what is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from contract.repository import Fingerprint, fingerprint
from serving.errors import FailedPrecondition, ServingError
from serving.model_control import LocalModelControl
from serving.repository import ModelRepository, model_entries

log = logging.getLogger(__name__)

# an entry of the folder a polling server does not serve (yet), as far as its frontends know
NOT_YET = (
    "not loaded yet: new in the repository folder, or its load failed (the server's log says "
    "why); the server loads it once its files stay the same for a look"
)


def watch(repository: ModelRepository, interval: float) -> None:
    """What a polling server's NOT_FOUND and RepositoryIndex say of models it does not serve."""
    repository.load_hint = poll_hint(interval)
    repository.unserved_reason = NOT_YET


def poll_hint(interval: float) -> str:
    """How a model that is not served gets served on a polling server (NOT_FOUND says it)."""
    return (
        "this server loads the repository folder's entries as they appear (model control mode "
        f"poll, every {interval:g} s): put the entry into the folder"
    )


class RepositoryPoller:
    """Follows the repository folder of ``control``'s repository every ``interval`` seconds
    (``start`` / ``stop``; ``look`` once); ``names``: the entries to watch (empty: all)."""

    def __init__(
        self, control: LocalModelControl, interval: float, names: tuple[str, ...] = ()
    ) -> None:
        self.control = control
        self.repository: ModelRepository = control.repository
        self.interval = interval
        self.names = frozenset(names)
        watch(self.repository, interval)
        # what each entry was when it was last loaded or tried (a failed one is not tried
        # again until it changes)
        self._seen: dict[str, Fingerprint] = {
            name: fingerprint(self._root / name) for name in self.repository.names()
        }
        # what each watched entry looked like at the last look (None: not there)
        self._last: dict[str, Fingerprint | None] = dict(self._seen)
        self._task: asyncio.Task[None] | None = None

    @property
    def _root(self) -> Path:
        assert self.repository.root is not None, "model polling needs a repository folder"
        return self.repository.root

    def changes(self, served: set[str]) -> list[tuple[str, str, Fingerprint | None]]:
        """What the folder asks for now: ("load", name, its fingerprint) for each new or changed
        entry, ("unload", name, None) for each ``served`` model whose entry is gone; each only
        once it looked the same at the last look too."""
        try:
            now: dict[str, Fingerprint | None] = {
                path.name: fingerprint(path)
                for path in model_entries(self._root)
                if not self.names or path.name in self.names
            }
        except OSError as err:  # the folder itself is gone or unreadable: change nothing
            log.warning(
                "model polling: cannot read %s (%s); serving what is loaded", self._root, err
            )
            return []
        for name in served - set(now):
            now[name] = None
        settled = {name: state for name, state in now.items() if self._last.get(name) == state}
        self._last = now
        found: list[tuple[str, str, Fingerprint | None]] = [
            ("load", name, state)
            for name, state in sorted(settled.items())
            if state is not None and self._seen.get(name) != state
        ]
        found += [
            ("unload", name, None)
            for name, state in sorted(settled.items())
            if state is None and name in served
        ]
        return found

    async def look(self) -> list[tuple[str, str]]:
        """Apply what the folder asks for now; the changes made (op, name), failed ones too."""
        made = []
        served = set(self.repository.names())  # read on the loop
        for op, name, print_ in await asyncio.to_thread(self.changes, served):
            try:
                if op == "load":
                    self._seen[name] = print_  # type: ignore[assignment]
                    await self.control.load(name)
                else:
                    self._seen.pop(name, None)
                    await self.control.unload(name, removed=True)
                log.info("model polling: %sed %s", op, name)
            except ServingError as err:
                log.warning("model polling: cannot %s %s: %s", op, name, err)
            made.append((op, name))
        return made

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="model-polling")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.look()
            except Exception:  # never stop polling over one look
                log.exception("model polling: a look at %s failed", self._root)

    async def stop(self) -> None:
        """Stop looking; returns once a change under way has ended."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self.repository.control:  # a load or unload under way runs to its end
            pass


class PolledModelControl:
    """What the model control RPCs get on a polling server: FAILED_PRECONDITION."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    async def load(self, name: str) -> None:
        raise self._refusal()

    async def unload(self, name: str) -> None:
        raise self._refusal()

    def _refusal(self) -> FailedPrecondition:
        return FailedPrecondition(
            "explicit model load and unload are not allowed in model control mode poll: this "
            f"server follows its repository folder (every {self.interval:g} s); change the "
            "folder, or start the server with --model-control-mode explicit"
        )
