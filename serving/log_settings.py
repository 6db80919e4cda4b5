"""The server's log settings as Triton's logging extension has them (KServe ``LogSettings``),
changed while the server runs.

- ``log_info``, ``log_warning``, ``log_error`` (bool): whether records of that level are
  written; ``log_verbose_level`` (uint32): above 0, DEBUG records are written too;
- ``log_format``: ``default`` (Python's local times, ``2026-11-29 01:00:00,123``) or ``ISO8601``
  (UTC, ``2026-11-29T01:00:00Z``);
- ``log_file`` is read-only (""): the server logs to stderr, and no client picks where the
  server writes (as Triton's since 2024).

``serve --log-level`` sets the start: INFO is info, warning and error on; DEBUG adds verbose
level 1; WARNING leaves info off; ERROR leaves warning off too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from serving.errors import InvalidArgument

FORMATS = {"default": (None, time.localtime), "ISO8601": ("%Y-%m-%dT%H:%M:%SZ", time.gmtime)}
TYPES: dict[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}
PARAMETERS = {str: "string_param", bool: "bool_param", int: "uint32_param"}


@dataclass(frozen=True)
class LogSettings:
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def for_level(cls, level: str) -> LogSettings:
        """The settings ``--log-level`` stands for (a level name: DEBUG, INFO, ...)."""
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}: use DEBUG, INFO, WARNING or ERROR")
        return cls(
            log_info=number <= logging.INFO,
            log_warning=number <= logging.WARNING,
            log_error=number <= logging.ERROR,
            log_verbose_level=int(number <= logging.DEBUG),
        )

    def passes(self, level: int) -> bool:
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def values(self) -> dict[str, Any]:
        """Every setting as ``LogSettings`` answers it."""
        return {"log_file": "", **asdict(self)}


def parse_log_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Checked changes: each a known, writable setting with a value of its type.

    Raises:
        InvalidArgument: what is wrong, and what the setting takes.
    """
    parsed = {}
    for name, value in changes.items():
        kind = TYPES.get(name)
        if kind is None:
            raise InvalidArgument(f"unknown log setting {name!r}: use one of {', '.join(TYPES)}")
        if name == "log_file":
            raise InvalidArgument(
                "log_file cannot be set: the server logs to stderr, and LogSettings does not "
                "let a client choose where the server writes; leave it out"
            )
        if type(value) is not kind:  # a bool is no uint32, nor the other way round
            raise InvalidArgument(
                f"{name} takes a {PARAMETERS[kind]}, got {value!r}: send it as {PARAMETERS[kind]}"
            )
        if name == "log_format" and value not in FORMATS:
            raise InvalidArgument(f"log_format must be one of {', '.join(FORMATS)}, got {value!r}")
        parsed[name] = value
    return parsed


class LogControl(logging.Filter):
    """A process's log settings, applied to its logging: the root logger's level, this filter
    on ``handlers`` (the levels written) and their formatters' times.

    Args:
        settings: the start (``LogSettings.for_level(config.log_level)``).
        handlers: the handlers it owns (``attnserve serve``'s); none: the settings are kept and
            answered, and the process's logging is left alone (a server inside a test).
    """

    def __init__(self, settings: LogSettings, handlers: Sequence[logging.Handler] = ()) -> None:
        super().__init__()
        self.settings = settings
        self.handlers = list(handlers)
        self._formats = {id(h): getattr(h.formatter, "_fmt", None) for h in self.handlers}
        self.apply()

    @classmethod
    def of_process(cls, level: str) -> LogControl:
        """``attnserve serve``'s (each of its processes'): from ``--log-level``, over the
        handlers ``logging.basicConfig`` gave the process."""
        return cls(LogSettings.for_level(level), logging.getLogger().handlers)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.settings.passes(record.levelno)

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply checked changes (``parse_log_changes``)."""
        self.settings = replace(self.settings, **changes)
        self.apply()

    def apply(self) -> None:
        if not self.handlers:
            return
        logging.getLogger().setLevel(
            logging.DEBUG if self.settings.log_verbose_level else logging.INFO
        )
        datefmt, converter = FORMATS[self.settings.log_format]
        for handler in self.handlers:
            if self not in handler.filters:
                handler.addFilter(self)
            formatter = logging.Formatter(self._formats[id(handler)], datefmt)
            formatter.converter = converter  # type: ignore[method-assign]
            handler.setFormatter(formatter)


class LogChanges:
    """How ``LogSettings`` changes the settings: here (one process), or, with ``client`` (a
    frontend's ``EngineClient``), in the engine process and then in every frontend, which
    answers once all have them (the path of ``serving.trace_control``)."""

    def __init__(self, control: LogControl, client: Any = None) -> None:
        self.control = control
        self.client = client

    async def update(self, changes: Mapping[str, Any]) -> None:
        if self.client is None:
            self.control.update(changes)
        else:
            await self.client.ask({"t": "log", "model": "", "settings": dict(changes)})
