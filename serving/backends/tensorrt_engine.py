"""One TensorRT engine with its execution context, CUDA stream, device buffers and lock.

``EngineRunner`` runs one deserialized ``{graph}.plan``. Input shapes change on every decoder
call (the KV cache grows by the new tokens), so a call sets every input shape, reads the output
shapes back from the context, and binds device buffers (``serving.backends.cuda.DeviceBuffers``)
that grow on demand (doubling, so a cache growing one token per step reallocates only O(log n)
times) and are reused between calls. Each graph has its own execution context and CUDA stream; a
lock serialises calls, as an execution context runs one inference at a time.

``import_tensorrt`` is the one place the serving side imports a TensorRT module (TensorRT or
TensorRT-RTX, ``serving.backends.tensorrt_io.RuntimeFlavour``); everything else receives it as
``trt``. Importing this module imports neither TensorRT nor cuda-python.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from serving.backends.base import BackendError
from serving.backends.cuda import CudaRuntime, DeviceBuffers, import_cudart
from serving.backends.tensorrt_io import (
    TENSORRT_RUNTIME,
    RuntimeFlavour,
    prepare_feed,
    resolved_shape,
)

log = logging.getLogger(__name__)

INSTALL_MESSAGE = (
    "the tensorrt backend needs TensorRT or TensorRT-RTX, and cuda-python, with an NVIDIA GPU "
    "(pip install -e '.[gpu]' installs TensorRT-RTX; full TensorRT comes from NVIDIA's TensorRT "
    "container or package index); set backend: onnxruntime in config.yaml to serve on the CPU"
)
PROFILE = 0  # export.tensorrt builds one optimisation profile per engine


def import_tensorrt(flavour: RuntimeFlavour = TENSORRT_RUNTIME) -> ModuleType:
    """A TensorRT flavour's Python module, imported on first use (it loads its libraries).

    Args:
        flavour: which library (TensorRT by default).

    Returns:
        the ``tensorrt`` or ``tensorrt_rtx_bindings`` module.

    Raises:
        BackendError: the module is not installed or its libraries do not load (INSTALL_MESSAGE).
    """
    try:
        return importlib.import_module(flavour.module)
    except (ImportError, OSError) as err:  # OSError: the wheel is there, its .so is not
        raise BackendError(f"{INSTALL_MESSAGE} ({flavour.module}: {err})") from err


def import_runtime(
    candidates: Sequence[RuntimeFlavour] = (TENSORRT_RUNTIME,),
) -> tuple[RuntimeFlavour, ModuleType, ModuleType]:
    """The first candidate flavour that imports, and the CUDA runtime bindings.

    Args:
        candidates: flavours in order of preference (``tensorrt_io.flavour_candidates``).

    Returns:
        (flavour, its module, cudart).

    Raises:
        BackendError: no candidate imports or cuda-python is missing (INSTALL_MESSAGE), or the
            library is too old.
    """
    failures: list[str] = []
    for flavour in candidates:
        try:
            trt = importlib.import_module(flavour.module)
        except (ImportError, OSError) as err:  # OSError: the wheel is there, its .so is not
            failures.append(f"{flavour.module}: {err}")
            continue
        try:
            cudart = import_cudart()
        except ImportError as err:
            raise BackendError(f"{INSTALL_MESSAGE} (cuda-python: {err})") from err
        _check_version(flavour, trt)
        return flavour, trt, cudart
    raise BackendError(f"{INSTALL_MESSAGE} ({'; '.join(failures) or 'no flavour to try'})")


def _check_version(flavour: RuntimeFlavour, trt: ModuleType) -> None:
    """Refuse releases before the name-based tensor API."""
    version = str(getattr(trt, "__version__", "0"))
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < flavour.min_major:
        raise BackendError(
            f"{flavour.label} {version} is too old: the tensorrt backend needs {flavour.label} "
            f">= {flavour.min_major} (pip install -e '.[gpu]')"
        )


_LOGGERS: dict[int, Any] = {}  # id(tensorrt module) -> logger: TensorRT keeps one per process


def tensorrt_logger(trt: ModuleType) -> Any:
    """The process's TensorRT logger: keeps recent errors for messages, logs warnings.

    TensorRT keeps one logger per process, so the runtime and every engine share this one.

    Args:
        trt: the TensorRT module (from ``import_tensorrt``).

    Returns:
        a ``trt.ILogger`` whose ``recent()`` gives (and clears) the last errors.
    """
    existing = _LOGGERS.get(id(trt))
    if existing is not None:
        return existing

    class CollectingLogger(trt.ILogger):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: deque[str] = deque(maxlen=5)

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.WARNING:
                log.warning("TensorRT: %s", msg)

        def recent(self) -> str:
            """Recent errors joined with "; " (then cleared); "" when there were none."""
            text = "; ".join(self.errors)
            self.errors.clear()
            return text

    logger = CollectingLogger()
    _LOGGERS[id(trt)] = logger
    return logger


def _with_errors(message: str, logger: Any) -> str:
    """``message`` with the logger's recent TensorRT errors appended (they say what failed)."""
    recent = logger.recent()
    return f"{message}: {recent}" if recent else message


