"""Request traces in the format of Triton's trace extension: timestamps of sampled inference
requests, written as JSON that Triton's tools read.

Settings (server-wide, and a model's own on top; the KServe ``TraceSetting`` RPC reads and
changes both while the server runs, ``serve --trace-*`` sets the server's at start):

- ``trace_level``: ``OFF`` or ``TIMESTAMPS`` (Triton's ``TENSORS`` is refused);
- ``trace_rate``: trace one inference request in this many (1: every one);
- ``trace_count``: traces left to take (-1: no limit); once 0, what was collected is written;
- ``trace_file``: where to write (its folder must exist);
- ``log_frequency``: write ``<trace_file>.<n>`` every this many traces (n = 0, 1, ...); 0: one
  file, ``<trace_file>``, its traces appended every ``APPEND_EVERY`` traces and when tracing
  stops, the settings change or the server does (a JSON array after every write).

A traced request's timestamps, in nanoseconds of the monotonic clock (Triton's steady clock;
one clock for every process of a machine):

- ``REQUEST_START``: the handler took the call (gRPC has read the request);
- ``QUEUE_START``: the request entered its model's queue (a classifier's batcher, a generator's
  admission queue);
- ``COMPUTE_START``: its batch started (a generator: it was admitted, its encoder pass started);
- ``COMPUTE_END``: its batch ended (a generator: its last decode step);
- ``REQUEST_END``: the handler answered (a stream: after its last message).

A request of several sequences (a Translate call with several texts) has its first queue start,
its first compute start and its last compute end. gRPC's own read and send times
(``GRPC_WAITREAD_*``, ``GRPC_SEND_*``) are not visible to a grpc.aio handler and are left out.

The file is a JSON array: for each trace ``{"id", "model_name", "model_version"}`` (and
``"request_id"`` when the request had one), then one ``{"id", "timestamps": [{"name", "ns"}]}``
per timestamp, in time order.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from serving.errors import InvalidArgument

log = logging.getLogger(__name__)

OFF, TIMESTAMPS = "OFF", "TIMESTAMPS"
LEVELS = (OFF, TIMESTAMPS)
NS = 1_000_000_000


@dataclass(frozen=True)
class TraceSettings:
    """One scope's trace settings (the names are Triton's, as ``TraceSetting`` reads them)."""

    trace_level: str = OFF
    trace_rate: int = 1000
    trace_count: int = -1
    trace_file: str = ""
    log_frequency: int = 0

    def strings(self, remaining: int | None = None) -> dict[str, list[str]]:
        """The settings as ``TraceSetting`` answers them (``remaining``: the traces left to
        take, reported as ``trace_count``, as Triton does)."""
        count = self.trace_count if remaining is None else remaining
        return {
            "trace_level": [self.trace_level],
            "trace_rate": [str(self.trace_rate)],
            "trace_count": [str(count)],
            "trace_file": [self.trace_file],
            "log_frequency": [str(self.log_frequency)],
        }


NAMES = tuple(f.name for f in fields(TraceSettings))
_MINIMUM = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}


def parse_setting(name: str, values: Sequence[str]) -> str | int:
    """A setting's value from its strings (a ``TraceSetting`` value, a ``serve`` flag).

    Raises:
        InvalidArgument: an unknown name, or a value that is not one the setting takes.
    """
    if name not in NAMES:
        raise InvalidArgument(f"unknown trace setting {name!r}: use one of {', '.join(NAMES)}")
    if name == "trace_level":
        levels = {v.upper() for v in values}
        if "TENSORS" in levels:
            raise InvalidArgument("trace_level TENSORS is not supported: use TIMESTAMPS or OFF")
        if len(levels) != 1 or not levels <= set(LEVELS):
            raise InvalidArgument(
                f"trace_level must be one of {', '.join(LEVELS)}, got {list(values)}"
            )
        return levels.pop()
    if len(values) != 1:
        raise InvalidArgument(f"{name} takes one value: send one, not {list(values)}")
    if name == "trace_file":
        return values[0]
    try:
        number = int(values[0])
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {values[0]!r}") from None
    if number < _MINIMUM[name]:
        raise InvalidArgument(f"{name} must be >= {_MINIMUM[name]}, got {number}")
    return number


def check_settings(settings: TraceSettings, scope: str = "the server") -> None:
    """Raise InvalidArgument unless ``settings`` can trace: an active level needs a file in a
    folder that exists."""
    parse_setting("trace_level", [settings.trace_level])
    for name in _MINIMUM:
        parse_setting(name, [str(getattr(settings, name))])
    if settings.trace_level == OFF:
        return
    if not settings.trace_file:
        raise InvalidArgument(
            f"trace_level {settings.trace_level} for {scope} needs a trace_file to write to: "
            "start the server with --trace-file FILE"
        )
    folder = Path(settings.trace_file).parent
    if not folder.is_dir():
        raise InvalidArgument(
            f"trace_file {settings.trace_file!r}: folder {folder} does not exist; create it or "
            "pick another file"
        )


@dataclass
class Trace:
    """One sampled request's timestamps (nanoseconds by name); stamps after it ended are
    ignored."""

    id: int
    model: str
    version: int
    writer: TraceWriter
    scope: _Scope
    request_id: str = ""
    ended: bool = False
    stamps: dict[str, int] = field(default_factory=dict)

    def stamp(self, name: str, ns: int) -> None:
        if not self.ended:
            self.stamps[name] = ns

    def span(self, queued: float, started: float, ended: float) -> None:
        """The queue and compute of one of the request's sequences or images (monotonic
        seconds): the first queue and compute starts, the last compute end."""
        if self.ended:
            return
        stamps = self.stamps
        for name, seconds, first in (
            ("QUEUE_START", queued, True),
            ("COMPUTE_START", started, True),
            ("COMPUTE_END", ended, False),
        ):
            ns = int(seconds * NS)
            held = stamps.get(name)
            if held is None or (ns < held if first else ns > held):
                stamps[name] = ns

    def records(self) -> list[dict[str, Any]]:
        """The trace as Triton writes it: its header, then each timestamp in time order."""
        header: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model,
            "model_version": self.version,
        }
        if self.request_id:
            header["request_id"] = self.request_id
        ordered = sorted(self.stamps.items(), key=lambda item: item[1])
        return [header] + [
            {"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in ordered
        ]


APPEND_EVERY = 1000  # log_frequency 0: traces held in memory before they go to the file


class TraceWriter:
    """The traces bound for one file: every ``log_frequency`` traces to ``<path>.<n>``, or
    (``log_frequency`` 0) appended to ``<path>`` every ``APPEND_EVERY`` traces and at each
    ``flush``; the file is a whole JSON array after every write."""

    def __init__(self, path: str, log_frequency: int) -> None:
        self.path = path
        self.log_frequency = log_frequency
        self.index = 0  # the next <path>.<n>
        self._pending: list[dict[str, Any]] = []  # records not yet in a file
        self._traces = 0  # traces in _pending
        self._started = False  # <path> holds this writer's array (log_frequency 0)

    def add(self, trace: Trace) -> None:
        self._pending.extend(trace.records())
        self._traces += 1
        if self._traces >= (self.log_frequency or APPEND_EVERY):
            self.flush()

    def flush(self) -> None:
        """Write what was collected (nothing new: nothing written). A failure is logged and the
        records dropped: tracing never fails a request."""
        if not self._traces:
            return
        records, self._pending, self._traces = self._pending, [], 0
        try:
            if self.log_frequency:
                self.index += 1
                self._replace(f"{self.path}.{self.index - 1}", json.dumps(records))
            elif self._started and os.path.isfile(self.path):
                with open(self.path, "r+b") as out:  # over the array's closing bracket
                    out.seek(-1, os.SEEK_END)
                    out.write(b"," + json.dumps(records)[1:].encode())
            else:
                self._replace(self.path, json.dumps(records))
                self._started = True
        except OSError as err:
            log.error("cannot write the request traces to %s: %s", self.path, err)

    @staticmethod
    def _replace(path: str, text: str) -> None:
        """Write ``path`` whole (a reader never sees half a file)."""
        partial = f"{path}.partial"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(text)  # one C-encoded string (json.dump: 3x slower)
        os.replace(partial, path)


class _Scope:
    """Settings and sampling state of the server or of one model with settings of its own."""

    def __init__(self, settings: TraceSettings) -> None:
        self.settings = settings
        self.seen = 0  # requests since the last one traced
        self.remaining = settings.trace_count

    def set(self, settings: TraceSettings, *, count_given: bool) -> None:
        if count_given or settings.trace_count != self.settings.trace_count:
            self.remaining = settings.trace_count
        if settings.trace_rate != self.settings.trace_rate:
            self.seen = 0
        self.settings = settings

    @property
    def active(self) -> bool:
        return self.settings.trace_level != OFF and self.remaining != 0


Changes = Mapping[str, str | int | None]  # parsed settings; None: cleared


class Tracer:
    """The trace settings of the server and its models, which requests to trace, and the files.

    Runs on the event loop of its process (no locks). ``enabled`` is what the request path
    checks first: False while no scope traces, so that tracing off costs one attribute read.

    Args:
        settings: the server's settings at start (also what a cleared server setting returns to).
        suffix: appended to every file name: a frontend process's own (``.frontend<i>``) where
            several write traces.
    """

    def __init__(self, settings: TraceSettings | None = None, suffix: str = "") -> None:
        self.initial = settings or TraceSettings()
        check_settings(self.initial)
        self.suffix = suffix
        self._server = _Scope(self.initial)
        self._own: dict[str, dict[str, Any]] = {}  # model -> the settings it set itself
        self._models: dict[str, _Scope] = {}
        self._writers: dict[str, TraceWriter] = {}
        self._ids = itertools.count(1)
        self.enabled = self._server.active

    # --- settings -------------------------------------------------------------------------------
    def settings(self, model: str = "") -> dict[str, list[str]]:
        """What ``TraceSetting`` answers: the model's settings (its own over the server's), or
        the server's."""
        scope = self._models.get(model, self._server) if model else self._server
        return scope.settings.strings(scope.remaining)

    def check(self, model: str, changes: Changes) -> None:
        """Raise InvalidArgument if ``changes`` to the server's (``model`` "") or a model's
        settings would leave a scope unable to trace."""
        self._apply(model, changes, dry_run=True)

    def update(self, model: str, changes: Changes) -> None:
        """Change the server's (``model`` "") or a model's settings: a value sets it, None
        clears it (a model's follows the server's again; the server's returns to its start-up
        value). What was collected so far is written first.

        Raises:
            InvalidArgument: as ``check`` (nothing is changed).
        """
        self._apply(model, changes, dry_run=False)

    def _apply(self, model: str, changes: Changes, *, dry_run: bool) -> None:
        server = self._server.settings
        own: dict[str, dict[str, Any]] = {n: dict(v) for n, v in self._own.items()}
        if model:
            mine = own.setdefault(model, {})
            for name, value in changes.items():
                if value is None:
                    mine.pop(name, None)
                else:
                    mine[name] = value
            if not mine:
                del own[model]
        else:
            given: dict[str, Any] = {
                n: getattr(self.initial, n) if v is None else v for n, v in changes.items()
            }
            server = replace(server, **given)
        check_settings(server)
        scopes = {name: replace(server, **values) for name, values in own.items()}
        for name, settings in scopes.items():
            check_settings(settings, f"model {name!r}")
        if dry_run or not changes:
            return
        self.flush()
        self._server.set(server, count_given=not model and "trace_count" in changes)
        self._own = own
        for name, settings in scopes.items():
            scope = self._models.get(name)
            if scope is None:
                self._models[name] = _Scope(settings)
            else:
                scope.set(settings, count_given=name == model and "trace_count" in changes)
        for name in set(self._models) - set(scopes):
            del self._models[name]
        self._refresh()

    def _refresh(self) -> None:
        self.enabled = any(scope.active for scope in (self._server, *self._models.values()))

    # --- traces ---------------------------------------------------------------------------------
    def start(self, model: str, version: int, request_id: str = "") -> Trace | None:
        """A trace for this request of ``model`` if its scope samples it, else None."""
        scope = self._models.get(model, self._server)
        if not scope.active:
            return None
        scope.seen += 1
        if scope.seen < scope.settings.trace_rate:
            return None
        scope.seen = 0
        if scope.remaining > 0:
            scope.remaining -= 1
        writer = self._writer(scope.settings)
        return Trace(next(self._ids), model, version, writer, scope, request_id)

    def end(self, trace: Trace) -> None:
        """The request answered: its trace goes to its file (written now if its scope has
        taken its last one)."""
        trace.ended = True
        trace.writer.add(trace)
        if trace.scope.remaining == 0:
            trace.writer.flush()
            self._refresh()

    def flush(self) -> None:
        """Write what every file has collected (the server stops, the settings change)."""
        for writer in self._writers.values():
            writer.flush()

    def _writer(self, settings: TraceSettings) -> TraceWriter:
        """The file's writer (kept while the server runs: its next ``<path>.<n>`` too)."""
        path = settings.trace_file + self.suffix
        writer = self._writers.get(path)
        if writer is None:
            writer = self._writers[path] = TraceWriter(path, settings.log_frequency)
        elif writer.log_frequency != settings.log_frequency:
            writer.flush()
            writer.log_frequency = settings.log_frequency
        return writer


current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "attnserve_trace", default=None
)


def parse_changes(settings: Mapping[str, Sequence[str]]) -> dict[str, str | int | None]:
    """``TraceSetting``'s settings parsed: a value each, None where none was given (clear).

    Raises:
        InvalidArgument: as ``parse_setting``.
    """
    changes: dict[str, str | int | None] = {}
    for name, values in settings.items():
        if not len(values) and name not in NAMES:
            parse_setting(name, values)  # raises: unknown name
        changes[name] = parse_setting(name, values) if len(values) else None
    return changes
