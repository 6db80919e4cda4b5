"""Image captioner: the ViT encoder + the translator's Transformer decoder with cross-attention.

It honours the same ONNX contract as the translator: ``encode`` takes pixels and returns the
encoder states and every decoder layer's cross keys/values; ``decode_step`` is identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from models.config import pick_preset
from models.layers import EncoderDecoderModel, KVCache, TransformerDecoder
from models.vit import VisionEncoder


@dataclass(frozen=True)
class CaptionerConfig:
    """Shape of a captioner; encoder and decoder share d_model (no cross-attention bridge)."""

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    d_model: int = 512
    num_heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    ffn_dim: int = 2048
    vocab_size: int = 8000
    max_positions: int = 128  # decoder position table
    dropout: float = 0.0
    activation: str = "gelu"
    layer_norm_eps: float = 1e-6
    pad_id: int = 0
    eos_id: int = 2
    decoder_start_id: int = 1
    max_target_length: int = 64  # serving limit on new tokens
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}"
            )

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_layers(self) -> int:
        return self.decoder_layers


PRESETS: dict[str, CaptionerConfig] = {
    "base": CaptionerConfig(),
    # The shipped shapes captioner: 48x48 scenes, 36 patches.
    "shapes": CaptionerConfig(
        image_size=48,
        patch_size=8,
        d_model=192,
        num_heads=4,
        encoder_layers=3,
        decoder_layers=2,
        ffn_dim=768,
        vocab_size=160,
        max_positions=48,
        max_target_length=40,
    ),
    "tiny": CaptionerConfig(
        image_size=16,
        patch_size=4,
        d_model=32,
        num_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        ffn_dim=64,
        vocab_size=64,
        max_positions=32,
        max_target_length=24,
    ),
}


def preset(name: str, **overrides: Any) -> CaptionerConfig:
    """A named preset, optionally with some fields replaced (ValueError names the known ones)."""
    return pick_preset(PRESETS, "captioner", name, **overrides)


class Captioner(EncoderDecoderModel):
    """ViT encoder over image patches, Transformer decoder with learned positions."""

    def __init__(self, config: CaptionerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.encoder = VisionEncoder(
            image_size=c.image_size,
            patch_size=c.patch_size,
            num_channels=c.num_channels,
            dim=c.d_model,
            num_heads=c.num_heads,
            num_layers=c.encoder_layers,
            ffn_dim=c.ffn_dim,
            dropout=c.dropout,
            activation=c.activation,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.decoder = TransformerDecoder(
            vocab_size=c.vocab_size,
            dim=c.d_model,
            num_heads=c.num_heads,
            ffn_dim=c.ffn_dim,
            num_layers=c.decoder_layers,
            max_positions=c.max_positions,
            norm_first=True,
            activation=c.activation,
            dropout=c.dropout,
            scale_embedding=False,
            learned_positions=True,
            pad_id=c.pad_id,
            layer_norm_eps=c.layer_norm_eps,
        )

    def encode(self, pixel_values: Tensor) -> tuple[Tensor, list[KVCache]]:
        """Encoder graph: (B, C, H, W) pixels -> states (B, 1 + N, D) and per-layer cross K/V."""
        memory = self.encoder(pixel_values)
        return memory, self.decoder.cross_kv(memory)

    def forward(self, pixel_values: Tensor, tgt_ids: Tensor, tgt_mask: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for training."""
        memory, cross = self.encode(pixel_values)
        cross_mask = memory.new_ones(memory.shape[:2], dtype=tgt_mask.dtype)
        past = self.decoder.empty_past(memory.shape[0], memory)
        positions = (tgt_mask.new_ones(tgt_ids.shape).cumsum(-1) - 1).long()
        logits, _ = self.decode_step(tgt_ids, positions, past, tgt_mask, cross, cross_mask)
        return logits
