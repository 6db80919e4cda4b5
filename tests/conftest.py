"""Fixtures every test folder shares: model repositories exported once per test session.

``tiny_repository``: random-weight tiny translator, captioner and ViT (fast; for protocol and
scheduling tests). ``shipped_repository``: the trained checkpoints shipped in the repository
(for tests that check real answers). ``int8_repository``: the tiny translator at int8, with a
float KV cache (``float``) and with an int8 one (``kv8``). ``tiny_translator_fp32`` and
``tiny_translator_fp16``: the tiny translator's export results, fp32 (``tiny_repository``'s) and
fp16, for tests that read the exported graphs and manifests (nothing may write into them).
``hf_sources`` / ``hf_repository``: tiny Hugging Face model directories
(``tests/export/hf_fixtures.py``: ``marian``, ``hf-vit``, ``hf-captioner``) and their export.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.exporter import ExportOptions, ExportResult, export
from tests.repositories import FAST, tiny_sources


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny_repository")
    for source in tiny_sources():
        export(source, root, FAST)
    return root


@pytest.fixture(scope="session")
def shipped_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shipped_repository")
    for kind in ("translator", "captioner", "vit"):
        export(kind, root, FAST)
    return root


@pytest.fixture(scope="session")
def int8_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("int8_repository")
    translator = tiny_sources()[0]
    for name, kv_cache_dtype in (("float", "float"), ("kv8", "int8")):
        options = ExportOptions(
            name=name, precision="int8", kv_cache_dtype=kv_cache_dtype, parity_examples=100
        )
        export(translator, root, options)
    return root


@pytest.fixture(scope="session")
def tiny_translator_fp32(tiny_repository: Path) -> ExportResult:
    entry = tiny_repository / "translator"
    manifest = json.loads((entry / "1" / "manifest.json").read_text())
    return ExportResult(entry, entry / "1", manifest)


@pytest.fixture(scope="session")
def tiny_translator_fp16(tmp_path_factory: pytest.TempPathFactory) -> ExportResult:
    options = ExportOptions(parity_examples=100, precision="fp16")
    return export(tiny_sources()[0], tmp_path_factory.mktemp("tiny_translator_fp16"), options)


@pytest.fixture(scope="session")
def hf_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers", reason="needs the export extra")
    from tests.export.hf_fixtures import save_captioner, save_marian, save_vit

    root = tmp_path_factory.mktemp("hf_sources")
    models = {"marian": save_marian, "hf-vit": save_vit, "hf-captioner": save_captioner}
    return {name: save(root / name) for name, save in models.items()}


@pytest.fixture(scope="session")
def hf_repository(hf_sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf_repository")
    with pytest.MonkeyPatch.context() as patch:  # never the hub: every load is local
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        for name, directory in hf_sources.items():
            export(str(directory), root, ExportOptions(name=name, parity_examples=100))
    return root
