"""The error every part of ``export.tensorrt`` raises when a graph, config or profile is refused."""

from __future__ import annotations

from export.errors import ExportError


class TensorRTError(ExportError):
    """A graph, config or profile that TensorRT cannot build as asked; the message says why."""