@dataclass(frozen=True)
class TensorSpec:
    """One I/O tensor of an engine."""

    name: str
    is_input: bool
    dtype: np.dtype


class EngineRunner:
    """One engine with its execution context, stream, device buffers and lock."""

    def __init__(
        self, trt: ModuleType, cuda: CudaRuntime, runtime: Any, graph: str, path: Path
    ) -> None:
        """Deserialize ``path`` and create its execution context and stream.

        Args:
            trt: the TensorRT module (from ``import_tensorrt``).
            cuda: the checked CUDA runtime calls (allocations, copies, the stream).
            runtime: the ``trt.Runtime`` that deserializes the plan (one for all graphs).
            graph: the graph name, for messages.
            path: the graph's ``.plan`` file.

        Raises:
            BackendError: the plan cannot be deserialized (another TensorRT version or GPU), a
                tensor type has no numpy equivalent, or CUDA / TensorRT fail.
        """
        self.graph = graph
        self._trt = trt
        self._cuda = cuda
        self._logger = tensorrt_logger(trt)
        self._lock = threading.Lock()
        self._stream: Any = None
        self._buffers = DeviceBuffers(cuda.malloc, cuda.free)
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BackendError(
                _with_errors(
                    f"cannot deserialize {path} (engines load only in the TensorRT flavour and "
                    "version that built them, TensorRT's only on the GPU model it built them on; "
                    "rebuild with `attnserve export SOURCE --out REPOSITORY --tensorrt` here)",
                    self._logger,
                )
            )
        self.specs = [self._spec(self.engine.get_tensor_name(i)) for i in range(self._count())]
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise BackendError(
                _with_errors(f"cannot create an execution context for {path}", self._logger)
            )
        self._stream = cuda.stream_create()

    def _count(self) -> int:
        return int(self.engine.num_io_tensors)

    def _spec(self, name: str) -> TensorSpec:
        trt = self._trt
        dtype = self.engine.get_tensor_dtype(name)
        try:
            numpy_dtype = np.dtype(trt.nptype(dtype))
        except (TypeError, KeyError) as err:
            raise BackendError(
                f"{self.graph} tensor {name!r} has type {dtype}, which has no numpy equivalent"
            ) from err
        is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        return TensorSpec(name, is_input, numpy_dtype)

    @property
    def inputs(self) -> list[TensorSpec]:
        """The engine's input tensors, in the engine's order."""
        return [s for s in self.specs if s.is_input]

    @property
    def outputs(self) -> list[TensorSpec]:
        """The engine's output tensors, in the engine's order."""
        return [s for s in self.specs if not s.is_input]

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Copy the feeds in, execute, copy every output back.

        Args:
            feeds: input name -> array, one for every engine input (cast by ``prepare_feed``).

        Returns:
            output name -> host array, in the engine's dtypes.

        Raises:
            BackendError: missing or unknown feeds, shapes outside the profile, CUDA or TensorRT
                failures.
        """
        with self._lock:
            if self._stream is None:
                raise BackendError(f"the {self.graph} engine is closed")
            arrays = self._prepare(feeds)
            try:
                return self._execute(arrays)
            except BackendError:
                self._drain()
                raise
            except Exception as err:  # TensorRT's bindings raise their own exception types
                self._drain()
                raise BackendError(f"{self.graph} graph failed: {err}") from err

    def _prepare(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        names = {s.name for s in self.inputs}
        missing = [n for n in names if n not in feeds]
        unknown = [n for n in feeds if n not in names]
        if missing or unknown:
            raise BackendError(
                f"{self.graph} graph takes inputs {[s.name for s in self.inputs]}; missing "
                f"{sorted(missing) or 'none'}, unknown {sorted(unknown) or 'none'}"
            )
        return {
            s.name: prepare_feed(self.graph, s.name, feeds[s.name], s.dtype) for s in self.inputs
        }

    def _execute(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        context, stream = self.context, self._stream
        for name, array in arrays.items():
            self._set_shape(name, array.shape)
        outputs = {
            s.name: np.empty(
                resolved_shape(self.graph, s.name, context.get_tensor_shape(s.name)), s.dtype
            )
            for s in self.outputs
        }
        for name, array in arrays.items():
            pointer = self._bind(name, array.nbytes)
            if array.nbytes:
                self._cuda.to_device(pointer, array, stream)
        pointers = {name: self._bind(name, array.nbytes) for name, array in outputs.items()}
        if not context.execute_async_v3(int(stream)):
            raise BackendError(_with_errors(f"the {self.graph} engine failed", self._logger))
        for name, array in outputs.items():
            if array.nbytes:
                self._cuda.to_host(array, pointers[name], stream)
        self._cuda.synchronize(stream)
        return outputs

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self.context.set_input_shape(name, shape):
            raise BackendError(
                _with_errors(
                    f"{self.graph} input {name!r} has shape {tuple(shape)}, outside the engine's "
                    f"profile {self._profile(name)} (from config.yaml limits at export)",
                    self._logger,
                )
            )

    def _profile(self, name: str) -> str:
        try:
            low, _, high = self.engine.get_tensor_profile_shape(name, PROFILE)
        except Exception:  # only for the message
            return "(unknown)"
        return f"min {tuple(low)} .. max {tuple(high)}"

    def _bind(self, name: str, nbytes: int) -> int:
        pointer = self._buffers.reserve(name, nbytes)
        if not self.context.set_tensor_address(name, pointer):
            raise BackendError(
                _with_errors(f"cannot bind {self.graph} tensor {name!r}", self._logger)
            )
        return pointer

    def _drain(self) -> None:
        """After a failure: wait for queued copies so the next call starts clean."""
        try:
            self._cuda.synchronize(self._stream)
        except BackendError as err:
            log.warning("%s stream did not synchronize after a failure: %s", self.graph, err)

    def close(self) -> None:
        """Free device buffers and the stream, drop the context and engine (idempotent).

        Raises:
            BackendError: a CUDA call failed (everything is released regardless).
        """
        with self._lock:
            stream, self._stream = self._stream, None
            self.context = None  # a context goes before its engine
            self.engine = None
            failures: list[BackendError] = []
            try:
                if stream is not None:
                    self._cuda.synchronize(stream)
            except BackendError as err:
                failures.append(err)
            try:
                self._buffers.release()
            except BackendError as err:
                failures.append(err)
            try:
                if stream is not None:
                    self._cuda.stream_destroy(stream)
            except BackendError as err:
                failures.append(err)
            if failures:
                raise failures[0]
