"""export.tensorrt.library: choosing TensorRT or TensorRT-RTX, the flavours' rules and messages.

Selection runs through the real import machinery: a temporary directory on sys.path holds
minimal modules named ``tensorrt`` / ``tensorrt_rtx_bindings`` (a version and the attention API
names), used only to check which flavour is chosen and what the messages say. The real
TensorRT-RTX is checked in test_tensorrt_rtx.py. Also here: the GPU-session collector's report
rows (``export.tensorrt.collect``).
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from export.errors import ExportError
from export.tensorrt import (
    FLAVOUR_ENV,
    RTX,
    TENSORRT,
    TensorRTError,
    load_library,
    requested_flavour,
)
from export.tensorrt.collect import collect, summary_rows
from export.tensorrt.library import missing_attention_api, tensorrt_version

MODULES = ("tensorrt", "tensorrt_rtx_bindings")
ATTENTION_API = """
    class IAttention:
        decomposable = False

    class IAttentionInputLayer:
        pass

    class LayerType:
        ATTENTION_INPUT = 51
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty directory first on sys.path; neither flavour imported, the env variable unset.

    What the test imports from it is dropped afterwards, and the modules imported before it
    come back.
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(FLAVOUR_ENV, raising=False)
    before = {module: sys.modules.pop(module, None) for module in MODULES}
    yield tmp_path
    for module, original in before.items():
        sys.modules.pop(module, None)
        if original is not None:
            sys.modules[module] = original


def _install(site: Path, module: str, version: str, attention: bool = True) -> None:
    """A minimal importable package ``module`` in ``site``."""
    package = site / module
    package.mkdir()
    body = f"__version__ = {version!r}\n" + (textwrap.dedent(ATTENTION_API) if attention else "")
    (package / "__init__.py").write_text(body)
    importlib.invalidate_caches()


def _block(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """``import module`` fails, as on a machine without it."""
    monkeypatch.setitem(sys.modules, module, None)


def test_requested_flavour_argument_then_environment_then_auto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FLAVOUR_ENV, raising=False)
    assert requested_flavour() == "auto"
    monkeypatch.setenv(FLAVOUR_ENV, " RTX ")
    assert requested_flavour() == "rtx"
    assert requested_flavour("tensorrt") == "tensorrt"  # the argument wins
    with pytest.raises(
        TensorRTError, match=r"'trt'.*ATTNSERVE_TENSORRT_FLAVOUR.*auto, tensorrt, rtx"
    ):
        requested_flavour("trt")


def test_auto_prefers_tensorrt_when_both_import(site: Path) -> None:
    _install(site, "tensorrt", "10.14.1.48")
    _install(site, "tensorrt_rtx_bindings", "1.7.1.116")
    library = load_library()
    assert library.flavour is TENSORRT
    assert library.trt.__file__.startswith(str(site))
    assert library.version == (10, 14) and not library.strongly_typed
    assert load_library("rtx").flavour is RTX


