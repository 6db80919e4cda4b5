"""The TensorRT flavour names that export (which builds engines) and serving (which loads them)
share: the environment variable, the choices, and reading what was asked for.

Engines load only in the library that built them: ``tensorrt`` (full TensorRT) or ``rtx``
(TensorRT-RTX); ``auto`` lets each side decide (export: what imports; serving: what the version's
manifest records).
"""

from __future__ import annotations

import os

FLAVOUR_ENV = "ATTNSERVE_TENSORRT_FLAVOUR"  # auto | tensorrt | rtx
FLAVOUR_CHOICES = ("auto", "tensorrt", "rtx")
# Compute capabilities TensorRT-RTX 1.7's runtime runs engines on (builds work anywhere).
RTX_RUNS_ON = ((8, 0), (8, 6), (8, 9), (12, 0), (12, 1))


def requested_flavour(requested: str | None = None, where: str = "argument") -> str:
    """The flavour asked for: ``requested``, else ``ATTNSERVE_TENSORRT_FLAVOUR``, else "auto".

    Args:
        requested: "auto", "tensorrt", "rtx" or None.
        where: how the caller takes ``requested`` (named in the error).

    Returns:
        one of FLAVOUR_CHOICES.

    Raises:
        ValueError: an unknown name (the message lists the choices).
    """
    name = (requested or os.environ.get(FLAVOUR_ENV) or "auto").strip().lower()
    if name not in FLAVOUR_CHOICES:
        raise ValueError(
            f"unknown TensorRT flavour {name!r} ({where} or {FLAVOUR_ENV}); choose one of "
            f"{', '.join(FLAVOUR_CHOICES)}"
        )
    return name
