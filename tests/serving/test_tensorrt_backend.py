"""The TensorRT backend: plan checks, install errors, bookkeeping helpers.

Covers ``serving.backends.tensorrt`` (the backend), ``tensorrt_engine`` (engine runners, the
TensorRT import), ``tensorrt_io`` (plans, feeds, shapes, types) and ``cuda`` (CUDA calls, buffers).

What needs no GPU runs everywhere: missing plans and missing TensorRT / cuda-python give the
documented errors, ``make_backend`` routes ``backend: tensorrt`` here, and the feed, shape, type
and device-buffer helpers work (buffers with a recording fake allocator). CUDA error checks run
against the real cuda-python bindings where they are installed. Choosing TensorRT or TensorRT-RTX:
test_tensorrt_flavour.py; engine round trips against ONNX Runtime (TensorRT or TensorRT-RTX,
cuda-python and a GPU): test_tensorrt_engines.py.
"""

from __future__ import annotations

import enum
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from contract.graphs import graph_files
from contract.model_config import ClassifierConfig, ImageSpec
from serving.backends.base import BackendError
from serving.backends.cuda import (
    MIN_ALLOCATION,
    CudaRuntime,
    DeviceBuffers,
    check_cuda,
    grow_capacity,
)
from serving.backends.tensorrt import TensorRTBackend
from serving.backends.tensorrt_engine import INSTALL_MESSAGE
from serving.backends.tensorrt_io import (
    check_plans,
    onnx_type,
    plan_path,
    prepare_feed,
    resolved_shape,
)
from serving.repository import make_backend


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


HAS_CUDA_PYTHON = _has("cuda.bindings.runtime") or _has("cuda.cudart")
requires_cuda_python = pytest.mark.skipif(
    not HAS_CUDA_PYTHON, reason="cuda-python is not installed (pip install cuda-python)"
)

VIT_FILES = {"model": "model.onnx"}
SEQ2SEQ_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}


def _vit_config() -> ClassifierConfig:
    return ClassifierConfig(
        name="vit",
        backend="tensorrt",
        image=ImageSpec(size=32),
    )


def _write_plans(version_dir: Path, files: dict[str, str]) -> None:
    for filename in files.values():
        plan_path(version_dir, filename).write_bytes(b"not an engine")


