"""Shared serving fixtures: model repositories exported once per test session.

``tiny_repository``: random-weight tiny translator, captioner and ViT (fast; for protocol and
scheduling tests). ``shipped_repository``: the trained checkpoints shipped in the repository
(for tests that check real answers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from export.exporter import ExportOptions, export
from export.sources import LoadedSource
from models import captioner, translator, vit
from models.data.translation import language_tags
from models.tokenizer import SubwordTokenizer

FAST = ExportOptions(parity_examples=100)


def tiny_sources() -> list[LoadedSource]:
    """Tiny random models with the shapes of the shipped ones (48x48 captions, 32x32 digits)."""
    texts = [
        "three hundred and twelve",
        "dreihundertzwölf",
        "trois cent douze",
        "doce",
        "a small red circle left of a large blue square",
    ]
    tokenizer = SubwordTokenizer.train(texts, 160, extra_special_tokens=language_tags())
    t = translator.Translator(translator.preset("tiny", vocab_size=tokenizer.vocab_size))
    c = captioner.Captioner(
        captioner.preset("tiny", image_size=48, patch_size=8, vocab_size=tokenizer.vocab_size)
    )
    v = vit.ViT(
        vit.preset("tiny", image_size=32, patch_size=8, labels=tuple(str(i) for i in range(10)))
    )
    return [
        LoadedSource("translator", t.eval(), tokenizer, "tiny", "0"),
        LoadedSource("captioner", c.eval(), tokenizer, "tiny", "0"),
        LoadedSource("vit", v.eval(), None, "tiny", "0"),
    ]


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
