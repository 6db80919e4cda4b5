"""Page-locked host memory for what a decode step copies back from the GPU: the logits, or the
greedy ids and their logits (the ``greedy_pick`` graph, ``export/greedy_pick.py``).

Every decode step on CUDA copies each row's logits to the host (the token is chosen there):
[rows, vocab] floats, 8 MB at 256 rows of an 8,000-token vocabulary. Into ordinary (pageable)
memory the driver copies through a staging buffer of its own. On an H200 (2026-11-26) a
Marian-base step grew by about 25 µs per row from batch 64 to 256, which points at this copy.
Into page-locked memory the GPU writes directly.

``CudaHost`` calls the CUDA runtime that onnxruntime-gpu already loaded (``libcudart``) through
ctypes, so serving needs no CUDA package of its own. Where there is no CUDA runtime (the CPU
wheels) ``CudaHost.load()`` returns None and the callers keep their pageable buffers. Buffers
are registered with ``cudaHostRegister`` (pinned in place: numpy keeps owning them) and
unregistered when their array is freed.
"""

from __future__ import annotations

import ctypes
import logging
import weakref

import numpy as np

from serving.backends.base import BackendError

log = logging.getLogger(__name__)

RUNTIME_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost
_REGISTER_DEFAULT = 0  # cudaHostRegisterDefault


class CudaHost:
    """The CUDA runtime calls for page-locked host buffers (``load()`` finds the library)."""

    def __init__(self, runtime: ctypes.CDLL) -> None:
        self._runtime = runtime
        runtime.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        runtime.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        runtime.cudaMemcpy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        for call in ("cudaHostRegister", "cudaHostUnregister", "cudaMemcpy"):
            getattr(runtime, call).restype = ctypes.c_int

    @classmethod
    def load(cls, names: tuple[str, ...] = RUNTIME_NAMES) -> CudaHost | None:
        """The runtime of the first of ``names`` that loads (onnxruntime-gpu's, once it has
        loaded it); None where none does."""
        for name in names:
            try:
                return cls(ctypes.CDLL(name))
            except (OSError, AttributeError):
                continue
        return None

    def pin(self, array: np.ndarray) -> bool:
        """Page-lock ``array``'s memory (C-contiguous) until the array is freed; False, with a
        log line, where the runtime refuses (the buffer then stays pageable and works as
        before)."""
        if not array.flags.c_contiguous or array.nbytes == 0:
            return False
        pointer = array.ctypes.data
        error = self._runtime.cudaHostRegister(pointer, array.nbytes, _REGISTER_DEFAULT)
        if error != 0:
            log.info("cudaHostRegister of %d bytes failed (CUDA error %d)", array.nbytes, error)
            return False
        weakref.finalize(array, self._runtime.cudaHostUnregister, pointer)
        return True

    def copy_to_host(self, target: np.ndarray, device_pointer: int) -> None:
        """Copy ``target.nbytes`` bytes from device memory into ``target`` (synchronous).

        Raises:
            BackendError: the copy failed.
        """
        error = self._runtime.cudaMemcpy(
            target.ctypes.data, device_pointer, target.nbytes, _DEVICE_TO_HOST
        )
        if error != 0:
            raise BackendError(f"cudaMemcpy of a decoder output failed (CUDA error {error})")


def pinned_empty(
    shape: tuple[int, ...], host: CudaHost | None, dtype: type = np.float32
) -> np.ndarray:
    """A host buffer of ``shape`` (float32 unless ``dtype``), page-locked when ``host`` can
    (zero-filled)."""
    array: np.ndarray = np.zeros(shape, dtype=dtype)
    if host is not None:
        host.pin(array)
    return array