def _block_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make both TensorRT flavours fail to import, exactly as on a machine without them."""
    for module in ("tensorrt", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delenv("ATTNSERVE_TENSORRT_FLAVOUR", raising=False)


# --------------------------------------------------------------------------------------------
# Construction errors and routing
# --------------------------------------------------------------------------------------------


def test_plan_path_is_the_graph_stem_with_plan_suffix(tmp_path: Path) -> None:
    assert plan_path(tmp_path, "encoder.onnx") == tmp_path / "encoder.plan"
    assert plan_path(tmp_path, "model.onnx") == tmp_path / "model.plan"


def test_missing_plans_name_every_file_and_the_export_flag(tmp_path: Path) -> None:
    (tmp_path / "encoder.plan").write_bytes(b"x")
    with pytest.raises(BackendError) as caught:
        TensorRTBackend(tmp_path, SEQ2SEQ_FILES)
    message = str(caught.value)
    assert "--tensorrt" in message and "attnserve export" in message
    assert str(tmp_path / "decoder.plan") in message
    assert "encoder.plan" not in message  # only the missing one
    assert check_plans(tmp_path, {"encoder": "encoder.onnx"}) == {
        "encoder": tmp_path / "encoder.plan"
    }


def test_plans_are_checked_before_tensorrt_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _block_tensorrt(monkeypatch)
    with pytest.raises(BackendError, match="--tensorrt"):
        TensorRTBackend(tmp_path, VIT_FILES)


def test_without_tensorrt_construction_gives_the_install_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_plans(tmp_path, VIT_FILES)
    _block_tensorrt(monkeypatch)
    with pytest.raises(BackendError) as caught:
        TensorRTBackend(tmp_path, VIT_FILES)
    assert str(caught.value).startswith(INSTALL_MESSAGE)
    assert "pip install -e '.[gpu]'" in str(caught.value)
    assert "backend: onnxruntime" in str(caught.value)


def test_without_cuda_python_construction_gives_the_install_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_plans(tmp_path, VIT_FILES)
    present = ModuleType("tensorrt")  # importable, never used: cuda-python is checked first
    present.__version__ = "10.14.1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", present)
    monkeypatch.delenv("ATTNSERVE_TENSORRT_FLAVOUR", raising=False)
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendError) as caught:
        TensorRTBackend(tmp_path, VIT_FILES)
    assert str(caught.value).startswith(INSTALL_MESSAGE)
    assert "cuda-python" in str(caught.value)


def test_make_backend_routes_tensorrt_configs_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _vit_config()
    assert graph_files(config.kind) == VIT_FILES
    with pytest.raises(BackendError, match="--tensorrt"):
        make_backend(config, tmp_path)
    _write_plans(tmp_path, VIT_FILES)
    _block_tensorrt(monkeypatch)
    with pytest.raises(BackendError) as caught:
        make_backend(config, tmp_path)
    assert str(caught.value).startswith(INSTALL_MESSAGE)


def test_importing_the_module_imports_neither_tensorrt_cuda_nor_torch() -> None:
    code = (
        "import sys; import serving.backends.tensorrt, serving.backends.tensorrt_engine, "
        "serving.backends.tensorrt_io, serving.backends.cuda; "
        "print(sorted(m for m in ('tensorrt', 'tensorrt_rtx_bindings', 'cuda', 'torch') "
        "if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------
# Feeds, shapes and types
# --------------------------------------------------------------------------------------------


def test_int64_ids_narrow_to_an_int32_engine_input() -> None:
    ids = np.array([[1, 2, 2**31 - 1]], dtype=np.int64)
    fed = prepare_feed("encoder", "input_ids", ids, np.dtype(np.int32))
    assert fed.dtype == np.int32 and fed.flags.c_contiguous
    np.testing.assert_array_equal(fed, ids)


def test_int64_engine_input_keeps_ids_unchanged() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    fed = prepare_feed("encoder", "input_ids", ids, np.dtype(np.int64))
    assert fed.dtype == np.int64
    np.testing.assert_array_equal(fed, ids)


def test_ids_that_do_not_fit_int32_are_refused() -> None:
    ids = np.array([[1, 2**31]], dtype=np.int64)
    with pytest.raises(BackendError, match=r"input_ids.*2147483648.*int32"):
        prepare_feed("encoder", "input_ids", ids, np.dtype(np.int32))


def test_floats_are_not_truncated_into_integer_inputs() -> None:
    with pytest.raises(BackendError, match="truncated"):
        prepare_feed("decoder", "position_ids", np.ones((1, 1)), np.dtype(np.int64))


def test_feeds_become_c_contiguous_in_the_engine_float_type() -> None:
    kv = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    assert not kv.flags.c_contiguous
    fed = prepare_feed("decoder", "past_key.0", kv, np.dtype(np.float16))
    assert fed.dtype == np.float16 and fed.flags.c_contiguous
    np.testing.assert_array_equal(fed, kv.astype(np.float16))


def test_empty_kv_cache_is_a_valid_feed() -> None:
    past = np.zeros((2, 4, 0, 8), dtype=np.float32)
    fed = prepare_feed("decoder", "past_key.0", past, np.dtype(np.float32))
    assert fed.shape == (2, 4, 0, 8) and fed.nbytes == 0


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (np.float32, "tensor(float)"),
        (np.float16, "tensor(float16)"),
        (np.int64, "tensor(int64)"),
        (np.int32, "tensor(int32)"),
        (np.bool_, "tensor(bool)"),
    ],
)
def test_onnx_type_strings_match_onnxruntime(dtype: type, expected: str) -> None:
    assert onnx_type(np.dtype(dtype)) == expected


def test_onnx_type_strings_select_the_kv_dtype_in_seq2seq() -> None:
    from serving.seq2seq import _ONNX_FLOAT

    assert _ONNX_FLOAT[onnx_type(np.dtype(np.float16))] is np.float16
    assert _ONNX_FLOAT[onnx_type(np.dtype(np.float32))] is np.float32


def test_onnx_type_refuses_unknown_dtypes() -> None:
    with pytest.raises(BackendError, match="complex"):
        onnx_type(np.dtype(np.complex64))


def test_resolved_shape_accepts_static_and_refuses_unknown_axes() -> None:
    assert resolved_shape("model", "logits", [3, 10]) == (3, 10)
    assert resolved_shape("decoder", "present_key.0", (2, 4, 0, 8)) == (2, 4, 0, 8)
    with pytest.raises(BackendError, match="data-dependent"):
        resolved_shape("model", "logits", (-1, 10))


# --------------------------------------------------------------------------------------------
# Device buffers (a recording fake allocator: the growth and reuse logic is the code under test)
# --------------------------------------------------------------------------------------------


class RecordingAllocator:
    """Hands out fake addresses and records every malloc / free."""

    def __init__(self, fail_free: set[int] | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.live: dict[int, int] = {}
        self.fail_free = fail_free or set()
        self._next = 0x1000

    def malloc(self, nbytes: int) -> int:
        pointer, self._next = self._next, self._next + max(nbytes, 1) + 0x1000
        self.calls.append(("malloc", nbytes))
        self.live[pointer] = nbytes
        return pointer

    def free(self, pointer: int) -> None:
        self.calls.append(("free", pointer))
        size = self.live.pop(pointer)  # KeyError: a double free or a foreign pointer
        if pointer in self.fail_free:
            raise BackendError(f"cudaFree failed: fake error for a {size}-byte buffer")


@pytest.mark.parametrize(
    ("current", "needed", "expected"),
    [
        (0, 0, MIN_ALLOCATION),  # empty tensors still get an address
        (0, 1, 256),
        (0, 1000, 1024),  # rounded up to the 256-byte alignment
        (1024, 1024, 1024),  # fits: kept
        (1024, 10, 1024),  # smaller: kept (buffers never shrink)
        (1024, 1025, 2048),  # one byte more: doubled
        (1024, 5000, 5120),  # far more: what is needed, aligned
    ],
)
def test_grow_capacity(current: int, needed: int, expected: int) -> None:
    assert grow_capacity(current, needed) == expected


def test_buffers_are_reused_until_a_larger_shape_arrives() -> None:
    fake = RecordingAllocator()
    buffers = DeviceBuffers(fake.malloc, fake.free)
    first = buffers.reserve("logits", 4000)
    assert buffers.reserve("logits", 4000) == first
    assert buffers.reserve("logits", 100) == first
    assert fake.calls == [("malloc", 4096)]
    grown = buffers.reserve("logits", 4097)
    assert grown != first
    assert fake.calls[1:] == [("free", first), ("malloc", 8192)]
    assert buffers.capacity("logits") == 8192 and list(fake.live) == [grown]


def test_a_growing_kv_cache_reallocates_logarithmically() -> None:
    fake = RecordingAllocator()
    buffers = DeviceBuffers(fake.malloc, fake.free)
    batch, heads, head_dim, itemsize = 4, 4, 32, 4
    for past in range(200):  # one token per decoder step, like Seq2SeqRunner.greedy
        buffers.reserve("past_key.0", batch * heads * past * head_dim * itemsize)
    mallocs = [size for call, size in fake.calls if call == "malloc"]
    assert len(mallocs) <= 12  # 200 steps; doubling from 256 bytes up to ~400 KB
    assert mallocs == sorted(mallocs)
    assert buffers.capacity("past_key.0") >= batch * heads * 199 * head_dim * itemsize


def test_zero_byte_tensors_get_a_real_address() -> None:
    fake = RecordingAllocator()
    buffers = DeviceBuffers(fake.malloc, fake.free)
    pointer = buffers.reserve("past_key.0", 0)
    assert pointer != 0 and fake.calls == [("malloc", MIN_ALLOCATION)]
    assert buffers.reserve("past_key.0", 0) == pointer


def test_buffers_are_per_tensor_and_release_frees_each_once() -> None:
    fake = RecordingAllocator()
    buffers = DeviceBuffers(fake.malloc, fake.free)
    a = buffers.reserve("input_ids", 64)
    b = buffers.reserve("logits", 64)
    assert a != b and buffers.total_bytes == 512
    buffers.release()
    assert fake.live == {} and buffers.total_bytes == 0
    buffers.release()  # idempotent: nothing freed twice
    assert sorted(p for call, p in fake.calls if call == "free") == sorted([a, b])


def test_release_frees_everything_before_raising_the_first_failure() -> None:
    fake = RecordingAllocator()
    buffers = DeviceBuffers(fake.malloc, fake.free)
    bad = buffers.reserve("a", 10)
    buffers.reserve("b", 10)
    fake.fail_free.add(bad)
    with pytest.raises(BackendError, match="cudaFree"):
        buffers.release()
    assert fake.live == {}


def test_a_failed_allocation_leaves_no_stale_buffer() -> None:
    fake = RecordingAllocator()

    def malloc(nbytes: int) -> int:
        if nbytes > 1024:
            raise BackendError("cudaMalloc failed: cudaErrorMemoryAllocation")
        return fake.malloc(nbytes)

    buffers = DeviceBuffers(malloc, fake.free)
    buffers.reserve("x", 1000)
    with pytest.raises(BackendError, match="cudaMalloc"):
        buffers.reserve("x", 5000)
    assert buffers.capacity("x") == 0 and fake.live == {}
    assert buffers.reserve("x", 10) != 0  # usable again with smaller shapes


# --------------------------------------------------------------------------------------------
# CUDA error checks
# --------------------------------------------------------------------------------------------


class _Error(enum.IntEnum):
    """cuda-python's cudaError_t is an IntEnum with these member names."""

    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2


