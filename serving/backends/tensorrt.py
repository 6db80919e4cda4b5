"""TensorRT backend: one deserialized engine ``{graph}.plan`` per graph of a model version.

The engines are the ones ``attnserve export ... --tensorrt`` builds (``export.tensorrt``): one
optimisation profile each, inputs named as in the ONNX graphs. Device memory, copies and streams
go through NVIDIA's ``cuda-python`` runtime bindings (``cuda.bindings.runtime``, or ``cuda.cudart``
in older releases), never torch.

Each graph has its own execution context, CUDA stream and device buffers. Input shapes change on
every decoder call (the KV cache grows by the new tokens), so a call sets every input shape, reads
the output shapes back from the context, and binds buffers that grow on demand (doubling, so a
cache growing one token per step reallocates only O(log n) times) and are reused between calls.
A lock per graph serialises calls, as an execution context runs one inference at a time.

Importing this module needs neither TensorRT nor cuda-python: both are imported when a
``TensorRTBackend`` is built, which raises ``BackendError`` (with what to install or configure
instead) when they are missing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from serving.backends.base import BackendError

log = logging.getLogger(__name__)

INSTALL_MESSAGE = (
    "the tensorrt backend needs TensorRT and cuda-python with an NVIDIA GPU "
    "(pip install -e '.[gpu]'); set backend: onnxruntime in config.yaml to serve on the CPU"
)
PLAN_SUFFIX = ".plan"
MIN_TENSORRT_MAJOR = 10  # the name-based tensor API (set_input_shape, execute_async_v3), INT64 I/O
ALIGNMENT = 256  # bytes: capacities are rounded up to this (cudaMalloc aligns to 256 as well)
MIN_ALLOCATION = ALIGNMENT  # empty tensors (a zero-length KV cache) still get a real address
PROFILE = 0  # export.tensorrt builds one optimisation profile per engine

_ONNX_TYPES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int64): "tensor(int64)",
    np.dtype(np.int32): "tensor(int32)",
    np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.uint8): "tensor(uint8)",
    np.dtype(np.bool_): "tensor(bool)",
}


# --------------------------------------------------------------------------------------------
# Pure helpers: plan files, dtypes, feeds, shapes, buffer capacities
# --------------------------------------------------------------------------------------------


def plan_path(version_dir: str | Path, graph_file: str) -> Path:
    """The engine file of a graph: the ONNX file's stem + ``.plan``.

    Args:
        version_dir: REPOSITORY/NAME/VERSION.
        graph_file: the graph's ONNX file name, e.g. "encoder.onnx".

    Returns:
        e.g. REPOSITORY/NAME/VERSION/encoder.plan.
    """
    return Path(version_dir) / (Path(graph_file).stem + PLAN_SUFFIX)


def check_plans(version_dir: str | Path, graph_files: Mapping[str, str]) -> dict[str, Path]:
    """The plan file of every graph, all of which must exist.

    Args:
        version_dir: REPOSITORY/NAME/VERSION.
        graph_files: graph name -> ONNX file name.

    Returns:
        graph name -> plan path.

    Raises:
        BackendError: naming every missing plan and the export flag that builds them.
    """
    plans = {graph: plan_path(version_dir, filename) for graph, filename in graph_files.items()}
    missing = [str(path) for path in plans.values() if not path.is_file()]
    if missing:
        raise BackendError(
            f"TensorRT engine(s) {', '.join(missing)} missing: build them with "
            "`attnserve export SOURCE --out REPOSITORY --tensorrt` on a machine with TensorRT "
            "and the serving GPU, or set backend: onnxruntime in config.yaml"
        )
    return plans


def onnx_type(dtype: np.dtype) -> str:
    """ONNX Runtime's type string for a numpy dtype ("tensor(float)", "tensor(int64)", ...).

    Args:
        dtype: an engine tensor's numpy dtype.

    Returns:
        the string ``NodeArg.type`` would give for the same ONNX input.

    Raises:
        BackendError: a dtype ONNX graphs exported here never use.
    """
    try:
        return _ONNX_TYPES[np.dtype(dtype)]
    except KeyError:
        raise BackendError(f"no ONNX type string for dtype {np.dtype(dtype)}") from None


def prepare_feed(graph: str, name: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array of the engine's dtype for one input.

    Floats cast to the engine's float type (e.g. float32 -> float16), integers to its integer
    type (int64 ids -> int32 for engines whose inputs are INT32) when every value fits; a float
    array fed to an integer or bool input is refused rather than truncated.

    Args:
        graph: the graph name (for messages).
        name: the input name (for messages).
        value: the fed array (or anything ``np.asarray`` takes).
        dtype: the engine input's numpy dtype.

    Returns:
        the array to copy to the device.

    Raises:
        BackendError: a float fed to an integer input, or integers out of the input type's range.
    """
    array = np.asarray(value)
    target = np.dtype(dtype)
    if array.dtype != target:
        if array.dtype.kind == "f" and target.kind in "iub":
            raise BackendError(
                f"{graph} input {name!r} takes {target}, got {array.dtype} (not cast: values "
                "would be truncated)"
            )
        if array.dtype.kind in "iu" and target.kind in "iu" and array.size:
            info = np.iinfo(target)
            low, high = int(array.min()), int(array.max())
            if low < info.min or high > info.max:
                raise BackendError(
                    f"{graph} input {name!r} holds values {low}..{high} outside the engine's "
                    f"{target} input ({info.min}..{info.max})"
                )
    return np.ascontiguousarray(array, dtype=target)


