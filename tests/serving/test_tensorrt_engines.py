"""Engine round trips against ONNX Runtime: TensorRT or TensorRT-RTX, cuda-python and a GPU.

The engines are built by ``attnserve export --tensorrt`` with whichever flavour is installed
(``ATTNSERVE_TENSORRT_FLAVOUR`` pins one) and served by ``TensorRTBackend``, which loads them in
the flavour manifest.json records. TensorRT-RTX runs engines on compute capability 8.0 / 8.6 /
8.9 / 12.x only: on other GPUs (H100 / H200: 9.0) these tests skip with the backend's message.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from serving.backends.base import BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.tensorrt import TensorRTBackend

if TYPE_CHECKING:  # pragma: no cover - typing only (export imports torch)
    from export.exporter import ExportResult


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


HAS_CUDA_PYTHON = _has("cuda.bindings.runtime") or _has("cuda.cudart")
requires_tensorrt = pytest.mark.skipif(
    not ((_has("tensorrt") or _has("tensorrt_rtx_bindings")) and HAS_CUDA_PYTHON),
    reason="needs a TensorRT flavour (TensorRT-RTX: pip install tensorrt-rtx-cu13-bindings "
    "tensorrt-rtx-cu13-libs; TensorRT: NVIDIA's package index or container), cuda-python and an "
    "NVIDIA GPU; none of them is on these CPU machines",
)

VIT_FILES = {"model": "model.onnx"}
SEQ2SEQ_FILES = {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}


def _backend(version_dir: Path, files: Mapping[str, str]) -> TensorRTBackend:
    """The backend, or a skip where the installed flavour does not run engines on this GPU."""
    try:
        return TensorRTBackend(version_dir, files)
    except BackendError as err:
        if "runs engines on compute capability" in str(err):
            pytest.skip(str(err))
        raise


def _export_tensorrt(tmp: Path, kind: str) -> ExportResult:
    import torch

    from export.exporter import ExportOptions, export
    from export.sources import LoadedSource
    from models import translator, vit

    torch.manual_seed(0)
    model: torch.nn.Module
    if kind == "vit":
        model = vit.ViT(vit.preset("tiny", image_size=32, patch_size=8))
    else:
        model = translator.Translator(translator.preset("tiny"))
    loaded = LoadedSource(kind, model.eval(), None, "test", "0")
    return export(loaded, tmp, ExportOptions(tensorrt=True, parity_examples=100))


def _assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, what
    np.testing.assert_allclose(
        actual.astype(np.float32), expected.astype(np.float32), atol=1e-3, rtol=1e-3, err_msg=what
    )


@requires_tensorrt
@pytest.mark.requires_tensorrt
def test_vit_engine_matches_onnxruntime(tmp_path: Path) -> None:
    result = _export_tensorrt(tmp_path, "vit")
    reference = OnnxRuntimeBackend(result.version_dir, VIT_FILES)
    rng = np.random.default_rng(0)
    with _backend(result.version_dir, VIT_FILES) as backend:
        assert backend.graphs() == ["model"]
        assert backend.input_names("model") == reference.input_names("model")
        assert backend.output_names("model") == reference.output_names("model")
        assert backend.input_types("model") == reference.input_types("model")
        for batch in (2, 5, 1, 5):  # grows the buffers, then reuses them
            pixels = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
            got = backend.run("model", {"pixel_values": pixels})
            want = reference.run("model", {"pixel_values": pixels})
            _assert_close(got["logits"], want["logits"], f"logits, batch {batch}")
        with pytest.raises(BackendError, match="outside the engine's profile"):
            backend.run("model", {"pixel_values": np.zeros((1, 3, 31, 31), np.float32)})
        with pytest.raises(BackendError, match="missing"):
            backend.run("model", {})


@requires_tensorrt
@pytest.mark.requires_tensorrt
def test_translator_engines_match_onnxruntime_as_the_cache_grows(tmp_path: Path) -> None:
    from contract.repository import read_model_config
    from serving.seq2seq import Seq2SeqRunner

    result = _export_tensorrt(tmp_path, "translator")
    spec = read_model_config(result.entry).decoder
    assert spec is not None
    reference = Seq2SeqRunner(OnnxRuntimeBackend(result.version_dir, SEQ2SEQ_FILES), spec)
    with _backend(result.version_dir, SEQ2SEQ_FILES) as backend:
        runner = Seq2SeqRunner(backend, spec)
        assert runner.kv_dtype == reference.kv_dtype
        rng = np.random.default_rng(0)
        ids = rng.integers(3, spec.vocab_size, size=(2, 7)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        encoded = reference.encode(feeds)
        for got, want in zip(runner.encode(feeds).cross, encoded.cross, strict=True):
            _assert_close(got, want, "cross keys/values")
        tokens = np.full((2, 1), spec.decoder_start_id, dtype=np.int64)
        past = reference.empty_past(2)
        for step in range(6):  # both get the reference cache: shapes change every call
            positions = np.full((2, 1), step, dtype=np.int64)
            mask = np.ones((2, step + 1), dtype=np.int64)
            logits, presents = runner.step(tokens, positions, mask, past, encoded)
            want_logits, past = reference.step(tokens, positions, mask, past, encoded)
            _assert_close(logits, want_logits, f"logits, step {step}")
            for got, want in zip(presents, past, strict=True):
                _assert_close(got, want, f"present cache, step {step}")
            tokens = want_logits[:, -1].argmax(-1)[:, None].astype(np.int64)
