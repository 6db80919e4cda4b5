"""The registry of Hugging Face architectures we import: one loader class per architecture.

An architecture module defines one ``ArchitectureLoader`` subclass and registers it::

    @register_architecture("MarianMTModel", model_type="marian", kind="translator")
    class MarianLoader(ArchitectureLoader[Translator]):
        def make_model(self, hf_config, directory): ...
        def copy_weights(self, hf_model, model): ...

``export.hf`` imports every module of its package, so that module is all a new architecture
needs: dispatch (``hf_architecture``, ``load_hf_directory``, the export kind) and the list of
supported architectures in error messages are read from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from torch import nn

from export.sources import EntryExtras
from models.config import MODEL_KINDS

Model = TypeVar("Model", bound=nn.Module)


class ArchitectureLoader(ABC, Generic[Model]):
    """How one HF architecture becomes one of our models (``Model``, the class it makes).

    ``register_architecture`` sets the three class attributes; subclasses implement the two
    steps, each refusing with a ``SourceError`` what our model cannot express.
    """

    architecture: ClassVar[str]  # the class name in config.json's "architectures"
    model_type: ClassVar[str]  # config.json's "model_type" when it has no "architectures"
    kind: ClassVar[str]  # the export kind: one of models.config.MODEL_KINDS
    # Substrings of weight names that from_pretrained computes rather than loads (so a checkpoint
    # without them is complete), e.g. Marian's fixed sinusoidal position tables.
    computed_weights: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def make_model(self, hf_config: Any, directory: Path) -> Model:
        """Our model, randomly initialised, with the configuration of the HF one.

        Args:
            hf_config: The HF config (``AutoConfig.from_pretrained`` of the directory).
            directory: The source directory (generation and preprocessor configs).

        Returns:
            The untrained model of our ``kind``.

        Raises:
            SourceError: for anything in the configuration our model cannot express.
        """

    @abstractmethod
    def copy_weights(self, hf_model: nn.Module, model: Model) -> None:
        """Copy every weight of ``hf_model`` into ``model``.

        Args:
            hf_model: The loaded HF model (eval mode).
            model: What ``make_model`` returned for the same directory.

        Raises:
            SourceError: for a weight that is missing, untied where we tie, or lands nowhere.
        """

    def entry_extras(
        self, transformers: Any, hf_model: nn.Module, model: Model, directory: Path
    ) -> EntryExtras:
        """What the repository entry needs besides the graphs: the tokenizer files and the
        preprocessing serving repeats, the generation rules it applies (none by default).

        Args:
            transformers: The imported ``transformers`` module.
            hf_model: The loaded HF model (its ``generation_config`` is what generate() uses).
            model: What ``make_model`` returned (its ids and sizes).
            directory: The source directory.

        Returns:
            The extras for ``export.repository``.

        Raises:
            SourceError: For a tokenizer, preprocessing or generation rule serving cannot follow.
        """
        return EntryExtras()

    def hf_model_class(self, transformers: Any) -> Any:
        """The ``transformers`` class that loads this architecture (its namesake by default).

        Args:
            transformers: The imported ``transformers`` module.

        Returns:
            The class whose ``from_pretrained`` loads the directory.
        """
        return getattr(transformers, self.architecture)


_Loader = TypeVar("_Loader", bound=type[ArchitectureLoader[Any]])
_LOADERS: dict[str, ArchitectureLoader[Any]] = {}


def register_architecture(
    architecture: str, *, model_type: str, kind: str
) -> Callable[[_Loader], _Loader]:
    """Class decorator: register the loader of one HF architecture.

    Args:
        architecture: The HF class name, as config.json's ``architectures[0]`` spells it.
        model_type: The config.json ``model_type`` that stands for this architecture when
            config.json names no architectures.
        kind: The export kind of the imported model: "translator", "vit" or "captioner".

    Returns:
        The decorator; it returns the class unchanged, with the three attributes set.

    Raises:
        ValueError: for an unknown kind, or an architecture or model_type registered already
            (either would make dispatch ambiguous).
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"kind {kind!r} of {architecture} is none of {', '.join(MODEL_KINDS)}")

    def register(cls: _Loader) -> _Loader:
        if architecture in _LOADERS:
            raise ValueError(f"architecture {architecture} is registered already")
        taken = architecture_for_model_type(model_type)
        if taken is not None:
            raise ValueError(f"model_type {model_type!r} is registered already, by {taken}")
        cls.architecture, cls.model_type, cls.kind = architecture, model_type, kind
        _LOADERS[architecture] = cls()
        return cls

    return register


def unregister_architecture(architecture: str) -> None:
    """Remove a registration (tests register throwaway architectures and remove them).

    Args:
        architecture: A registered architecture name.

    Raises:
        KeyError: when it is not registered.
    """
    del _LOADERS[architecture]


def supported_architectures() -> tuple[str, ...]:
    """The registered architecture names, sorted (stable messages whatever the import order).

    Returns:
        The names, e.g. ("MarianMTModel", "ViTForImageClassification", ...).
    """
    return tuple(sorted(_LOADERS))


def loader_for(architecture: str) -> ArchitectureLoader[Any] | None:
    """The loader registered for ``architecture``.

    Args:
        architecture: A HF class name.

    Returns:
        Its loader; None when the architecture is not registered.
    """
    return _LOADERS.get(architecture)


def architecture_for_model_type(model_type: str) -> str | None:
    """The architecture registered for a config.json ``model_type``.

    Args:
        model_type: config.json's "model_type".

    Returns:
        The architecture name; None when no registration answers to it.
    """
    return next((a for a, loader in _LOADERS.items() if loader.model_type == model_type), None)
