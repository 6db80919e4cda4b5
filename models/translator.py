"""Vaswani encoder-decoder translator with shared (tied) embeddings.

The three functions that map one-to-one onto the exported graphs are methods:
``encode`` (encoder graph), ``decode_step`` (decoder graph) and, built on them,
``models.generation.greedy_generate`` / ``sample`` for decoding with the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from models.config import pick_preset
from models.layers import (
    EncoderDecoderModel,
    EncoderStack,
    KVCache,
    SinusoidalPositions,
    TransformerDecoder,
)


@dataclass(frozen=True)
class TranslatorConfig:
    """Shape and vocabulary of a translator."""

    vocab_size: int = 8000  # shared source/target vocabulary (tied embeddings)
    d_model: int = 512  # width of every layer
    num_heads: int = 8  # attention heads; d_model / num_heads is the head size
    encoder_layers: int = 6
    decoder_layers: int = 6
    ffn_dim: int = 2048  # hidden width of the feed-forward blocks
    max_positions: int = 512  # length of the position table (source and target)
    dropout: float = 0.1  # training only
    norm_first: bool = False  # pre-norm (True) or post-norm as in Vaswani / Marian (False)
    activation: str = "relu"  # relu | gelu | swish
    scale_embedding: bool = True  # multiply embeddings by sqrt(d_model), as Vaswani
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    eos_id: int = 2
    decoder_start_id: int = 1  # first decoder input (<s>; Marian uses pad)
    max_source_length: int = 128  # serving limit, checked before the encoder runs
    max_target_length: int = 128  # serving limit on new tokens

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_layers(self) -> int:
        return self.decoder_layers


PRESETS: dict[str, TranslatorConfig] = {
    # Marian-base shape (the benchmark model).
    "base": TranslatorConfig(),
    # The shipped number translator (~7 M parameters).
    "small": TranslatorConfig(
        vocab_size=1000,
        d_model=256,
        num_heads=4,
        encoder_layers=3,
        decoder_layers=3,
        ffn_dim=1024,
        max_positions=128,
        dropout=0.0,
        norm_first=True,
        max_source_length=64,
        max_target_length=64,
    ),
    # Random-weight tests and CI.
    "tiny": TranslatorConfig(
        vocab_size=128,
        d_model=32,
        num_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        ffn_dim=64,
        max_positions=64,
        dropout=0.0,
        norm_first=True,
        max_source_length=32,
        max_target_length=32,
    ),
}


def preset(name: str, **overrides: Any) -> TranslatorConfig:
    """A named preset, optionally with some fields replaced (ValueError names the known ones)."""
    return pick_preset(PRESETS, "translator", name, **overrides)


class Translator(EncoderDecoderModel):
    """Encoder-decoder Transformer; source and target share one embedding matrix and the LM head."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        nn.init.normal_(self.embed_tokens.weight, std=c.d_model**-0.5)
        self.encoder_positions = SinusoidalPositions(c.max_positions, c.d_model)
        self.encoder = EncoderStack(
            dim=c.d_model,
            num_heads=c.num_heads,
            ffn_dim=c.ffn_dim,
            num_layers=c.encoder_layers,
            norm_first=c.norm_first,
            activation=c.activation,
            dropout=c.dropout,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.decoder = TransformerDecoder(
            vocab_size=c.vocab_size,
            dim=c.d_model,
            num_heads=c.num_heads,
            ffn_dim=c.ffn_dim,
            num_layers=c.decoder_layers,
            max_positions=c.max_positions,
            norm_first=c.norm_first,
            activation=c.activation,
            dropout=c.dropout,
            scale_embedding=c.scale_embedding,
            learned_positions=False,
            pad_id=c.pad_id,
            embedding=self.embed_tokens,
            layer_norm_eps=c.layer_norm_eps,
        )
        self.embed_scale = self.decoder.embed_scale
        self.dropout = nn.Dropout(c.dropout)

    def encode(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, list[KVCache]]:
        """Encoder graph: (B, S) ids and mask -> states (B, S, D) and per-layer cross K/V."""
        positions = attention_mask.new_ones(input_ids.shape).cumsum(-1) - 1  # (B, S): 0..S-1
        x = self.embed_tokens(input_ids) * self.embed_scale + self.encoder_positions(positions)
        memory = self.encoder(self.dropout(x), attention_mask)
        return memory, self.decoder.cross_kv(memory)

    def forward(
        self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor, tgt_mask: Tensor
    ) -> Tensor:
        """Teacher-forced logits (B, T, V) for training: the decoder step with an empty cache."""
        memory, cross = self.encode(src_ids, src_mask)
        past = self.decoder.empty_past(src_ids.shape[0], memory)
        positions = (tgt_mask.new_ones(tgt_ids.shape).cumsum(-1) - 1).long()
        logits, _ = self.decode_step(tgt_ids, positions, past, tgt_mask, cross, src_mask)
        return logits
