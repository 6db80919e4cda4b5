"""Import Hugging Face models from local ``save_pretrained`` directories into our model classes.

The HF model is loaded with ``transformers`` from the directory only (``local_files_only``,
safetensors weights; never the hub), then its weights are copied into the matching model of
``models`` so that the rest of the export path (graph specs, parity, repository) is unchanged.
Each supported architecture is one module of this package with one ``ArchitectureLoader``
registered by ``register_architecture`` (``export.hf.registry``):

- ``marian``: ``MarianMTModel`` -> ``models.translator.Translator``;
- ``vit``: ``ViTForImageClassification`` -> ``models.vit.ViT``;
- ``vision_encoder_decoder``: ``VisionEncoderDecoderModel`` (ViT encoder, GPT-2 decoder)
  -> ``models.captioner.Captioner``.

Importing this package imports all of its modules, so adding an architecture is adding a module.

Everything the target model cannot express (another norm placement, an embedding norm, an untied
LM head, an activation we do not have, ...) is refused with a ``SourceError`` that names it,
rather than imported into a model that computes something else. Every HF weight must land
somewhere or be checked redundant (tied copies, the fixed sinusoidal table): leftovers are refused.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from torch import nn

from export.errors import SourceError
from export.hf.common import read_json
from export.hf.registry import (
    ArchitectureLoader,
    architecture_for_model_type,
    loader_for,
    supported_architectures,
)
from export.hf.weights import check_weight_files
from export.sources import LoadedSource, directory_checksum

__all__ = [
    "check_weight_files",
    "hf_architecture",
    "hf_kind",
    "load_hf_directory",
    "supported_architectures",
]


def load_hf_directory(directory: Path) -> LoadedSource:
    """Load a Hugging Face ``save_pretrained`` directory as one of our models.

    Args:
        directory: A local directory with config.json and safetensors weights.

    Returns:
        The imported model (eval mode) with the kind its architecture is registered with
        ("translator", "vit" or "captioner"), no tokenizer of ours but the entry extras of the
        directory (its tokenizer files, image preprocessing and generation rules, for serving),
        and a checksum over the directory's .safetensors, .json and .spm files.

    Raises:
        SourceError: for an unsupported architecture or configuration, missing or corrupt
            weights, a tokenizer, preprocessing or generation rule serving cannot follow, or a
            missing ``transformers`` package; the message says which and why.
    """
    directory = Path(directory)
    loader = _resolve(read_json(directory / "config.json"))
    transformers = _import_transformers()
    hf_config = _load_hf_config(transformers, directory)
    # Our model first: a configuration we cannot express is refused before loading weights.
    our_model = loader.make_model(hf_config, directory)
    weight_files = check_weight_files(directory)
    hf_model = _load_hf_model(transformers, loader, directory, weight_files)
    loader.copy_weights(hf_model, our_model)
    return LoadedSource(
        kind=loader.kind,
        model=our_model.eval(),
        tokenizer=None,
        origin=str(directory),
        checksum=directory_checksum(directory, (".safetensors", ".json", ".spm")),
        hf_tokenizer_dir=directory,
        extra={"hf_architecture": loader.architecture, "transformers": transformers.__version__},
        entry=loader.entry_extras(transformers, hf_model, our_model, directory),
    )


def hf_architecture(config: dict[str, Any]) -> str:
    """The supported architecture named by a config.json: ``architectures[0]`` or ``model_type``.

    Args:
        config: The parsed config.json.

    Returns:
        A registered architecture name (one of ``supported_architectures()``).

    Raises:
        SourceError: for any other architecture, listing the supported ones.
    """
    return _resolve(config).architecture


def hf_kind(config: dict[str, Any]) -> str:
    """The export kind of the architecture a config.json names.

    Args:
        config: The parsed config.json.

    Returns:
        "translator", "vit" or "captioner": the kind the architecture is registered with.

    Raises:
        SourceError: for an unsupported architecture, listing the supported ones.
    """
    return _resolve(config).kind


def _resolve(config: dict[str, Any]) -> ArchitectureLoader:
    """The loader of the architecture a config.json names (see ``hf_architecture``)."""
    architectures = config.get("architectures") or []
    if architectures:
        name = str(architectures[0])
    else:
        model_type = str(config.get("model_type", ""))
        name = architecture_for_model_type(model_type) or f"model_type {model_type!r}"
    loader = loader_for(name)
    if loader is None:
        raise SourceError(
            f"unsupported Hugging Face architecture {name!r}; supported: "
            + ", ".join(supported_architectures())
        )
    return loader


def _import_transformers() -> Any:
    """``transformers``, imported only here: the rest of export runs without it."""
    try:
        import transformers
    except ImportError as err:
        raise SourceError(
            "importing a Hugging Face model needs the transformers package: "
            "pip install 'transformers>=4.50'"
        ) from err
    return transformers


def _load_hf_config(transformers: Any, directory: Path) -> Any:
    """``AutoConfig`` of the local directory."""
    try:
        return transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # transformers raises many types for a bad config
        raise SourceError(f"cannot read the Hugging Face config in {directory}: {err}") from err


def _load_hf_model(
    transformers: Any, loader: ArchitectureLoader, directory: Path, weight_files: list[Path]
) -> nn.Module:
    """``from_pretrained`` on the local directory; every weight the model needs must be there."""
    names = ", ".join(p.name for p in weight_files)
    model_class = loader.hf_model_class(transformers)
    try:
        model, info = model_class.from_pretrained(
            directory, local_files_only=True, use_safetensors=True, output_loading_info=True
        )
    except Exception as err:  # safetensors, torch and transformers errors alike
        raise SourceError(
            f"cannot load {loader.architecture} weights from {names} in {directory}: {err}"
        ) from err
    problems = _loading_problems(info, loader.computed_weights)
    if problems:
        raise SourceError(f"weights in {names} ({directory}) do not match config.json: {problems}")
    return model.eval()


def _loading_problems(info: dict[str, Any], computed: tuple[str, ...]) -> str:
    """Missing or wrongly shaped weights reported by ``from_pretrained`` ('' when none).

    Weights whose name contains one of ``computed`` are not stored (transformers computes them,
    e.g. Marian's sinusoidal tables), so their absence does not count.
    """
    missing = sorted(
        k for k in info.get("missing_keys", ()) if not any(part in k for part in computed)
    )
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:8])}")
    if mismatched:
        parts.append(f"wrong shape {', '.join(mismatched[:8])}")
    return "; ".join(parts)


def _register_architectures() -> None:
    """Import every module of this package; each architecture module registers its loader.

    Discovery rather than a list, so that a new architecture needs no edit here. Architecture
    modules import from the submodules (``export.hf.registry``, ...), never from this one, which
    is still initialising while they run.
    """
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_register_architectures()