def resolved_shape(graph: str, name: str, dims: Any) -> tuple[int, ...]:
    """An output shape read from the context once all input shapes are set.

    Args:
        graph: the graph name (for messages).
        name: the output name.
        dims: ``context.get_tensor_shape(name)`` (a ``trt.Dims`` or any int sequence).

    Returns:
        the shape as a tuple of ints.

    Raises:
        BackendError: an axis still unknown (-1): data-dependent output shapes need an output
            allocator, which the graphs exported here never need.
    """
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise BackendError(
            f"{graph} output {name!r} has shape {shape} after all input shapes were set; "
            "data-dependent output shapes are not supported by this backend"
        )
    return shape


def grow_capacity(current: int, needed: int, minimum: int = MIN_ALLOCATION) -> int:
    """The capacity a buffer of ``current`` bytes grows to when ``needed`` bytes must fit.

    Args:
        current: bytes allocated now (0: none).
        needed: bytes the next call needs.
        minimum: the smallest allocation (also what a zero-byte tensor gets).

    Returns:
        ``current`` when ``needed`` fits, else the largest of ``needed``, twice ``current`` and
        ``minimum``, rounded up to ``ALIGNMENT``.
    """
    if current >= max(needed, minimum, 1):
        return current
    size = max(needed, 2 * current, minimum, 1)
    return -(-size // ALIGNMENT) * ALIGNMENT


class DeviceBuffers:
    """Device allocations by tensor name, grown on demand and reused between calls.

    The allocator and deallocator are injected (``CudaRuntime.malloc`` / ``free`` in service), so
    the growth and reuse logic is testable without a GPU.
    """

    def __init__(
        self,
        allocate: Callable[[int], int],
        free: Callable[[int], None],
        minimum: int = MIN_ALLOCATION,
    ) -> None:
        """Start with no allocations.

        Args:
            allocate: bytes -> device pointer (raises on failure).
            free: releases a pointer returned by ``allocate``.
            minimum: the smallest allocation.
        """
        self._allocate = allocate
        self._free = free
        self._minimum = minimum
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, capacity)

    def reserve(self, name: str, nbytes: int) -> int:
        """A device pointer with room for ``nbytes`` for tensor ``name``.

        Reuses the tensor's buffer when it is large enough; otherwise frees it and allocates a
        larger one (see ``grow_capacity``). Never returns a null pointer, even for 0 bytes.

        Args:
            name: the tensor name.
            nbytes: bytes this call needs.

        Returns:
            the device pointer.

        Raises:
            BackendError: from the allocator or deallocator.
        """
        pointer, capacity = self._buffers.get(name, (0, 0))
        wanted = grow_capacity(capacity, nbytes, self._minimum)
        if pointer and wanted == capacity:
            return pointer
        if pointer:
            del self._buffers[name]
            self._free(pointer)
        pointer = self._allocate(wanted)
        self._buffers[name] = (pointer, wanted)
        return pointer

    def capacity(self, name: str) -> int:
        """Bytes allocated for ``name`` (0: none)."""
        return self._buffers.get(name, (0, 0))[1]

    @property
    def total_bytes(self) -> int:
        """Bytes allocated for all tensors."""
        return sum(capacity for _, capacity in self._buffers.values())

    def release(self) -> None:
        """Free every buffer; the first failure is raised after trying all.

        Raises:
            BackendError: from the deallocator.
        """
        buffers, self._buffers = self._buffers, {}
        first: BackendError | None = None
        for pointer, _ in buffers.values():
            try:
                self._free(pointer)
            except BackendError as err:
                first = first or err
        if first is not None:
            raise first


# --------------------------------------------------------------------------------------------
# CUDA runtime calls (cuda-python)
# --------------------------------------------------------------------------------------------


def check_cuda(cudart: Any, call: str, result: Any) -> Any:
    """The value of a cuda-python call after checking its error code.

    cuda-python returns ``(err,)`` or ``(err, value)``; the error is a ``cudaError_t``.

    Args:
        cudart: the runtime bindings module (for ``cudaError_t`` and ``cudaGetErrorString``).
        call: the function name, for the message.
        result: what the call returned.

    Returns:
        the value (None for calls that return only the error code).

    Raises:
        BackendError: naming the call and the CUDA error.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise BackendError(f"{call} failed: {name}{_error_text(cudart, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _error_text(cudart: Any, err: Any) -> str:
    """The error's description from cudaGetErrorString, in parentheses ("" if that fails)."""
    try:
        _, text = cudart.cudaGetErrorString(err)
    except Exception:  # best effort: the error name alone is already in the message
        return ""
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return f" ({text})" if text else ""


