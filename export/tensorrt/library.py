"""The TensorRT Python module and its flavour: the one place this package imports TensorRT.

Two libraries provide the same builder / network / ONNX parser / runtime API under different
names; a ``Flavour`` holds everything that differs between them, so the builds have one code path:

- ``tensorrt``: NVIDIA TensorRT >= 10.14 (module ``tensorrt``; 10.x builds weakly typed
  networks, 11.x only strongly typed ones). Not installable from PyPI alone (its wheels come from
  NVIDIA's package index or NVIDIA's TensorRT container); it builds on the GPU the engines will
  run on, any GPU it supports.
- ``rtx``: TensorRT for RTX (module ``tensorrt_rtx_bindings``; pip packages
  ``tensorrt-rtx-cu13-bindings`` and ``tensorrt-rtx-cu13-libs``). Versions 1.x, networks always
  strongly typed, the timing cache is a deprecated no-op, engines are built ahead of time without
  needing a GPU and run on compute capability 8.0, 8.6, 8.9, 12.0 and 12.1 only (not on 9.0:
  H100 / H200).

``load_library`` chooses the flavour (argument, else ``ATTNSERVE_TENSORRT_FLAVOUR``, else
``auto``: TensorRT if it imports, then TensorRT-RTX), imports it and checks its version and the
attention API the builds use. Everything else in ``export.tensorrt`` receives the ``Library`` it
returns. Importing this module imports neither library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from contract.tensorrt import FLAVOUR_CHOICES as FLAVOUR_CHOICES  # re-exported
from contract.tensorrt import FLAVOUR_ENV
from contract.tensorrt import RTX_RUNS_ON as RTX_CAPABILITIES
from contract.tensorrt import requested_flavour as contract_flavour
from export.errors import ExportError
from export.tensorrt.errors import TensorRTError

MIN_TENSORRT = (10, 14)  # first TensorRT whose ONNX parser maps Attention to its fused layer
RTX_RUNS_ON = tuple(f"{major}.{minor}" for major, minor in RTX_CAPABILITIES)  # others refused
# The network API the builds use to find the parsed attention layers and allow decomposition.
ATTENTION_API = ("IAttention.decomposable", "IAttentionInputLayer", "LayerType.ATTENTION_INPUT")


@dataclass(frozen=True)
class Flavour:
    """What differs between TensorRT and TensorRT-RTX; the API the builds call is the same."""

    name: str  # "tensorrt" | "rtx" (the ATTNSERVE_TENSORRT_FLAVOUR value)
    label: str  # for messages and reports
    module: str  # the Python module
    install: str  # how to install it
    min_version: tuple[int, int]
    strongly_typed_from: int  # first major version whose networks are always strongly typed
    timing_cache: bool  # False: the timing cache API is a deprecated no-op
    needs_gpu_to_build: bool  # False: ahead-of-time builds on machines without a GPU
    runs_on: tuple[str, ...]  # compute capabilities its engines run on; (): the GPU built on

    def version(self, text: str) -> tuple[int, int]:
        """(major, minor) of the module's ``__version__``, refusing versions below min_version.

        Args:
            text: the version string, e.g. "10.14.1.48" or "1.7.1.116".

        Returns:
            (major, minor); missing parts count as 0.

        Raises:
            TensorRTError: a version older than min_version.
        """
        parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
        version = (*parts, 0, 0)[:2]
        if version < self.min_version:
            low = ".".join(map(str, self.min_version))
            raise TensorRTError(
                f"{self.label} {text} cannot parse the ONNX Attention op into its fused attention "
                f"layer; install {self.label} >= {low} ({self.install})"
            )
        return version[0], version[1]

    def strongly_typed(self, version: tuple[int, int]) -> bool:
        """Whether networks of this version are always strongly typed (precision from the graph).

        Args:
            version: (major, minor) from ``version``.

        Returns:
            True for TensorRT >= 11 and every TensorRT-RTX.
        """
        return version[0] >= self.strongly_typed_from


TENSORRT = Flavour(
    name="tensorrt",
    label="TensorRT",
    module="tensorrt",
    install="NVIDIA's TensorRT container, or `pip install tensorrt` with NVIDIA's package index "
    "(pypi.nvidia.com): PyPI's tensorrt packages are stubs that fetch from there",
    min_version=MIN_TENSORRT,
    strongly_typed_from=11,
    timing_cache=True,
    needs_gpu_to_build=True,
    runs_on=(),
)
RTX = Flavour(
    name="rtx",
    label="TensorRT-RTX",
    module="tensorrt_rtx_bindings",
    install="pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs",
    min_version=(1, 0),  # the attention API check below is what gates TensorRT-RTX versions
    strongly_typed_from=0,
    timing_cache=False,
    needs_gpu_to_build=False,
    runs_on=RTX_RUNS_ON,
)
FLAVOURS = {flavour.name: flavour for flavour in (TENSORRT, RTX)}

INSTALL_MESSAGE = (
    "TensorRT is not installed here. TensorRT-RTX installs from PyPI "
    f"(`{RTX.install}`, or pip install -e '.[gpu]'), builds engines with or without a GPU and "
    f"runs them on compute capability {', '.join(RTX_RUNS_ON)}; full TensorRT (any NVIDIA GPU, "
    "H100 / H200 included) comes from NVIDIA's TensorRT container or `pip install tensorrt` with "
    "NVIDIA's package index. Or export without --tensorrt, or use the ONNX Runtime TensorRT "
    "execution provider options (export.tensorrt.ort_tensorrt_provider_options, with "
    "onnxruntime-gpu) to compile the ONNX graphs with TensorRT when the server loads them"
)


@dataclass(frozen=True)
class Library:
    """An imported TensorRT flavour: its module (passed to the builds as ``trt``) and version."""

    flavour: Flavour
    trt: ModuleType
    version: tuple[int, int]

    @property
    def version_text(self) -> str:
        """The module's full ``__version__``."""
        return str(self.trt.__version__)

    @property
    def strongly_typed(self) -> bool:
        """Whether precision comes from the graph alone (no FP16 builder flag)."""
        return self.flavour.strongly_typed(self.version)