FAKE_CUDART = SimpleNamespace(
    cudaError_t=_Error,
    cudaGetErrorString=lambda err: (_Error.cudaSuccess, b"out of memory"),
)


def test_check_cuda_returns_values_and_names_failed_calls() -> None:
    assert check_cuda(FAKE_CUDART, "cudaMalloc", (_Error.cudaSuccess, 0xABC)) == 0xABC
    assert check_cuda(FAKE_CUDART, "cudaFree", (_Error.cudaSuccess,)) is None
    with pytest.raises(BackendError) as caught:
        check_cuda(FAKE_CUDART, "cudaMalloc", (_Error.cudaErrorMemoryAllocation, None))
    assert str(caught.value) == "cudaMalloc failed: cudaErrorMemoryAllocation (out of memory)"


def _real_cudart() -> ModuleType:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart  # type: ignore[no-redef]
    return cudart


def _device_count(cudart: ModuleType) -> int:
    err, count = cudart.cudaGetDeviceCount()
    return int(count) if err == cudart.cudaError_t.cudaSuccess else 0


@requires_cuda_python
def test_real_cuda_python_errors_name_the_call_without_a_gpu() -> None:
    cudart = _real_cudart()
    if _device_count(cudart):
        pytest.skip("a GPU is present: the CUDA calls succeed (see the round-trip test)")
    cuda = CudaRuntime(cudart)
    with pytest.raises(BackendError, match=r"^cudaMalloc failed: cudaError"):
        cuda.malloc(1024)
    with pytest.raises(BackendError, match=r"^cudaStreamCreate failed: cudaError"):
        cuda.stream_create()


@requires_cuda_python
@pytest.mark.requires_cuda
def test_real_cuda_copies_round_trip_through_device_buffers() -> None:
    cudart = _real_cudart()
    if not _device_count(cudart):
        pytest.skip("no CUDA device")
    cuda = CudaRuntime(cudart)
    stream = cuda.stream_create()
    buffers = DeviceBuffers(cuda.malloc, cuda.free)
    try:
        for shape in [(2, 3), (64, 129), (1, 5)]:  # grows, then reuses
            host = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            pointer = buffers.reserve("x", host.nbytes)
            cuda.to_device(pointer, host, stream)
            back = np.empty_like(host)
            cuda.to_host(back, pointer, stream)
            cuda.synchronize(stream)
            np.testing.assert_array_equal(back, host)
    finally:
        buffers.release()
        cuda.stream_destroy(stream)
