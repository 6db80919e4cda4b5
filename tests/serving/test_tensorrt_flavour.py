"""The TensorRT backend's flavours: which library loads a version's engines, and on which GPUs.

Selection runs through the real import machinery: a temporary directory on sys.path holds
minimal modules named ``tensorrt`` / ``tensorrt_rtx_bindings`` (a version string) and
``cuda.bindings.runtime`` (the calls that report a device's compute capability), used only to
check which flavour is chosen and what the messages say. Where the real TensorRT-RTX is installed
(and cuda-python is not), one test loads it for real up to the missing cuda-python.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from serving.backends.base import BackendError
from serving.backends.cuda import CudaRuntime
from serving.backends.tensorrt import TensorRTBackend
from serving.backends.tensorrt_engine import INSTALL_MESSAGE, import_runtime
from serving.backends.tensorrt_io import (
    FLAVOUR_ENV,
    RTX_RUNTIME,
    TENSORRT_RUNTIME,
    flavour_candidates,
    recorded_flavour,
    requested_flavour,
)

MODULES = ("tensorrt", "tensorrt_rtx_bindings", "cuda", "cuda.bindings", "cuda.bindings.runtime")
VIT_FILES = {"model": "model.onnx"}
CUDART = """
    import enum

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0

    class cudaDeviceAttr(enum.IntEnum):
        cudaDevAttrComputeCapabilityMajor = 75
        cudaDevAttrComputeCapabilityMinor = 76

    CAPABILITY = {capability!r}

    def cudaGetDevice():
        return cudaError_t.cudaSuccess, 0

    def cudaDeviceGetAttribute(attribute, device):
        major = attribute == cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor
        return cudaError_t.cudaSuccess, CAPABILITY[0 if major else 1]
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty directory first on sys.path; no flavour or cuda-python imported; env unset.

    What the test imports from it is dropped afterwards, and the modules imported before it
    come back.
    """
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(FLAVOUR_ENV, raising=False)
    before = {module: sys.modules.pop(module, None) for module in MODULES}
    yield root
    for module, original in before.items():
        sys.modules.pop(module, None)
        if original is not None:
            sys.modules[module] = original


def _module(site: Path, dotted: str, body: str = "") -> None:
    """A minimal importable package ``dotted`` (parents created) in ``site``."""
    folder = site.joinpath(*dotted.split("."))
    folder.mkdir(parents=True, exist_ok=True)
    for depth in range(1, len(dotted.split(".")) + 1):
        init = site.joinpath(*dotted.split(".")[:depth], "__init__.py")
        if not init.exists():
            init.write_text("")
    (folder / "__init__.py").write_text(textwrap.dedent(body))
    importlib.invalidate_caches()


def _cudart(site: Path, capability: tuple[int, int]) -> None:
    _module(site, "cuda.bindings.runtime", CUDART.format(capability=capability))


def _version_dir(tmp_path: Path, flavour: str | None) -> Path:
    """A version folder with placeholder plans and a build report naming ``flavour``."""
    version_dir = tmp_path / "vit" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.plan").write_bytes(b"not an engine")
    report = {} if flavour is None else {"tensorrt": {"flavour": flavour}}
    (version_dir / "manifest.json").write_text(json.dumps(report))
    return version_dir


def test_requested_flavour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FLAVOUR_ENV, raising=False)
    assert requested_flavour() == "auto"
    monkeypatch.setenv(FLAVOUR_ENV, "rtx")
    assert requested_flavour() == "rtx" and requested_flavour("tensorrt") == "tensorrt"
    with pytest.raises(BackendError, match=r"'rtx2'.*choose one of auto, tensorrt, rtx"):
        requested_flavour("rtx2")


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (None, None),  # no manifest.json
        ({"precision": "fp32"}, None),  # no build report
        ({"tensorrt": {"tensorrt_version": "10.14.1"}}, "tensorrt"),  # before flavours existed
        ({"tensorrt": {"flavour": "rtx"}}, "rtx"),
        ({"tensorrt": {"flavour": "other"}}, None),
        ("not json", None),
    ],
)
def test_recorded_flavour(tmp_path: Path, manifest: object, expected: str | None) -> None:
    if manifest is not None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (tmp_path / "manifest.json").write_text(text)
    assert recorded_flavour(tmp_path) == expected


def test_flavour_candidates_follow_what_built_the_engines() -> None:
    assert flavour_candidates("auto", None) == [TENSORRT_RUNTIME, RTX_RUNTIME]
    assert flavour_candidates("auto", "rtx") == [RTX_RUNTIME]
    assert flavour_candidates("rtx", None) == [RTX_RUNTIME]
    assert flavour_candidates("tensorrt", "tensorrt") == [TENSORRT_RUNTIME]
    with pytest.raises(BackendError) as caught:
        flavour_candidates("tensorrt", "rtx")
    message = str(caught.value)
    assert "built with TensorRT-RTX (manifest.json)" in message
    assert "ATTNSERVE_TENSORRT_FLAVOUR=rtx or auto" in message and "--tensorrt" in message


def test_compute_capabilities_each_flavour_runs_engines_on() -> None:
    for capability in [(8, 0), (8, 6), (8, 9), (12, 0), (12, 1)]:
        RTX_RUNTIME.check_device(capability)
    for capability in [(7, 5), (9, 0), (10, 0)]:
        TENSORRT_RUNTIME.check_device(capability)  # TensorRT: any GPU it supports
    with pytest.raises(BackendError) as caught:
        RTX_RUNTIME.check_device((9, 0))
    message = str(caught.value)
    assert "TensorRT-RTX runs engines on compute capability 8.0, 8.6, 8.9, 12.0, 12.1" in message
    assert "this GPU has 9.0" in message and "ATTNSERVE_TENSORRT_FLAVOUR=tensorrt" in message
    assert "backend: onnxruntime" in message


def test_import_runtime_takes_the_first_flavour_that_imports(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(site, "tensorrt_rtx_bindings", "__version__ = '1.7.1.116'\n")
    _cudart(site, (8, 9))
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    flavour, trt, cudart = import_runtime([TENSORRT_RUNTIME, RTX_RUNTIME])
    assert flavour is RTX_RUNTIME and trt.__name__ == "tensorrt_rtx_bindings"
    assert trt.__file__.startswith(str(site))
    assert CudaRuntime(cudart).compute_capability() == (8, 9)


def test_import_runtime_without_either_flavour_names_both(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("tensorrt", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(BackendError) as caught:
        import_runtime([TENSORRT_RUNTIME, RTX_RUNTIME])
    message = str(caught.value)
    assert message.startswith(INSTALL_MESSAGE)
    assert "(tensorrt: " in message and "; tensorrt_rtx_bindings: " in message


def test_old_tensorrt_rtx_is_refused(site: Path) -> None:
    _module(site, "tensorrt_rtx_bindings", "__version__ = '0.9'\n")
    _cudart(site, (8, 9))
    with pytest.raises(BackendError, match=r"TensorRT-RTX 0.9 is too old.*>= 1"):
        import_runtime([RTX_RUNTIME])


def test_backend_refuses_a_flavour_other_than_the_engines_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version_dir = _version_dir(tmp_path, "rtx")
    monkeypatch.setenv(FLAVOUR_ENV, "tensorrt")
    with pytest.raises(BackendError, match=r"built with TensorRT-RTX .*ATTNSERVE_TENSORRT_FLAVOUR"):
        TensorRTBackend(version_dir, VIT_FILES)
    with pytest.raises(BackendError, match="unknown TensorRT flavour 'x'"):
        TensorRTBackend(version_dir, VIT_FILES, flavour="x")


def test_backend_refuses_tensorrt_rtx_on_an_h100(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engines built by TensorRT-RTX on a compute capability 9.0 GPU: refused before loading."""
    _module(site, "tensorrt_rtx_bindings", "__version__ = '1.7.1.116'\n")
    _module(site, "tensorrt", "__version__ = '10.14.1'\n")  # installed, not the engines' own
    _cudart(site, (9, 0))
    with pytest.raises(BackendError, match=r"this GPU has 9\.0 \(H100 / H200 are 9\.0\)"):
        TensorRTBackend(_version_dir(tmp_path, "rtx"), VIT_FILES)
    assert "tensorrt" not in sys.modules  # auto followed manifest.json: only RTX was imported


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_rtx_bindings") is None,
    reason="TensorRT-RTX is not installed here (pip install tensorrt-rtx-cu13-bindings "
    "tensorrt-rtx-cu13-libs)",
)
def test_real_tensorrt_rtx_is_chosen_for_its_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("cuda") is not None:
        pytest.skip("cuda-python is installed: the backend would go on to the GPU")
    monkeypatch.delenv(FLAVOUR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # never tried: manifest.json says rtx
    with pytest.raises(BackendError) as caught:
        TensorRTBackend(_version_dir(tmp_path, "rtx"), VIT_FILES)
    assert str(caught.value).startswith(INSTALL_MESSAGE) and "(cuda-python:" in str(caught.value)
    assert "tensorrt_rtx_bindings" in sys.modules


class _Error(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorNoDevice = 100


def test_compute_capability_errors_name_the_call() -> None:
    cudart = SimpleNamespace(
        cudaError_t=_Error,
        cudaGetErrorString=lambda err: (_Error.cudaSuccess, b"no CUDA-capable device"),
        cudaGetDevice=lambda: (_Error.cudaErrorNoDevice, 0),
    )
    with pytest.raises(BackendError, match=r"^cudaGetDevice failed: cudaErrorNoDevice"):
        CudaRuntime(cudart).compute_capability()
