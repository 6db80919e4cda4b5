"""Checks and readers the architecture modules share: JSON files, activations, token ids, limits.

Every refusal is a ``SourceError`` that names the architecture and the field, so that a user
learns what their model has that ours cannot express.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from export.errors import SourceError

# HF activation names (transformers' ACT2FN) whose function is exactly one of ``models.layers``.
HF_ACTIVATIONS: dict[str, str] = {"gelu": "gelu", "relu": "relu", "swish": "swish", "silu": "silu"}
DEFAULT_MAX_NEW_TOKENS = 128  # serving limit when generation_config.json names none
GENERATION_CONFIG = "generation_config.json"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a source directory.

    Args:
        path: The file.

    Returns:
        The parsed object.

    Raises:
        SourceError: when the file is missing, is not JSON, or is not a JSON object.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SourceError(f"{path.parent} has no {path.name}") from None
    except (OSError, ValueError) as err:
        raise SourceError(f"{path.name} in {path.parent} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise SourceError(f"{path.name} in {path.parent} is not a JSON object")
    return data


def generation_config(directory: Path) -> dict[str, Any]:
    """generation_config.json of ``directory``; {} when there is none (it is optional).

    Args:
        directory: The source directory.

    Returns:
        The parsed file, or {}.

    Raises:
        SourceError: when the file exists but is not a JSON object.
    """
    path = directory / GENERATION_CONFIG
    return read_json(path) if path.is_file() else {}


def unsupported(architecture: str, what: str) -> SourceError:
    """The error for a feature of ``architecture`` our model lacks (returned, for ``raise``).

    Args:
        architecture: The HF architecture name.
        what: The feature, naming its config field.

    Returns:
        "unsupported ARCHITECTURE: WHAT".
    """
    return SourceError(f"unsupported {architecture}: {what}")


def activation(architecture: str, name: Any, where: str = "activation") -> str:
    """Our activation name for a HF one.

    Args:
        architecture: The HF architecture name (for the message).
        name: The HF activation name.
        where: The config field that holds it (for the message).

    Returns:
        The ``models.layers`` activation name.

    Raises:
        SourceError: when we have no activation that computes exactly the same function.
    """
    if name not in HF_ACTIVATIONS:
        raise unsupported(
            architecture,
            f"{where} {name!r} has no exact counterpart in our layers; supported: "
            + ", ".join(sorted(HF_ACTIVATIONS)),
        )
    return HF_ACTIVATIONS[name]


def token_id(architecture: str, field: str, *candidates: Any) -> int:
    """The first candidate that is set; a one-element list counts as its element.

    Args:
        architecture: The HF architecture name (for the message).
        field: The token field, e.g. "eos_token_id" (for the message).
        candidates: Values in order of precedence; None means unset.

    Returns:
        The token id.

    Raises:
        SourceError: when the first set candidate is not one id (our models take a single id
            per role), or none is set.
    """
    for value in candidates:
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            raise unsupported(architecture, f"{field}={value!r} (need one token id)")
    raise unsupported(architecture, f"no {field} in config.json; set it")


def require_equal(
    architecture: str, what: str, first: tuple[str, Any], second: tuple[str, Any]
) -> None:
    """Two HF fields that our model has as one must agree.

    Args:
        architecture: The HF architecture name (for the message).
        what: What the fields set, e.g. "attention heads".
        first: (field name, value).
        second: (field name, value).

    Raises:
        SourceError: when the values differ; names both fields.
    """
    if first[1] != second[1]:
        raise unsupported(
            architecture,
            f"{what}: {first[0]}={first[1]!r} but {second[0]}={second[1]!r}; our model shares one",
        )


def max_new_tokens(directory: Path, max_positions: int) -> int:
    """The serving limit on new tokens: generation_config.json's, else a default.

    Args:
        directory: The source directory.
        max_positions: The decoder's position count; the limit leaves room for the start token.

    Returns:
        The limit, between 1 and ``max_positions - 1``.

    Raises:
        SourceError: when generation_config.json exists but is not a JSON object.
    """
    data = generation_config(directory)
    limit = DEFAULT_MAX_NEW_TOKENS
    if isinstance(data.get("max_new_tokens"), int):
        limit = data["max_new_tokens"]
    elif isinstance(data.get("max_length"), int):
        limit = data["max_length"] - 1  # max_length counts the start token
    return max(1, min(limit, max_positions - 1))
