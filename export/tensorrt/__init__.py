"""TensorRT: optimisation profiles, structure checks, engine builds and ORT TensorRT EP options.

One module per job; this package exports their public names:

- ``library``: ``load_library(flavour)``, the one place TensorRT is imported. Two flavours share
  one code path: TensorRT >= 10.14 (module ``tensorrt``) and TensorRT-RTX (module
  ``tensorrt_rtx_bindings``, pip-installable); a ``Flavour`` holds their differences (module,
  version rules, strong typing, timing cache, GPU-less builds, the GPUs engines run on). Chosen
  by argument, ``ATTNSERVE_TENSORRT_FLAVOUR`` (auto | tensorrt | rtx) or what is installed.
- ``profiles``: ``profiles_for(config, graph)``, the min / opt / max shapes of every input of a
  graph, derived from the model's limits in config.yaml (batch, source, past and new-token
  lengths) and its fixed sizes (heads, head_dim, image channels and size).
- ``structure``: ``check_structure(version_dir, config)``, what can be checked without TensorRT,
  with onnx only: every graph holds standard ONNX ``Attention`` nodes (TensorRT >= 10.14 parses
  them into its fused attention layer), head sizes are multiples of 8, and the profiles agree with
  the graphs' inputs.
- ``build``: ``build_engines(version_dir, loaded, options)``, one serialized engine
  ``{graph}.plan`` per graph and its build report (flavour, version, layers, which attention
  layers got fused kernels, build time, engine size); called by ``export.exporter`` for
  ``--tensorrt``. ``network`` holds the steps of one build (logger, parser, builder config,
  inspection), ``attention`` the parsed attention layers (decomposable where no fused kernel
  fits), ``collect`` gathers the reports of the shipped models into one JSON.
- ``ort_provider``: ``ort_tensorrt_provider_options(config, cache_dir, fp16, graph)``, the second
  GPU route, ONNX Runtime's TensorRT execution provider (then CUDA, then CPU) with the same
  profiles.

``errors`` holds ``TensorRTError``. Importing this package imports neither torch nor TensorRT
(TensorRT is imported when ``build_engines`` runs, ``onnx`` inside ``check_structure``).
"""

from __future__ import annotations

from export.tensorrt.build import build_engines, build_graph
from export.tensorrt.errors import TensorRTError
from export.tensorrt.library import (
    FLAVOUR_CHOICES,
    FLAVOUR_ENV,
    FLAVOURS,
    INSTALL_MESSAGE,
    MIN_TENSORRT,
    RTX,
    TENSORRT,
    Flavour,
    Library,
    import_tensorrt,
    load_library,
    requested_flavour,
)
from export.tensorrt.network import (
    FUSED_LAYER_MARKERS,
    TIMING_CACHE_FILE,
    WORKSPACE_BYTES,
    count_fused_attention,
)
from export.tensorrt.ort_provider import (
    ort_tensorrt_provider_options,
    parse_profile_shapes,
    profile_shapes_string,
)
from export.tensorrt.profiles import (
    AXIS_SOURCES,
    OPT_BATCH,
    Corners,
    Profile,
    Shape,
    profile_as_json,
    profiles_for,
    validate_profile,
)
from export.tensorrt.structure import HEAD_DIM_MULTIPLE, check_structure

__all__ = [
    "AXIS_SOURCES",
    "FLAVOURS",
    "FLAVOUR_CHOICES",
    "FLAVOUR_ENV",
    "FUSED_LAYER_MARKERS",
    "HEAD_DIM_MULTIPLE",
    "INSTALL_MESSAGE",
    "MIN_TENSORRT",
    "OPT_BATCH",
    "RTX",
    "TENSORRT",
    "TIMING_CACHE_FILE",
    "WORKSPACE_BYTES",
    "Corners",
    "Flavour",
    "Library",
    "Profile",
    "Shape",
    "TensorRTError",
    "build_engines",
    "build_graph",
    "check_structure",
    "count_fused_attention",
    "import_tensorrt",
    "load_library",
    "ort_tensorrt_provider_options",
    "parse_profile_shapes",
    "profile_as_json",
    "profile_shapes_string",
    "profiles_for",
    "requested_flavour",
    "validate_profile",
]
