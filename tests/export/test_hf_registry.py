"""The architecture registry of the Hugging Face import: one registration per architecture,
and a new registration is all that dispatch needs."""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face import tests need `pip install 'transformers>=4.50'`"
)

import export.hf  # noqa: E402
from export.errors import SourceError  # noqa: E402
from export.hf import hf_architecture, hf_kind, load_hf_directory  # noqa: E402
from export.hf.registry import (  # noqa: E402
    ArchitectureLoader,
    loader_for,
    register_architecture,
    supported_architectures,
    unregister_architecture,
)
from export.sources import load_source  # noqa: E402

# architecture -> (module of its loader, model_type, kind)
EXPECTED = {
    "MarianMTModel": ("export.hf.marian", "marian", "translator"),
    "ViTForImageClassification": ("export.hf.vit", "vit", "vit"),
    "VisionEncoderDecoderModel": (
        "export.hf.vision_encoder_decoder",
        "vision-encoder-decoder",
        "captioner",
    ),
}
# The modules of export/hf that are infrastructure rather than one architecture each.
INFRASTRUCTURE = {"common", "generation", "registry", "text", "weights"}
THROWAWAY = "ViTModel"  # a real transformers class that no shipped module registers


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the hub: every load is from a local directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


class _Recorder(ArchitectureLoader):
    """A loader that builds a stand-in model and records what dispatch handed it."""

    calls: list[tuple[str, Any]]

    def make_model(self, hf_config: Any, directory: Path) -> torch.nn.Module:
        self.calls.append(("make_model", hf_config))
        return torch.nn.Identity()

    def copy_weights(self, hf_model: torch.nn.Module, model: torch.nn.Module) -> None:
        self.calls.append(("copy_weights", hf_model))


@contextmanager
def _registered(architecture: str, model_type: str, kind: str) -> Iterator[_Recorder]:
    """Register a throwaway ``_Recorder`` subclass; always removed again on exit."""

    class Throwaway(_Recorder):
        calls: list[tuple[str, Any]] = []  # noqa: RUF012 - one list per throwaway class

    register_architecture(architecture, model_type=model_type, kind=kind)(Throwaway)
    try:
        loader = loader_for(architecture)
        assert isinstance(loader, Throwaway)
        yield loader
    finally:
        unregister_architecture(architecture)


def test_one_registration_per_supported_architecture() -> None:
    assert supported_architectures() == tuple(sorted(EXPECTED))
    for architecture, (module, model_type, kind) in EXPECTED.items():
        loader = loader_for(architecture)
        assert loader is not None
        assert (type(loader).__module__, loader.model_type, loader.kind) == (
            module,
            model_type,
            kind,
        )
        assert loader.architecture == architecture
        assert hf_architecture({"architectures": [architecture]}) == architecture
        assert hf_architecture({"model_type": model_type}) == architecture
        assert hf_kind({"model_type": model_type}) == kind


def test_every_architecture_module_registers_exactly_one_loader() -> None:
    modules = {m.name for m in pkgutil.iter_modules(export.hf.__path__)} - INFRASTRUCTURE
    owners = [type(loader_for(a)).__module__ for a in supported_architectures()]
    assert sorted(owners) == sorted(f"export.hf.{name}" for name in modules)


def test_the_supported_list_in_messages_comes_from_the_registry() -> None:
    with pytest.raises(SourceError, match="supported: " + ", ".join(sorted(EXPECTED)) + "$"):
        hf_architecture({"model_type": "bert"})
    listed = rf"'BertModel'; supported: .*\b{THROWAWAY}\b"
    with _registered(THROWAWAY, "throwaway-vit", "vit"), pytest.raises(SourceError, match=listed):
        hf_architecture({"architectures": ["BertModel"]})


def test_ambiguous_or_unknown_registrations_are_refused() -> None:
    class Again(_Recorder):
        calls: list[tuple[str, Any]] = []  # noqa: RUF012

    with pytest.raises(ValueError, match="MarianMTModel is registered already"):
        register_architecture("MarianMTModel", model_type="marian-2", kind="translator")(Again)
    with pytest.raises(ValueError, match="model_type 'vit' is registered already"):
        register_architecture(THROWAWAY, model_type="vit", kind="vit")(Again)
    with pytest.raises(ValueError, match="kind 'audio'"):
        register_architecture(THROWAWAY, model_type="throwaway", kind="audio")
    assert supported_architectures() == tuple(sorted(EXPECTED))


def test_a_new_registration_is_picked_up_by_dispatch(tmp_path: Path) -> None:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    transformers.ViTModel(config).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(SourceError, match=f"unsupported Hugging Face architecture '{THROWAWAY}'"):
        load_hf_directory(tmp_path)

    with _registered(THROWAWAY, "throwaway-vit", "captioner") as loader:
        assert hf_architecture({"model_type": "throwaway-vit"}) == THROWAWAY
        assert hf_kind({"architectures": [THROWAWAY]}) == "captioner"
        loaded = load_hf_directory(tmp_path)
        assert loaded.kind == "captioner"
        assert loaded.extra is not None and loaded.extra["hf_architecture"] == THROWAWAY
        assert isinstance(loaded.model, torch.nn.Identity)
        (step1, hf_config), (step2, hf_model) = loader.calls
        assert (step1, step2) == ("make_model", "copy_weights")
        assert hf_config.model_type == "vit" and isinstance(hf_model, transformers.ViTModel)
        assert load_source(str(tmp_path)).extra["hf_architecture"] == THROWAWAY

    assert THROWAWAY not in supported_architectures()
    with pytest.raises(SourceError, match=f"'{THROWAWAY}'"):
        hf_architecture({"architectures": [THROWAWAY]})