class CudaRuntime:
    """The CUDA runtime calls the backend makes, each checked (``BackendError`` on failure)."""

    def __init__(self, cudart: ModuleType) -> None:
        """Wrap a runtime bindings module.

        Args:
            cudart: ``cuda.bindings.runtime`` (or the older ``cuda.cudart``).
        """
        self._cudart = cudart

    def call(self, name: str, *args: Any) -> Any:
        """Call ``cudart.<name>(*args)`` and return its value.

        Raises:
            BackendError: naming the call and the CUDA error.
        """
        return check_cuda(self._cudart, name, getattr(self._cudart, name)(*args))

    def malloc(self, nbytes: int) -> int:
        """Device memory of ``nbytes`` bytes; returns its address."""
        return int(self.call("cudaMalloc", nbytes))

    def free(self, pointer: int) -> None:
        """Release memory from ``malloc``."""
        self.call("cudaFree", pointer)

    def stream_create(self) -> Any:
        """A new CUDA stream (a ``cudaStream_t``; ``int()`` of it is the handle)."""
        return self.call("cudaStreamCreate")

    def stream_destroy(self, stream: Any) -> None:
        self.call("cudaStreamDestroy", stream)

    def synchronize(self, stream: Any) -> None:
        """Wait for everything queued on ``stream``."""
        self.call("cudaStreamSynchronize", stream)

    def to_device(self, pointer: int, array: np.ndarray, stream: Any) -> None:
        """Queue a copy of a C-contiguous host array to device memory."""
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.call("cudaMemcpyAsync", pointer, array.ctypes.data, array.nbytes, kind, stream)

    def to_host(self, array: np.ndarray, pointer: int, stream: Any) -> None:
        """Queue a copy of device memory into a C-contiguous host array."""
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.call("cudaMemcpyAsync", array.ctypes.data, pointer, array.nbytes, kind, stream)


def import_runtime() -> tuple[ModuleType, ModuleType]:
    """``tensorrt`` and the CUDA runtime bindings.

    Returns:
        (tensorrt, cudart).

    Raises:
        BackendError: either is missing (INSTALL_MESSAGE), or TensorRT is older than 10.
    """
    try:
        import tensorrt as trt
    except (ImportError, OSError) as err:  # OSError: the wheel is there, libnvinfer is not
        raise BackendError(f"{INSTALL_MESSAGE} ({err})") from err
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]  # older cuda-python
        except ImportError as err:
            raise BackendError(f"{INSTALL_MESSAGE} (cuda-python: {err})") from err
    version = str(getattr(trt, "__version__", "0"))
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < MIN_TENSORRT_MAJOR:
        raise BackendError(
            f"TensorRT {version} is too old: the tensorrt backend needs TensorRT >= "
            f"{MIN_TENSORRT_MAJOR} (pip install -e '.[gpu]')"
        )
    return trt, cudart


# --------------------------------------------------------------------------------------------
# TensorRT
# --------------------------------------------------------------------------------------------


_LOGGERS: dict[int, Any] = {}  # id(tensorrt module) -> logger: TensorRT keeps one per process


def _logger(trt: ModuleType) -> Any:
    """A trt.ILogger that keeps recent errors for messages and logs warnings (one per process)."""
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

        Raises:
            BackendError: the plan cannot be deserialized (another TensorRT version or GPU), a
                tensor type has no numpy equivalent, or CUDA / TensorRT fail.
        """
        self.graph = graph
        self._trt = trt
        self._cuda = cuda
        self._logger = _logger(trt)
        self._lock = threading.Lock()
        self._stream: Any = None
        self._buffers = DeviceBuffers(cuda.malloc, cuda.free)
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BackendError(
                _with_errors(
                    f"cannot deserialize {path} (engines only load with the TensorRT version "
                    "and GPU model they were built with; rebuild with `attnserve export SOURCE "
                    "--out REPOSITORY --tensorrt` here)",
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
        return [s for s in self.specs if s.is_input]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [s for s in self.specs if not s.is_input]

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Copy the feeds in, execute, copy every output back.

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


class TensorRTBackend:
    """Loads ``{graph}.plan`` engines of a version folder; runs them with numpy feeds."""

    def __init__(self, version_dir: str | Path, graph_files: Mapping[str, str]) -> None:
        """Deserialize one engine per graph and prepare its context, stream and buffers.

        Args:
            version_dir: REPOSITORY/NAME/VERSION.
            graph_files: graph name -> ONNX file name, e.g. {"encoder": "encoder.onnx"}; each
                graph's engine is the same stem + ".plan".

        Raises:
            BackendError: missing plans (with the export command that builds them), TensorRT or
                cuda-python missing (with what to install or configure instead), or an engine
                that does not load here.
        """
        self._runners: dict[str, EngineRunner] = {}
        plans = check_plans(version_dir, graph_files)
        trt, cudart = import_runtime()
        self._cuda = CudaRuntime(cudart)
        self._runtime = trt.Runtime(_logger(trt))
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
        return list(self._runners)

    def input_names(self, graph: str) -> list[str]:
        return [s.name for s in self._runner(graph).inputs]

    def output_names(self, graph: str) -> list[str]:
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
