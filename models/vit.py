"""Vision Transformer: patch embedding, class token, learned positions, classifier head.

``VisionEncoder`` (everything but the head) is shared with the captioner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from models.config import pick_preset
from models.layers import EncoderStack, LearnedPositions


@dataclass(frozen=True)
class ViTConfig:
    """Shape of a ViT classifier."""

    image_size: int = 224  # square input, pixels a side
    patch_size: int = 16  # square patches; image_size must be a multiple
    num_channels: int = 3
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    ffn_dim: int = 3072
    num_classes: int = 1000
    dropout: float = 0.0  # training only
    activation: str = "gelu"
    layer_norm_eps: float = 1e-6
    labels: tuple[str, ...] = ()  # class names, in logit order ('' when unnamed)
    # Pixel normalisation, applied by the preprocessing before the model: (x / 255 - mean) / std.
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}"
            )
        if self.labels and len(self.labels) != self.num_classes:
            raise ValueError(f"{len(self.labels)} labels for {self.num_classes} classes")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


PRESETS: dict[str, ViTConfig] = {
    "base": ViTConfig(),
    # The shipped digits classifier (~1.8 M parameters, 3x32x32 input, 64 patches).
    "digits": ViTConfig(
        image_size=32,
        patch_size=4,
        d_model=192,
        num_heads=3,
        num_layers=4,
        ffn_dim=768,
        num_classes=10,
        dropout=0.0,  # augmentation + label smoothing regularise; dropout cost 20% of a step
        labels=tuple(str(d) for d in range(10)),
    ),
    "tiny": ViTConfig(
        image_size=16,
        patch_size=4,
        d_model=32,
        num_heads=4,
        num_layers=2,
        ffn_dim=64,
        num_classes=10,
    ),
}


def preset(name: str, **overrides: Any) -> ViTConfig:
    """A named preset, optionally with some fields replaced (ValueError names the known ones)."""
    return pick_preset(PRESETS, "vit", name, **overrides)


class PatchEmbedding(nn.Module):
    """Non-overlapping patches, each flattened and projected to d_model by one matmul.

    This is what a strided convolution computes, written as a reshape and a matmul on purpose:
    ONNX Runtime's CUDA convolution builds new cuDNN plans whenever its input shape changes,
    which a served batch does whenever its size does (measured on an H100 and an H200: about
    30 ms per change of batch size, against 1 ms for the batch). A matmul has no such state.
    Checkpoints saved with the convolution's (D, C, p, p) weight load unchanged.
    """

    def __init__(self, num_channels: int, patch_size: int, dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Linear(num_channels * patch_size * patch_size, dim)
        self.register_load_state_dict_pre_hook(_flatten_conv_weight)

    def forward(self, pixel_values: Tensor) -> Tensor:
        _, channels, height, width = pixel_values.shape
        p = self.patch_size
        rows, columns = height // p, width // p
        x = pixel_values.reshape(-1, channels, rows, p, columns, p)
        x = x.permute(0, 2, 4, 1, 3, 5).reshape(-1, rows * columns, channels * p * p)
        # fp32 in: an fp16 export's pixels are fp16, its residual stream fp32 (export.precision)
        return self.projection(x.float())  # (B, N, D), patches in row-major order


def _flatten_conv_weight(
    module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *_: Any
) -> None:
    """A checkpoint's convolution weight (D, C, p, p) as the projection's (D, C * p * p)."""
    key = f"{prefix}projection.weight"
    weight = state_dict.get(key)
    if weight is not None and weight.dim() == 4:
        state_dict[key] = weight.flatten(1)


class VisionEncoder(nn.Module):
    """Patches + class token + learned positions + pre-norm encoder stack."""

    def __init__(
        self,
        *,
        image_size: int,
        patch_size: int,
        num_channels: int,
        dim: int,
        num_heads: int,
        num_layers: int,
        ffn_dim: int,
        dropout: float,
        activation: str,
        layer_norm_eps: float,
    ) -> None:
        super().__init__()
        self.patch_embed = PatchEmbedding(num_channels, patch_size, dim)
        num_patches = (image_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.positions = LearnedPositions(num_patches + 1, dim)
        self.register_buffer("position_ids", torch.arange(num_patches + 1)[None], persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder = EncoderStack(
            dim=dim,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            num_layers=num_layers,
            norm_first=True,
            activation=activation,
            dropout=dropout,
            layer_norm_eps=layer_norm_eps,
        )

    def forward(self, pixel_values: Tensor) -> Tensor:
        """(B, C, H, W) normalised pixels -> (B, 1 + N, D) states, class token first."""
        patches = self.patch_embed(pixel_values)  # (B, N, D)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, D)
        x = torch.cat([cls, patches], dim=1) + self.positions(self.position_ids)
        return self.encoder(self.dropout(x))


class ViT(nn.Module):
    """ViT image classifier: logits from the class token."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.encoder = VisionEncoder(
            image_size=c.image_size,
            patch_size=c.patch_size,
            num_channels=c.num_channels,
            dim=c.d_model,
            num_heads=c.num_heads,
            num_layers=c.num_layers,
            ffn_dim=c.ffn_dim,
            dropout=c.dropout,
            activation=c.activation,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.head = nn.Linear(c.d_model, c.num_classes)

    def forward(self, pixel_values: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, num_classes)."""
        return self.head(self.encoder(pixel_values)[:, 0])
