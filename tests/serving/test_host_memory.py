"""Page-locked logits buffers (serving.backends.host_memory): on a GPU the logits come back into
pinned memory intact; without a GPU or a CUDA runtime every buffer stays pageable and a failed
copy is a BackendError, never a crash."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from serving.backends.base import BackendError
from serving.backends.host_memory import CudaHost, pinned_empty

HOST = CudaHost.load()
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def test_without_a_cuda_runtime_nothing_is_loaded_and_buffers_stay_plain() -> None:
    assert CudaHost.load(("libno-such-cuda-runtime.so.1",)) is None
    buffer = pinned_empty((4, 1, 7), None)
    assert buffer.shape == (4, 1, 7) and buffer.dtype == np.float32 and not buffer.any()


@pytest.mark.skipif(HOST is None, reason="no CUDA runtime library (libcudart) on this machine")
@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: see the round trip below")
def test_a_runtime_without_a_gpu_refuses_and_says_so() -> None:
    assert HOST is not None
    buffer = np.zeros((8, 1, 16), dtype=np.float32)
    assert HOST.pin(buffer) is False  # the buffer stays pageable; decoding works as before
    with pytest.raises(BackendError, match="cudaMemcpy"):
        HOST.copy_to_host(buffer, 4096)


@pytest.mark.skipif(not HAS_CUDA or HOST is None, reason="needs onnxruntime-gpu and a CUDA GPU")
def test_device_logits_come_back_into_pinned_memory_intact() -> None:
    assert HOST is not None
    values = np.random.default_rng(0).standard_normal((8, 1, 16)).astype(np.float32)
    device = ort.OrtValue.ortvalue_from_numpy(values, "cuda", 0)
    target = pinned_empty(values.shape, HOST)
    assert HOST.pin(np.zeros(4, dtype=np.float32))
    HOST.copy_to_host(target, device.data_ptr())
    np.testing.assert_array_equal(target, values)
