"""TensorRT backend: one deserialized engine ``{graph}.plan`` per graph of a model version.

The engines are the ones ``attnserve export ... --tensorrt`` builds (``export.tensorrt``): one
optimisation profile each, inputs named as in the ONNX graphs. Each graph runs in its own
``EngineRunner`` (``serving.backends.tensorrt_engine``: execution context, CUDA stream, device
buffers, lock); device memory, copies and streams go through NVIDIA's ``cuda-python`` runtime
bindings (``serving.backends.cuda``), never torch. Plan files, dtypes, feeds and output shapes are
plain helpers in ``serving.backends.tensorrt_io``.

The engines load in the TensorRT flavour that built them (TensorRT or TensorRT-RTX, recorded in
the version's manifest.json); ``ATTNSERVE_TENSORRT_FLAVOUR`` (auto | tensorrt | rtx) or the
``flavour`` argument pins one (``serving.backends.tensorrt_io.flavour_candidates``), and the GPU
is checked against the compute capabilities the flavour runs engines on.

Importing this module needs neither TensorRT nor cuda-python: both are imported when a
``TensorRTBackend`` is built, which raises ``BackendError`` (with what to install or configure
instead) when they are missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serving.backends.base import BackendError
from serving.backends.cuda import CudaRuntime
from serving.backends.tensorrt_engine import EngineRunner, import_runtime, tensorrt_logger
from serving.backends.tensorrt_io import (
    check_plans,
    flavour_candidates,
    onnx_type,
    recorded_flavour,
    requested_flavour,
)


class TensorRTBackend:
    """Loads ``{graph}.plan`` engines of a version folder; runs them with numpy feeds."""

    def __init__(
        self, version_dir: str | Path, graph_files: Mapping[str, str], flavour: str | None = None
    ) -> None:
        """Deserialize one engine per graph and prepare its context, stream and buffers.

        Args:
            version_dir: REPOSITORY/NAME/VERSION.
            graph_files: graph name -> ONNX file name, e.g. {"encoder": "encoder.onnx"}; each
                graph's engine is the same stem + ".plan".
            flavour: "auto", "tensorrt" or "rtx"; None: ATTNSERVE_TENSORRT_FLAVOUR, else "auto"
                (the flavour manifest.json records, else TensorRT, then TensorRT-RTX).

        Raises:
            BackendError: missing plans (with the export command that builds them), an unknown
                flavour or one other than the engines' own, TensorRT or cuda-python missing
                (with what to install or configure instead), a GPU the flavour does not run
                engines on, or an engine that does not load here.
        """
        self._runners: dict[str, EngineRunner] = {}
        self._runtime: Any = None
        plans = check_plans(version_dir, graph_files)
        candidates = flavour_candidates(requested_flavour(flavour), recorded_flavour(version_dir))
        self.flavour, trt, cudart = import_runtime(candidates)
        self._cuda = CudaRuntime(cudart)
        self.flavour.check_device(self._cuda.compute_capability())
        self._runtime = trt.Runtime(tensorrt_logger(trt))
        try:
            for graph, path in plans.items():
                self._runners[graph] = EngineRunner(trt, self._cuda, self._runtime, graph, path)
        except BackendError:
            self.close()
            raise
        except Exception as err:  # TensorRT's bindings raise their own exception types
            self.close()
            raise BackendError(f"cannot load the TensorRT engines of {version_dir}: {err}") from err

    def graphs(self) -> list[str]:
        """Names of the loaded graphs, in the order of ``graph_files``."""
        return list(self._runners)

    def input_names(self, graph: str) -> list[str]:
        """The engine's input names (the ONNX graph's), in the engine's order.

        Raises:
            BackendError: an unknown graph.
        """
        return [s.name for s in self._runner(graph).inputs]

    def output_names(self, graph: str) -> list[str]:
        """The engine's output names (the ONNX graph's), in the engine's order.

        Raises:
            BackendError: an unknown graph.
        """
        return [s.name for s in self._runner(graph).outputs]

    def input_types(self, graph: str) -> dict[str, str]:
        """ONNX type strings ("tensor(float)", "tensor(float16)", "tensor(int64)") of the inputs.

        Raises:
            BackendError: an unknown graph or a type with no ONNX string.
        """
        return {s.name: onnx_type(s.dtype) for s in self._runner(graph).inputs}

    def run(self, graph: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run ``graph`` on ``feeds``; returns every output by name (the engine's dtypes).

        Raises:
            BackendError: an unknown graph, bad feeds, or a CUDA / TensorRT failure.
        """
        return self._runner(graph).run(feeds)

    def _runner(self, graph: str) -> EngineRunner:
        runner = self._runners.get(graph)
        if runner is None:
            raise BackendError(f"no graph {graph!r}; this backend has {list(self._runners)}")
        return runner

    def close(self) -> None:
        """Release every engine's device memory, stream and context (idempotent).

        Raises:
            BackendError: a CUDA call failed (all engines are released regardless).
        """
        runners, self._runners = self._runners, {}
        failures: list[BackendError] = []
        for runner in runners.values():
            try:
                runner.close()
            except BackendError as err:
                failures.append(err)
        self._runtime = None
        if failures:
            raise failures[0]

    def __enter__(self) -> TensorRTBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Interpreter shutdown or a dead CUDA context: nothing more can be done.
        with contextlib.suppress(Exception):
            self.close()
