"""CUDA runtime calls over NVIDIA's cuda-python bindings, and device buffers that grow on demand.

Device memory, copies and streams go through ``cuda.bindings.runtime`` (or ``cuda.cudart`` in
older cuda-python releases), never torch. Every call is checked: a failure raises
``BackendError`` naming the call and the CUDA error. Importing this module does not import
cuda-python; ``import_cudart`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from serving.backends.base import BackendError

ALIGNMENT = 256  # bytes: capacities are rounded up to this (cudaMalloc aligns to 256 as well)
MIN_ALLOCATION = ALIGNMENT  # empty tensors (a zero-length KV cache) still get a real address


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
        """Release a stream from ``stream_create``."""
        self.call("cudaStreamDestroy", stream)

    def synchronize(self, stream: Any) -> None:
        """Wait for everything queued on ``stream``."""
        self.call("cudaStreamSynchronize", stream)

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) compute capability of the current CUDA device.

        Returns:
            e.g. (8, 9) for an RTX 4090, (9, 0) for an H100.

        Raises:
            BackendError: no device, or a CUDA call failed.
        """
        device = self.call("cudaGetDevice")
        attributes = self._cudart.cudaDeviceAttr
        major = self.call(
            "cudaDeviceGetAttribute", attributes.cudaDevAttrComputeCapabilityMajor, device
        )
        minor = self.call(
            "cudaDeviceGetAttribute", attributes.cudaDevAttrComputeCapabilityMinor, device
        )
        return int(major), int(minor)

    def to_device(self, pointer: int, array: np.ndarray, stream: Any) -> None:
        """Queue a copy of a C-contiguous host array to device memory."""
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.call("cudaMemcpyAsync", pointer, array.ctypes.data, array.nbytes, kind, stream)

    def to_host(self, array: np.ndarray, pointer: int, stream: Any) -> None:
        """Queue a copy of device memory into a C-contiguous host array."""
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.call("cudaMemcpyAsync", array.ctypes.data, pointer, array.nbytes, kind, stream)


def import_cudart() -> ModuleType:
    """The CUDA runtime bindings of cuda-python.

    Returns:
        ``cuda.bindings.runtime`` (cuda-python >= 12.6) or the older ``cuda.cudart``.

    Raises:
        ImportError: cuda-python is not installed (the caller says what to install instead).
    """
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # type: ignore[no-redef]  # older cuda-python
    return cudart
