"""``ViTForImageClassification`` -> ``models.vit.ViT``.

Pre-norm layers, a class token and learned positions: the shape of our ViT. The encoder pieces
(``vit_geometry``, ``map_vit_encoder``, ``image_preprocessing``) also serve the captioner's
ViT encoder (``export.hf.vision_encoder_decoder``). The entry carries the image processor's
steps (resize filter, mean, std) and id2label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from torch import nn

from contract.images import RESAMPLE_BY_PIL_NUMBER
from export.errors import SourceError
from export.hf.common import activation, read_json, unsupported
from export.hf.registry import ArchitectureLoader, register_architecture
from export.hf.weights import Weights, map_attention
from export.sources import EntryExtras
from models.vit import ViT, ViTConfig

_VIT = "ViTForImageClassification"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# The processors whose steps serving repeats (the PIL and torchvision backends, and the old name).
_VIT_PROCESSORS = (
    "ViTImageProcessor",
    "ViTImageProcessorPil",
    "ViTImageProcessorFast",
    "ViTFeatureExtractor",
)


@register_architecture(_VIT, model_type="vit", kind="vit")
class ViTLoader(ArchitectureLoader[ViT]):
    """ViT image classifiers (google/vit-* and the like)."""

    def make_model(self, hf_config: Any, directory: Path) -> ViT:
        """Our ViT for the HF ViT config (see ``ArchitectureLoader.make_model``)."""
        return ViT(vit_config(hf_config, directory))

    def copy_weights(self, hf_model: nn.Module, model: ViT) -> None:
        """HF ViT classifier weights -> our ViT (see ``ArchitectureLoader.copy_weights``)."""
        weights = Weights(hf_model, _VIT)
        map_vit_encoder(weights, "encoder", "vit", model.config.num_layers)
        weights.linear("head", "classifier")
        weights.load_into(model)

    def entry_extras(
        self, transformers: Any, hf_model: nn.Module, model: ViT, directory: Path
    ) -> EntryExtras:
        """The image processor's resize filter (see ``ArchitectureLoader.entry_extras``)."""
        preprocessing = image_preprocessing(directory, model.config.image_size)
        return EntryExtras(
            resample=preprocessing.resample, notes={"image_processor": vars(preprocessing)}
        )


def vit_config(hf: Any, directory: Path) -> ViTConfig:
    """Our ViTConfig for a HF ``ViTConfig`` (and preprocessor_config.json).

    Args:
        hf: The HF config.
        directory: The source directory.

    Returns:
        The config of the matching ViT classifier.

    Raises:
        SourceError: for anything our ViT cannot express.
    """
    num_labels = int(hf.num_labels)
    if num_labels < 1:
        raise unsupported(_VIT, "no classifier head (num_labels=0)")
    id2label = {int(k): str(v) for k, v in (hf.id2label or {}).items()}
    labels = tuple(id2label.get(i, str(i)) for i in range(num_labels))
    geometry = vit_geometry(_VIT, hf)
    preprocessing = image_preprocessing(directory, geometry["image_size"])
    return ViTConfig(
        **geometry,
        d_model=int(hf.hidden_size),
        num_heads=int(hf.num_attention_heads),
        num_layers=int(hf.num_hidden_layers),
        ffn_dim=int(hf.intermediate_size),
        num_classes=num_labels,
        dropout=0.0,
        activation=activation(_VIT, hf.hidden_act, "hidden_act"),
        layer_norm_eps=float(hf.layer_norm_eps),
        labels=labels,
        image_mean=preprocessing.mean,
        image_std=preprocessing.std,
    )


def vit_geometry(architecture: str, hf: Any) -> dict[str, Any]:
    """The ViT encoder fields shared by ViTConfig and CaptionerConfig.

    Args:
        architecture: The HF architecture name (for messages).
        hf: The HF ViT config (of the classifier, or of a captioner's encoder).

    Returns:
        ``image_size``, ``patch_size`` and ``num_channels`` for our config.

    Raises:
        SourceError: for non-square images or patches, patches that do not tile the image, a
            head_dim that does not split the width, or other than 3 channels.
    """
    image_size = _square(architecture, "image_size", hf.image_size)
    patch_size = _square(architecture, "patch_size", hf.patch_size)
    if int(hf.num_channels) != 3:
        raise unsupported(architecture, f"num_channels={hf.num_channels} (serving feeds RGB)")
    head_dim = getattr(hf, "head_dim", None)
    if head_dim is not None and head_dim * hf.num_attention_heads != hf.hidden_size:
        raise unsupported(architecture, f"head_dim={head_dim} * heads != hidden_size")
    if image_size % patch_size:
        raise unsupported(architecture, f"image_size {image_size} % patch_size {patch_size} != 0")
    return {"image_size": image_size, "patch_size": patch_size, "num_channels": 3}


