"""JSON (de)serialisation of the frozen model configs, with errors that name the bad field."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C")

CONFIG_FILE = "config.json"
# The model kinds of this package: one module each (translator.py, vit.py, captioner.py).
MODEL_KINDS: tuple[str, ...] = ("translator", "vit", "captioner")


class ConfigError(ValueError):
    """A model config that cannot be used; the message says which field and what to do."""


def pick_preset(presets: Mapping[str, C], kind: str, name: str, **overrides: Any) -> C:
    """A named preset of ``presets``, optionally with some fields replaced.

    Raises:
        ValueError: for an unknown preset name, listing the known ones.
    """
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; known: {', '.join(presets)}")
    return dataclasses.replace(presets[name], **overrides)  # type: ignore[type-var]


def config_to_dict(config: Any, kind: str) -> dict[str, Any]:
    """The config as a JSON-ready dict, tagged with its model ``kind``."""
    return {"kind": kind, **dataclasses.asdict(config)}


def config_from_dict(cls: type[C], data: dict[str, Any], source: str = "config") -> C:
    """Build a ``cls`` config from ``data``, checking field names and value types.

    Raises:
        ConfigError: on unknown fields or values of the wrong type.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k != "kind"}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; "
            f"expected some of: {', '.join(fields)}"
        )
    for name, value in values.items():
        expected = fields[name].type
        expected_name = expected if isinstance(expected, str) else expected.__name__
        if not _matches(value, expected_name):
            raise ConfigError(f"{source}: field {name!r} must be {expected_name}, got {value!r}")
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {err}") from err


def _matches(value: Any, type_name: str) -> bool:
    checks = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
    }
    base = type_name.split("[")[0]
    if base in ("tuple", "list"):
        return isinstance(value, list | tuple)
    check = checks.get(base)
    return check(value) if check else True


def read_config_json(directory: Path) -> dict[str, Any]:
    """Read DIR/config.json.

    Raises:
        ConfigError: when the file is missing or not a JSON object.
    """
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"no {CONFIG_FILE} in {directory}: is this a checkpoint directory?")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); re-create the checkpoint") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
