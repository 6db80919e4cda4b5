"""Typed configuration from YAML / dict data, with errors that name the bad field.

Used for the model repository's config.yaml and the server's config file. Dataclasses describe
the schema (defaults and a comment on every field); ``from_mapping`` builds them, recursing into
nested dataclasses, and rejects unknown fields and values of the wrong type.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class SchemaError(ValueError):
    """A configuration value that cannot be used; the message names the field path."""


def from_mapping(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from ``data`` (a mapping).

    Raises:
        SchemaError: naming the field (``batching.max_queue_size``) and what it should be.
    """
    where = path or cls.__name__
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise SchemaError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(fields)}"
        )
    values = {}
    for name, value in data.items():
        values[name] = _convert(hints[name], value, f"{path}.{name}" if path else name)
    missing = [
        n
        for n, f in fields.items()
        if n not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SchemaError(f"{where}: missing required field(s) {', '.join(missing)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise SchemaError(f"{where}: {err}") from err


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(option, value, path)
            except SchemaError as err:
                errors.append(str(err))
        raise SchemaError(errors[0])
    if origin is typing.Literal:
        if value not in args:
            raise SchemaError(f"{path}: must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, path)  # type: ignore[arg-type]
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{path}: must be a list, got {value!r}")
        item = args[0] if args else Any
        converted = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(converted) if origin is tuple else converted
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: must be a mapping, got {value!r}")
        return {str(k): _convert(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{path}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{path}: must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SchemaError(f"{path}: must be a string, got {value!r}")
        return value
    return value


def to_mapping(obj: Any) -> Any:
    """A dataclass tree as plain dicts / lists (for YAML and JSON)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj


def load_yaml(cls: type[T], path: str | Path) -> T:
    """Read a YAML file into dataclass ``cls``.

    Raises:
        SchemaError: missing file, invalid YAML, or a bad field (named with the file).
    """
    return read_yaml(path, lambda data: from_mapping(cls, data))


def read_yaml(path: str | Path, build: Callable[[Any], T]) -> T:
    """Read a YAML file and ``build`` an object from its data; errors name the file.

    Raises:
        SchemaError: missing file, invalid YAML, or what ``build`` raises (prefixed by the path).
    """
    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SchemaError(f"{path}: invalid YAML ({err})") from err
    try:
        return build(data)
    except SchemaError as err:
        raise SchemaError(f"{path}: {err}") from err


def dump_yaml(obj: Any, path: str | Path) -> None:
    """Write a dataclass tree as YAML (keys in field order)."""
    Path(path).write_text(yaml.safe_dump(to_mapping(obj), sort_keys=False))
