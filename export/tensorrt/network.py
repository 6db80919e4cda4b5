"""The steps around one engine build: logger, ONNX parser, builder config, engine inspection.

Shared by both TensorRT flavours (the module comes in as ``trt``, the flavour in a ``Library``);
``export.tensorrt.build`` strings them together. Nothing here imports TensorRT itself.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contract.model_config import ModelConfig
from export.tensorrt.errors import TensorRTError
from export.tensorrt.library import Library
from export.tensorrt.profiles import Profile, profiles_for

WORKSPACE_BYTES = 2 << 30  # builder workspace (TensorRT) / trt_max_workspace_size (ORT EP)
TIMING_CACHE_FILE = "timing.cache"
FUSED_LAYER_MARKERS = ("attention", "mha", "fmha")  # layer names / types of fused attention
INSPECTOR = "engine inspector"  # layers_source when the built engine was inspected
NETWORK = "network"  # layers_source when only the parsed network's layers could be listed


def collecting_logger(trt: Any) -> Any:
    """A ``trt.ILogger`` that prints warnings and keeps errors for exception messages.

    Args:
        trt: the TensorRT module (either flavour).

    Returns:
        the logger; ``errors()`` joins the last errors, ``clear()`` forgets them, and inside
        ``quiet()`` nothing is printed (probes whose failure is an answer, not a problem).
    """

    class CollectingLogger(trt.ILogger):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []
            self.muted = False

        def log(self, severity: Any, msg: str) -> None:
            failed = severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR)
            if failed and not self.muted:
                self.messages.append(msg)
            if (failed or severity == trt.ILogger.WARNING) and not self.muted:
                print(f"[{trt.__name__}] {msg}", file=sys.stderr, flush=True)

        def errors(self) -> str:
            return "; ".join(self.messages[-5:])

        def clear(self) -> None:
            self.messages.clear()

        @contextlib.contextmanager
        def quiet(self) -> Iterator[None]:
            self.muted = True
            try:
                yield
            finally:
                self.muted = False

    return CollectingLogger()


def parse(trt: Any, network: Any, logger: Any, path: Path) -> None:
    """Parse ``path`` into ``network``.

    Args:
        trt: the TensorRT module.
        network: an empty ``INetworkDefinition``.
        logger: from ``collecting_logger``.
        path: the ONNX file (external weights next to it are found by its path).

    Raises:
        TensorRTError: the parser's errors, naming the file.
    """
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(path.read_bytes(), str(path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TensorRTError(
            f"TensorRT's ONNX parser rejected {path.name}: {'; '.join(errors) or logger.errors()}"
        )


def configure(
    library: Library,
    builder: Any,
    network: Any,
    config: ModelConfig,
    graph: str,
    filename: str,
    fp16_flag: bool,
    timing_cache: Path | None,
) -> Any:
    """The builder config of one graph: workspace, verbosity, precision flag, profile, cache.

    Args:
        library: the TensorRT flavour.
        builder: its ``Builder``.
        network: the parsed network.
        config: the model's config (the profile comes from ``profiles_for``).
        graph: the graph name.
        filename: its ONNX file, for messages.
        fp16_flag: set ``BuilderFlag.FP16`` (weakly typed TensorRT 10 only).
        timing_cache: VERSION/timing.cache to reuse and extend; None where the flavour's timing
            cache does nothing (TensorRT-RTX).

    Returns:
        the ``IBuilderConfig``.

    Raises:
        TensorRTError: a network input without a profile, or a refused profile.
    """
    trt = library.trt
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    builder_config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if fp16_flag:  # TensorRT 10 only: BuilderFlag.FP16 is gone from 11 and TensorRT-RTX
        builder_config.set_flag(trt.BuilderFlag.FP16)
    _add_profile(builder, builder_config, network, profiles_for(config, graph), filename)
    if timing_cache is not None:
        _load_timing_cache(builder_config, timing_cache)
    return builder_config


def _add_profile(
    builder: Any, builder_config: Any, network: Any, profile: Profile, filename: str
) -> None:
    """One optimisation profile over the network's inputs."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    missing = [t.name for t in inputs if t.name not in profile]
    if missing:
        raise TensorRTError(f"{filename}: TensorRT network inputs {missing} have no profile")
    optimisation = builder.create_optimization_profile()
    for tensor in inputs:
        low, opt, high = profile[tensor.name]
        optimisation.set_shape(tensor.name, low, opt, high)
    if builder_config.add_optimization_profile(optimisation) < 0:
        raise TensorRTError(f"{filename}: TensorRT refused the optimisation profile {profile}")


def _load_timing_cache(builder_config: Any, path: Path) -> None:
    """Reuse VERSION/timing.cache when it was made on this GPU and TensorRT; else start fresh."""
    blob = path.read_bytes() if path.is_file() else b""
    cache = builder_config.create_timing_cache(blob)
    if not builder_config.set_timing_cache(cache, ignore_mismatch=False):
        builder_config.set_timing_cache(builder_config.create_timing_cache(b""), False)


def engine_layers(
    library: Library, logger: Any, plan: bytes, network: Any, graph: str
) -> tuple[list[Any], str]:
    """The built engine's layers from the engine inspector, or the network's where it cannot run.

    TensorRT builds on the GPU it targets, so its engines always load here. TensorRT-RTX builds
    without a GPU, and its runtime refuses GPUs outside ``Flavour.runs_on``: there the engine is
    not inspected and the parsed network's layers (before fusion) are listed instead.

    Args:
        library: the TensorRT flavour.
        logger: from ``collecting_logger``.
        plan: the serialized engine.
        network: the network it was built from.
        graph: the graph name, for messages.

    Returns:
        (layers, source): the inspector's "Layers" list and "engine inspector", or
        [{"Name", "LayerType"}] of the network and "network (engine not inspected: WHY)".

    Raises:
        TensorRTError: a TensorRT (not RTX) engine that cannot be deserialized right after its
            build.
    """
    trt = library.trt
    runtime = trt.Runtime(logger)
    reason = _cannot_run_here(trt, runtime, logger, plan)
    if reason is None:
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is not None:
            inspector = engine.create_engine_inspector()
            info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
            return list(info.get("Layers", [])) if isinstance(info, dict) else list(info), INSPECTOR
        reason = f"not deserializable here: {logger.errors() or '?'}"
    if library.flavour.needs_gpu_to_build:
        raise TensorRTError(f"the {graph} engine just built cannot be deserialized: {reason}")
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    listed = [{"Name": str(layer.name), "LayerType": str(layer.type)} for layer in layers]
    return listed, f"{NETWORK} (engine not inspected: {reason})"


def _cannot_run_here(trt: Any, runtime: Any, logger: Any, plan: bytes) -> str | None:
    """Why the engine cannot run on this machine (``Runtime.get_engine_validity``), else None.

    Only TensorRT-RTX has ``get_engine_validity``; TensorRT's engines are deserialized directly.
    """
    validity = getattr(runtime, "get_engine_validity", None)
    if validity is None:
        return None
    with logger.quiet():  # on a machine without a GPU the check logs CUDA errors
        state, diagnostics = validity(plan)
    if state == trt.EngineValidity.INVALID:
        flags = getattr(trt, "EngineInvalidityDiagnostics", None)
        names = [
            name
            for name, flag in (flags.__members__.items() if flags is not None else ())
            if int(diagnostics) & int(flag.value)
        ]
        return f"{trt.__name__} reports it invalid on this machine ({', '.join(names) or 'no GPU'})"
    return None


def count_fused_attention(layers: list[Any]) -> int:
    """Layers whose name, type or tactic mentions attention / MHA / fmha.

    Args:
        layers: the "Layers" list of the engine inspector's JSON (dicts or names).

    Returns:
        how many inspector layers name attention (fused kernels, and decomposed layers that keep
        the ONNX node's name: the build report's "fused_attention" is the exact list).
    """

    def text(layer: Any) -> str:
        if isinstance(layer, str):
            return layer.lower()
        fields = ("Name", "LayerType", "TacticName", "Metadata")
        return " ".join(str(layer.get(k, "")) for k in fields).lower()

    return sum(1 for layer in layers if any(m in text(layer) for m in FUSED_LAYER_MARKERS))