def test_auto_falls_back_to_tensorrt_rtx(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(site, "tensorrt_rtx_bindings", "1.7.1.116")
    _block(monkeypatch, "tensorrt")
    library = load_library()
    assert library.flavour is RTX and library.trt.__name__ == "tensorrt_rtx_bindings"
    assert library.version == (1, 7) and library.strongly_typed
    assert library.version_text == "1.7.1.116"


def test_environment_pins_the_flavour(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(site, "tensorrt", "11.0.0")
    _install(site, "tensorrt_rtx_bindings", "1.7.1.116")
    monkeypatch.setenv(FLAVOUR_ENV, "rtx")
    assert load_library().flavour is RTX
    monkeypatch.setenv(FLAVOUR_ENV, "tensorrt")
    assert load_library().strongly_typed  # TensorRT 11: always strongly typed


def test_asked_for_flavour_that_is_missing_says_which_and_how(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(site, "tensorrt_rtx_bindings", "1.7.1.116")
    _block(monkeypatch, "tensorrt")
    with pytest.raises(ExportError) as info:
        load_library("tensorrt")
    message = str(info.value)
    assert message.startswith(
        "TensorRT was asked for (--tensorrt-flavour or ATTNSERVE_TENSORRT_FLAVOUR)"
    )
    assert "pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs" in message
    assert "[tensorrt: " in message and "tensorrt_rtx_bindings:" not in message


def test_nothing_installed_lists_what_was_tried(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in MODULES:
        _block(monkeypatch, module)
    with pytest.raises(ExportError, match=r"TensorRT is not installed here") as info:
        load_library()
    assert "tensorrt: " in str(info.value) and "tensorrt_rtx_bindings: " in str(info.value)
    assert "12.0, 12.1" in str(info.value)  # where TensorRT-RTX engines run


def test_tensorrt_before_10_14_is_refused(site: Path) -> None:
    _install(site, "tensorrt", "10.13.3.9")
    with pytest.raises(TensorRTError, match=r"TensorRT 10.13.3.9 .*Attention.*>= 10.14"):
        load_library()


def test_bindings_without_the_attention_api_are_refused(site: Path) -> None:
    _install(site, "tensorrt_rtx_bindings", "1.1.0", attention=False)
    with pytest.raises(TensorRTError) as info:
        load_library("rtx")
    message = str(info.value)
    assert "TensorRT-RTX 1.1.0 lacks IAttention.decomposable, IAttentionInputLayer" in message
    assert "pip install tensorrt-rtx-cu13-bindings" in message


def test_missing_attention_api_names_dotted_attributes(site: Path) -> None:
    _install(site, "tensorrt", "10.14.1", attention=False)
    module = importlib.import_module("tensorrt")
    assert missing_attention_api(module) == [
        "IAttention.decomposable",
        "IAttentionInputLayer",
        "LayerType.ATTENTION_INPUT",
    ]


def test_flavour_rules() -> None:
    assert not TENSORRT.strongly_typed((10, 14)) and TENSORRT.strongly_typed((11, 0))
    assert RTX.strongly_typed((1, 0)) and RTX.strongly_typed((1, 7))
    assert TENSORRT.timing_cache and not RTX.timing_cache  # a no-op in TensorRT-RTX
    assert TENSORRT.needs_gpu_to_build and not RTX.needs_gpu_to_build
    assert TENSORRT.runs_on == () and RTX.runs_on == ("8.0", "8.6", "8.9", "12.0", "12.1")
    assert tensorrt_version("10.14.1.48") == (10, 14)
    assert tensorrt_version("1.7.1.116", RTX) == (1, 7)
    assert tensorrt_version("11") == (11, 0)
    with pytest.raises(
        TensorRTError, match=r"TensorRT 9.0 .*>= 10.14.*NVIDIA's TensorRT container"
    ):
        tensorrt_version("9.0")


REPORT = {
    "flavour": "rtx",
    "tensorrt_version": "1.7.1.116",
    "precision": "fp16",
    "engines": [
        {
            "graph": "encoder",
            "bytes": 10,
            "build_seconds": 0.5,
            "total_build_seconds": 0.8,
            "layers": 3,
            "attention_layers": 2,
            "fused_attention_layers": 2,
            "attempts": [],
        },
    ],
    "skipped": [{"graph": "decoder_inplace", "file": "decoder_inplace.onnx", "reason": "why"}],
}


def test_collect_rows_one_per_engine_and_skip(tmp_path: Path) -> None:
    rows = summary_rows("translator-fp16", REPORT)
    assert rows == [
        {
            "entry": "translator-fp16",
            "flavour": "rtx",
            "version": "1.7.1.116",
            "precision": "fp16",
            "graph": "encoder",
            "bytes": 10,
            "build_seconds": 0.5,
            "total_build_seconds": 0.8,
            "layers": 3,
            "attention_layers": 2,
            "fused_attention_layers": 2,
        },
        {
            "entry": "translator-fp16",
            "flavour": "rtx",
            "version": "1.7.1.116",
            "precision": "fp16",
            "graph": "decoder_inplace",
            "skipped": "why",
        },
    ]
    for name, manifest in {"a": {"tensorrt": REPORT}, "b": {"precision": "fp32"}}.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "manifest.json").write_text(json.dumps(manifest))
    collected = collect(tmp_path)
    assert list(collected["reports"]) == ["a/1"]  # entries without a build report are left out
    assert [row["entry"] for row in collected["rows"]] == ["a", "a"]
