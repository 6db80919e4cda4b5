"""Pure helpers of the TensorRT backend: flavours, plan files, dtypes, feeds and output shapes.

Nothing here touches TensorRT or CUDA, so all of it is testable on any machine.

Two libraries run the engines with the same runtime API: TensorRT (module ``tensorrt``) and
TensorRT-RTX (module ``tensorrt_rtx_bindings``). ``RuntimeFlavour`` holds what differs for
serving: the module, the version floor, and the compute capabilities its engines run on. An
engine only loads in the library that built it, so ``flavour_candidates`` follows the flavour the
version's manifest.json records (``tensorrt.flavour``, written by ``attnserve export
--tensorrt``), and ``ATTNSERVE_TENSORRT_FLAVOUR`` (auto | tensorrt | rtx) or the backend's
``flavour`` argument can pin one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.repository import read_manifest
from contract.schema import SchemaError
from contract.tensorrt import FLAVOUR_ENV, RTX_RUNS_ON
from contract.tensorrt import requested_flavour as contract_flavour
from serving.backends.base import BackendError

PLAN_SUFFIX = ".plan"
Capability = tuple[int, int]  # a GPU's compute capability (major, minor)


@dataclass(frozen=True)
class RuntimeFlavour:
    """What differs between the TensorRT and TensorRT-RTX runtimes for serving."""

    name: str  # "tensorrt" | "rtx", as manifest.json and ATTNSERVE_TENSORRT_FLAVOUR name it
    label: str
    module: str  # the Python module
    min_major: int  # the name-based tensor API (set_input_shape, execute_async_v3), INT64 I/O
    runs_on: tuple[Capability, ...]  # compute capabilities it runs engines on; (): any

    def check_device(self, capability: Capability) -> None:
        """Refuse a GPU this runtime does not run engines on.

        Args:
            capability: the GPU's (major, minor).

        Raises:
            BackendError: naming the GPU's capability, the supported ones, and what to use instead.
        """
        if not self.runs_on or capability in self.runs_on:
            return
        supported = ", ".join(f"{a}.{b}" for a, b in self.runs_on)
        raise BackendError(
            f"{self.label} runs engines on compute capability {supported}; this GPU has "
            f"{capability[0]}.{capability[1]} (H100 / H200 are 9.0): build the engines with full "
            f"TensorRT ({FLAVOUR_ENV}=tensorrt, NVIDIA's TensorRT container), or set backend: "
            "onnxruntime in config.yaml"
        )


TENSORRT_RUNTIME = RuntimeFlavour("tensorrt", "TensorRT", "tensorrt", 10, ())
RTX_RUNTIME = RuntimeFlavour(
    "rtx",
    "TensorRT-RTX",
    "tensorrt_rtx_bindings",
    1,
    RTX_RUNS_ON,
)
RUNTIME_FLAVOURS = {f.name: f for f in (TENSORRT_RUNTIME, RTX_RUNTIME)}


def requested_flavour(requested: str | None = None) -> str:
    """The flavour asked for: ``requested``, else ``ATTNSERVE_TENSORRT_FLAVOUR``, else "auto".

    Args:
        requested: "auto", "tensorrt", "rtx" or None.

    Returns:
        one of contract.tensorrt.FLAVOUR_CHOICES.

    Raises:
        BackendError: an unknown name (the message lists the choices).
    """
    try:
        return contract_flavour(requested, "backend argument")
    except ValueError as err:
        raise BackendError(str(err)) from err


def recorded_flavour(version_dir: str | Path) -> str | None:
    """The flavour that built a version's engines, from its manifest.json.

    Args:
        version_dir: REPOSITORY/NAME/VERSION.

    Returns:
        "tensorrt" or "rtx"; "tensorrt" for build reports written before flavours existed;
        None when the manifest is missing, unreadable or has no build report.
    """
    try:
        report = read_manifest(version_dir).get("tensorrt")
    except (SchemaError, OSError):  # a damaged manifest: fall back to what is installed
        return None
    if not isinstance(report, dict):
        return None
    name = report.get("flavour", "tensorrt")
    return name if name in RUNTIME_FLAVOURS else None


def flavour_candidates(requested: str, recorded: str | None) -> list[RuntimeFlavour]:
    """The flavours to try, in order, for engines built by ``recorded``.

    Args:
        requested: from ``requested_flavour``.
        recorded: from ``recorded_flavour``.

    Returns:
        [the recorded or requested flavour], or both (TensorRT first) for "auto" when nothing
        is recorded.

    Raises:
        BackendError: the requested flavour is not the one that built the engines.
    """
    if requested == "auto":
        if recorded is not None:
            return [RUNTIME_FLAVOURS[recorded]]
        return [TENSORRT_RUNTIME, RTX_RUNTIME]
    if recorded is not None and recorded != requested:
        built, asked = RUNTIME_FLAVOURS[recorded], RUNTIME_FLAVOURS[requested]
        raise BackendError(
            f"these engines were built with {built.label} (manifest.json) and only load in it, "
            f"but {asked.label} was asked for ({FLAVOUR_ENV}={requested}): set {FLAVOUR_ENV}="
            f"{recorded} or auto, or rebuild with `attnserve export SOURCE --out REPOSITORY "
            f"--tensorrt` and {FLAVOUR_ENV}={requested}"
        )
    return [RUNTIME_FLAVOURS[requested]]


_ONNX_TYPES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int64): "tensor(int64)",
    np.dtype(np.int32): "tensor(int32)",
    np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.uint8): "tensor(uint8)",
    np.dtype(np.bool_): "tensor(bool)",
}


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