def requested_flavour(requested: str | None = None) -> str:
    """The flavour asked for: ``requested``, else ``ATTNSERVE_TENSORRT_FLAVOUR``, else "auto".

    Args:
        requested: "auto", "tensorrt", "rtx" or None.

    Returns:
        one of FLAVOUR_CHOICES.

    Raises:
        TensorRTError: an unknown name (the message lists the choices).
    """
    try:
        return contract_flavour(requested)
    except ValueError as err:
        raise TensorRTError(str(err)) from err


def load_library(
    requested: str | None = None,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> Library:
    """Import the chosen TensorRT flavour and check its version and attention API.

    "auto" tries TensorRT first (it runs on every NVIDIA GPU), then TensorRT-RTX.

    Args:
        requested: "auto", "tensorrt", "rtx" or None (``requested_flavour`` decides).
        importer: imports a module by name (``importlib.import_module``).

    Returns:
        the imported library.

    Raises:
        ExportError: no candidate flavour imports (INSTALL_MESSAGE, with each import error).
        TensorRTError: an unknown flavour, a version that is too old, or bindings without the
            attention API the builds use.
    """
    name = requested_flavour(requested)
    candidates = (TENSORRT, RTX) if name == "auto" else (FLAVOURS[name],)
    failures = []
    for flavour in candidates:
        try:
            module = importer(flavour.module)
        except (ImportError, OSError) as err:  # OSError: the wheel is there, its .so is not
            failures.append(f"{flavour.module}: {err}")
            continue
        library = Library(flavour, module, flavour.version(str(module.__version__)))
        _check_attention_api(library)
        return library
    where = f"--tensorrt-flavour or {FLAVOUR_ENV}"
    asked = "" if name == "auto" else f"{FLAVOURS[name].label} was asked for ({where}). "
    raise ExportError(f"{asked}{INSTALL_MESSAGE} [{'; '.join(failures)}]")


def missing_attention_api(trt: ModuleType) -> list[str]:
    """The names of ATTENTION_API that ``trt`` lacks.

    Args:
        trt: a TensorRT or TensorRT-RTX module.

    Returns:
        dotted names, empty when the builds can find and mark the attention layers.
    """
    missing = []
    for dotted in ATTENTION_API:
        owner: object = trt
        for part in dotted.split("."):
            owner = getattr(owner, part, None)
            if owner is None:
                missing.append(dotted)
                break
    return missing


def _check_attention_api(library: Library) -> None:
    missing = missing_attention_api(library.trt)
    if missing:
        raise TensorRTError(
            f"{library.flavour.label} {library.version_text} lacks {', '.join(missing)}: the "
            f"builds need its IAttention API; install a newer one ({library.flavour.install})"
        )


def import_tensorrt(requested: str | None = None) -> ModuleType:
    """The TensorRT module of the chosen flavour (see ``load_library``).

    Args:
        requested: "auto", "tensorrt", "rtx" or None.

    Returns:
        the ``tensorrt`` or ``tensorrt_rtx_bindings`` module.

    Raises:
        ExportError: nothing to import (INSTALL_MESSAGE: what to do instead).
        TensorRTError: an unknown flavour or an unusable version.
    """
    return load_library(requested).trt


def tensorrt_version(text: str, flavour: Flavour = TENSORRT) -> tuple[int, int]:
    """(major, minor) of a flavour's version string (``Flavour.version``).

    Args:
        text: the version string, e.g. "10.14.1.48".
        flavour: the library it belongs to.

    Returns:
        (major, minor).

    Raises:
        TensorRTError: a version older than the flavour's minimum.
    """
    return flavour.version(text)