def _square(architecture: str, field: str, value: Any) -> int:
    """One side of a square size given as an int or a pair; refuses rectangles."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise unsupported(architecture, f"non-square {field}={list(value)}")
        value = value[0]
    return int(value)


@dataclass(frozen=True)
class ImagePreprocessing:
    """An image processor's steps in serving's terms: resize (filter), ``(x/255 - mean) / std``."""

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    resample: str = "bilinear"


def image_preprocessing(directory: Path, image_size: int | None = None) -> ImagePreprocessing:
    """A ViT image processor's preprocessor_config.json as serving's preprocessing.

    Serving decodes, converts to RGB, resizes to ``image_size`` x ``image_size`` with the
    processor's PIL filter, divides by 255 and normalises: the steps of ``ViTImageProcessor``.

    Args:
        directory: The source directory.
        image_size: The model's image side; the processor must resize to it (None: unchecked).

    Returns:
        Mean, std and resize filter; ViTImageProcessor's defaults (0.5, 0.5, bilinear) when
        there is no preprocessor_config.json.

    Raises:
        SourceError: For a processor other than ViT's, a step serving does not do (no resize,
            a centre crop, another rescale factor) or a size other than the model's.
    """
    path = directory / PREPROCESSOR_CONFIG
    if not path.is_file():
        return ImagePreprocessing()
    data = read_json(path)
    kind = data.get("image_processor_type") or data.get("feature_extractor_type")
    if kind is not None and kind not in _VIT_PROCESSORS:
        raise _refused(path, f"{kind} (serving preprocesses as ViTImageProcessor does)")
    if not data.get("do_resize", True) or data.get("do_center_crop"):
        raise _refused(path, "no resize or a centre crop (serving resizes to the model's size)")
    if image_size is not None and _side(data.get("size", image_size)) != image_size:
        raise _refused(path, f"size {data.get('size')!r} (the model takes {image_size} px)")
    rescale = float(data.get("rescale_factor", 1 / 255)) if data.get("do_rescale", True) else 1.0
    if not math.isclose(rescale, 1 / 255, rel_tol=1e-6):
        raise _refused(path, f"rescale factor {rescale} (serving divides pixels by 255)")
    resample = data.get("resample", int(Image.Resampling.BILINEAR))
    if resample not in RESAMPLE_BY_PIL_NUMBER:
        raise _refused(path, f"resample {resample!r} (PIL filters: {RESAMPLE_BY_PIL_NUMBER})")
    if not data.get("do_normalize", True):
        return ImagePreprocessing((0.0,) * 3, (1.0,) * 3, RESAMPLE_BY_PIL_NUMBER[resample])
    mean, std = _per_channel(path, data, "image_mean"), _per_channel(path, data, "image_std")
    return ImagePreprocessing(mean, std, RESAMPLE_BY_PIL_NUMBER[resample])


def image_normalisation(directory: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pixel mean and std of ``image_preprocessing`` (0.5 each without preprocessor_config.json).

    Raises:
        SourceError: As ``image_preprocessing``.
    """
    preprocessing = image_preprocessing(directory)
    return preprocessing.mean, preprocessing.std


def _side(size: Any) -> int | None:
    """The square side of a processor's ``size`` (int, or height == width); None otherwise."""
    if isinstance(size, int):
        return size
    if isinstance(size, dict) and set(size) == {"height", "width"}:
        return int(size["height"]) if size["height"] == size["width"] else None
    return None


def _refused(path: Path, what: str) -> SourceError:
    """The error for a preprocessor_config.json serving cannot follow."""
    return SourceError(f"unsupported {path.name} in {path.parent}: {what}")


def _per_channel(path: Path, data: dict[str, Any], field: str) -> tuple[float, ...]:
    """A per-channel value of the preprocessor config (a scalar means the same for all three)."""
    value = data.get(field, 0.5)
    values = [value] * 3 if isinstance(value, (int, float)) else list(value)
    if len(values) != 3:
        raise SourceError(f"{field} in {path} must have 3 entries, got {value!r}")
    return tuple(float(v) for v in values)


def map_vit_encoder(weights: Weights, ours: str, theirs: str, num_layers: int) -> None:
    """HF ViTModel (prefix ``theirs``) -> our VisionEncoder (prefix ``ours``).

    Args:
        weights: The mapping being assembled.
        ours: Our VisionEncoder's prefix.
        theirs: The HF ViTModel's prefix ("vit" in the classifier, "encoder" in a captioner).
        num_layers: The encoder layer count.

    Raises:
        SourceError: when an expected HF weight is missing.
    """
    weights.copy(f"{ours}.cls_token", f"{theirs}.embeddings.cls_token")
    positions = weights.get(f"{theirs}.embeddings.position_embeddings")  # (1, N + 1, D)
    weights.ours[f"{ours}.positions.weight"] = positions.reshape(-1, positions.shape[-1])
    patches = f"{theirs}.embeddings.patch_embeddings.projection"
    weights.linear(f"{ours}.patch_embed.projection", patches)
    for i in range(num_layers):
        dst, src = f"{ours}.encoder.layers.{i}", f"{theirs}.layers.{i}"
        map_attention(weights, f"{dst}.self_attn", f"{src}.attention", out_name="o_proj")
        weights.layer_norm(f"{dst}.self_attn_norm", f"{src}.layernorm_before")
        weights.linear(f"{dst}.ffn.fc1", f"{src}.mlp.fc1")
        weights.linear(f"{dst}.ffn.fc2", f"{src}.mlp.fc2")
        weights.layer_norm(f"{dst}.ffn_norm", f"{src}.layernorm_after")
    weights.layer_norm(f"{ours}.encoder.final_norm", f"{theirs}.layernorm")
