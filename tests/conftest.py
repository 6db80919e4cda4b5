"""Fixtures every test folder shares: model repositories exported once per test session.

``tiny_repository``: random-weight tiny translator, captioner and ViT (fast; for protocol and
scheduling tests). ``shipped_repository``: the trained checkpoints shipped in the repository
(for tests that check real answers). ``int8_repository``: the tiny translator at int8, with a
float KV cache (``float``) and with an int8 one (``kv8``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from export.exporter import ExportOptions, export
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
