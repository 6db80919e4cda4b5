"""Optimisation profiles: min / opt / max input shapes of each graph, from config.yaml.

The dynamic axes (batch, source, past and new-token lengths) follow the model's limits; the fixed
axes (heads, head_dim, image channels and size) its decoder and image sections. TensorRT builds
(``export.tensorrt.build``), the structure checks (``export.tensorrt.structure``) and the ONNX
Runtime TensorRT EP options (``export.tensorrt.ort_provider``) all use these profiles.
"""

from __future__ import annotations

from collections.abc import Mapping

from contract.graphs import DECODER_INPLACE, kv_names
from contract.model_config import ClassifierConfig, ModelConfig
from export.tensorrt.errors import TensorRTError

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)
Corners = tuple[int, int, int]  # one axis at the min, opt and max corner of a profile

OPT_BATCH = 8  # the batch TensorRT tunes its kernels for (capped by limits.max_batch_size)

# What each profile axis is derived from in config.yaml (quoted in error messages).
AXIS_SOURCES = {
    "batch": "limits.max_batch_size",
    "source": "limits.max_source_length",
    "past": "decoder.max_positions and limits.max_new_tokens",
    "new": "new tokens per decoder call",
    "total": "past + new tokens",
    "heads": "decoder.num_heads",
    "head_dim": "decoder.head_dim",
    "channels": "the length of image.mean",
    "height": "image.size",
    "width": "image.size",
    "step": "one new token per in-place decoder step",
    "capacity": "decoder.max_positions (the in-place cache's positions per row)",
}


def profiles_for(config: ModelConfig, graph: str, *, new_tokens: int = 1) -> Profile:
    """Min / opt / max shapes of every input of ``graph``, in the graph's input order.

    Dynamic axes follow the limits: batch 1..limits.max_batch_size (opt min(8, max)); source
    1..limits.max_source_length (fixed for image encoders); past 0..min(decoder.max_positions -
    new_tokens, limits.max_new_tokens); new tokens 1..new_tokens (1: a decode-step profile, larger:
    a prefill profile); the self-attention mask spans past + new at every corner; the in-place
    decoder's cache capacity 1..decoder.max_positions. Fixed axes (heads, head_dim, image
    channels / size) come from config.decoder and config.image. Each corner (min, opt, max) is
    one consistent set of shapes, as TensorRT checks the network at each.

    Args:
        config: the model's config.yaml.
        graph: "encoder", "decoder" or "decoder_inplace" (seq2seq), "model" (classifier).
        new_tokens: most tokens one decoder call feeds (decoder only).

    Returns:
        input name -> (min, opt, max) shapes.

    Raises:
        ValueError: an unknown graph for this model, or new_tokens out of range.
    """
    templates = input_axes(config, graph)
    axes = _axes(config, graph, new_tokens)
    return {name: _corners(template, axes) for name, template in templates.items()}


def validate_profile(profile: Profile, where: str = "profile") -> None:
    """Check min <= opt <= max on every axis, equal ranks, no negative sizes.

    Args:
        profile: input name -> (min, opt, max).
        where: what the profile belongs to, for the message (e.g. "decoder.onnx").

    Raises:
        TensorRTError: naming the input and axis.
    """
    for name, (low, opt, high) in profile.items():
        if not len(low) == len(opt) == len(high):
            raise TensorRTError(
                f"{where}: input {name!r} has shapes of different ranks in its profile: "
                f"min {low}, opt {opt}, max {high}"
            )
        for axis, (a, b, c) in enumerate(zip(low, opt, high, strict=True)):
            if not 0 <= a <= b <= c:
                raise TensorRTError(
                    f"{where}: input {name!r} axis {axis} needs 0 <= min <= opt <= max, "
                    f"got {a} / {b} / {c}"
                )


def profile_as_json(profile: Profile) -> dict[str, dict[str, list[int]]]:
    """A profile as manifest.json records it.

    Args:
        profile: input name -> (min, opt, max).

    Returns:
        ``{name: {"min": [...], "opt": [...], "max": [...]}}``.
    """
    return {
        name: {"min": list(low), "opt": list(opt), "max": list(high)}
        for name, (low, opt, high) in profile.items()
    }


def input_axes(config: ModelConfig, graph: str) -> dict[str, tuple[str, ...]]:
    """The axis symbols of every input of ``graph``, in the graph's input order.

    The symbols ("batch", "source", "past", "heads", ...) are the keys of ``AXIS_SOURCES``; the
    structure checks use them to say which config.yaml field a mismatching axis comes from.

    Args:
        config: the model's config.yaml.
        graph: "encoder", "decoder" or "decoder_inplace" (seq2seq), "model" (classifier).

    Returns:
        input name -> one axis symbol per axis.

    Raises:
        ValueError: an unknown graph for this model.
    """
    image = ("batch", "channels", "height", "width")
    if isinstance(config, ClassifierConfig):
        if graph != "model":
            raise ValueError(f"a classifier has one graph, 'model'; got {graph!r}")
        return {"pixel_values": image}
    if graph == "encoder":
        if config.input == "image":
            return {"pixel_values": image}
        return {"input_ids": ("batch", "source"), "attention_mask": ("batch", "source")}
    if graph == DECODER_INPLACE:
        return _inplace_axes(config.decoder.num_layers)
    if graph != "decoder":
        raise ValueError(
            f"a seq2seq model has graphs 'encoder', 'decoder' and {DECODER_INPLACE!r}; "
            f"got {graph!r}"
        )
    layers = config.decoder.num_layers
    templates: dict[str, tuple[str, ...]] = {
        "input_ids": ("batch", "new"),
        "position_ids": ("batch", "new"),
        "self_attention_mask": ("batch", "total"),
        "cross_attention_mask": ("batch", "source"),
    }
    templates.update(
        dict.fromkeys(kv_names("past", layers), ("batch", "heads", "past", "head_dim"))
    )
    templates.update(
        dict.fromkeys(kv_names("cross", layers), ("batch", "heads", "source", "head_dim"))
    )
    return templates


def _inplace_axes(layers: int) -> dict[str, tuple[str, ...]]:
    """Axis symbols of the in-place decoder's inputs (contract.graphs: decoder_inplace)."""
    templates: dict[str, tuple[str, ...]] = {
        "input_ids": ("batch", "step"),
        "cache_lengths": ("batch",),
        "cross_lengths": ("batch",),
    }
    templates.update(
        dict.fromkeys(kv_names("past", layers), ("batch", "heads", "capacity", "head_dim"))
    )
    templates.update(
        dict.fromkeys(kv_names("cross", layers), ("batch", "heads", "source", "head_dim"))
    )
    return templates


def _axes(config: ModelConfig, graph: str, new_tokens: int) -> dict[str, Corners]:
    """Axis symbol -> (min, opt, max) for one graph."""
    limits = config.limits
    batch = limits.max_batch_size
    axes: dict[str, Corners] = {"batch": (1, min(OPT_BATCH, batch), batch)}
    if config.image is not None:
        size = config.image.size
        axes.update(
            channels=_fixed(len(config.image.mean)), height=_fixed(size), width=_fixed(size)
        )
    if isinstance(config, ClassifierConfig):
        return axes
    source = config.limits.max_source_length
    # Image encoders have a fixed number of positions (patches + class token).
    axes["source"] = _fixed(source) if config.input == "image" else _span(1, source)
    decoder = config.decoder
    if graph == DECODER_INPLACE:
        axes.update(
            step=_fixed(1),
            capacity=_span(1, decoder.max_positions),
            heads=_fixed(decoder.num_heads),
            head_dim=_fixed(decoder.head_dim),
        )
        return axes
    if graph != "decoder":
        return axes
    if not 1 <= new_tokens < decoder.max_positions:
        raise ValueError(
            f"new_tokens must be between 1 and decoder.max_positions - 1 "
            f"({decoder.max_positions - 1}), got {new_tokens}"
        )
    past_max = min(decoder.max_positions - new_tokens, config.limits.max_new_tokens)
    past = _span(0, past_max)
    new = (1, 1, new_tokens)  # decode steps (one new token) are what the engine is tuned for
    axes.update(
        past=past,
        new=new,
        total=(past[0] + new[0], past[1] + new[1], past[2] + new[2]),
        heads=_fixed(decoder.num_heads),
        head_dim=_fixed(decoder.head_dim),
    )
    return axes


def _fixed(size: int) -> Corners:
    return (size, size, size)


def _span(low: int, high: int) -> Corners:
    """A dynamic axis: opt halfway (TensorRT tunes for opt, and must serve min..max)."""
    return (low, max(low, (low + high) // 2), high)


def _corners(template: tuple[str, ...], axes: Mapping[str, Corners]) -> tuple[Shape, Shape, Shape]:
    return (
        tuple(axes[s][0] for s in template),
        tuple(axes[s][1] for s in template),
        tuple(axes[s][2] for s in template),
    )
