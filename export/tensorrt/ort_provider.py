"""ONNX Runtime's TensorRT execution provider: the second GPU route, with the same profiles.

Instead of prebuilt ``{graph}.plan`` files, ONNX Runtime compiles the ONNX graphs with TensorRT when
the server loads them (then falls back to CUDA, then CPU). The options here give that EP the
optimisation profile ``build_engines`` would use, as ONNX Runtime's profile shape strings. Nothing
here imports TensorRT or ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.graphs import graph_files
from contract.model_config import ModelConfig
from export.tensorrt.network import WORKSPACE_BYTES
from export.tensorrt.profiles import Profile, Shape, profiles_for


def ort_tensorrt_provider_options(
    config: ModelConfig,
    cache_dir: Path,
    fp16: bool,
    graph: str | None = None,
    device_id: int = 0,
) -> list[tuple[str, dict[str, Any]]]:
    """Execution providers for one graph's ONNX Runtime session: TensorRT, then CUDA, then CPU.

    The TensorRT EP gets the same profile as ``build_engines`` (``trt_profile_*_shapes`` strings
    "name:1x3x32x32,name2:..."), engine and timing caches under ``cache_dir``, and a workspace
    limit. Encoder and decoder share input names with different shapes, so each graph needs its
    own session options.

    Args:
        config: the model's config.yaml.
        cache_dir: folder for the EP's engine and timing caches (created by ONNX Runtime).
        fp16: let TensorRT lower an fp32 graph to fp16 (TensorRT 10; TensorRT 11 takes precision
            from the graph, so pass False and export with --precision fp16).
        graph: "encoder" / "decoder" (seq2seq), "model" (the default for classifiers).
        device_id: the CUDA device.

    Returns:
        [("TensorrtExecutionProvider", {...}), ("CUDAExecutionProvider", {...}),
         ("CPUExecutionProvider", {})], for InferenceSession(providers=...).

    Raises:
        ValueError: no graph given for a seq2seq model, or an unknown graph.
    """
    profile = profiles_for(config, _graph_or_only(config, graph))
    cache = str(cache_dir)
    tensorrt = {
        "device_id": device_id,
        "trt_fp16_enable": bool(fp16),
        "trt_max_workspace_size": WORKSPACE_BYTES,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": cache,
        "trt_profile_min_shapes": profile_shapes_string(profile, 0),
        "trt_profile_opt_shapes": profile_shapes_string(profile, 1),
        "trt_profile_max_shapes": profile_shapes_string(profile, 2),
    }
    cuda = {
        "device_id": device_id,
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "do_copy_in_default_stream": True,
    }
    return [
        ("TensorrtExecutionProvider", tensorrt),
        ("CUDAExecutionProvider", cuda),
        ("CPUExecutionProvider", {}),
    ]


def _graph_or_only(config: ModelConfig, graph: str | None) -> str:
    """``graph`` when given, else the model's only graph (seq2seq graphs need one chosen)."""
    if graph is not None:
        return graph
    files = graph_files(config.kind)
    if len(files) != 1:
        raise ValueError(
            f"a {config.kind} model has graphs {list(files)} with different inputs; pass "
            "graph= to get each session's provider options"
        )
    return next(iter(files))


def profile_shapes_string(profile: Profile, corner: int) -> str:
    """ONNX Runtime's profile format: "name:1x3x32x32,name2:2x7" for one corner.

    Args:
        profile: input name -> (min, opt, max).
        corner: 0 (min), 1 (opt) or 2 (max).

    Returns:
        the trt_profile_{min,opt,max}_shapes value.
    """
    return ",".join(
        f"{name}:{'x'.join(str(d) for d in shapes[corner])}" for name, shapes in profile.items()
    )


def parse_profile_shapes(text: str) -> dict[str, Shape]:
    """Inverse of ``profile_shapes_string``: "a:1x2,b:3" -> {"a": (1, 2), "b": (3,)}.

    Args:
        text: a trt_profile_{min,opt,max}_shapes value.

    Returns:
        input name -> shape.

    Raises:
        ValueError: a malformed entry.
    """
    shapes: dict[str, Shape] = {}
    for entry in filter(None, text.split(",")):
        name, sep, dims = entry.rpartition(":")
        if not sep or not name:
            raise ValueError(f"profile entry {entry!r} is not NAME:DxDx...")
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes
