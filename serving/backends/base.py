"""The interface every backend implements: named graphs, run with named numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np


class BackendError(RuntimeError):
    """A graph failed to load or run; the message names the graph and the cause."""


class Backend(Protocol):
    """A set of loaded graphs (``encoder``, ``decoder`` or ``model``) of one model version."""

    def graphs(self) -> list[str]:
        """Names of the loaded graphs."""
        ...

    def input_names(self, graph: str) -> list[str]: ...

    def output_names(self, graph: str) -> list[str]: ...

    def run(self, graph: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``graph`` on ``feeds``; returns every output by name.

        Raises:
            BackendError: when the runtime rejects the inputs or fails.
        """
        ...
