"""Shared Transformer layers: positions, norms, feed-forward, blocks, stacks, the decoder.

Everything here takes tensors and returns tensors (no Python-side state), so that the modules trace
cleanly into the ONNX graphs of the export package:

- decoder blocks take the past keys / values of their layer and return the present ones, or,
  with ``*_inplace``, write one new token per row into a fixed-capacity cache (attention and its
  masks live in ``models.attention``);
- cross-attention keys / values are computed once from the encoder output (``cross_kv``) and
  passed to every decoder step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import KVCache, MultiHeadAttention, causal_self_mask, key_padding_mask

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu, "silu": F.silu}


def activation_fn(name: str):
    """Return the activation function called ``name``.

    Raises:
        ValueError: for an unknown name, listing the supported ones.
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; supported: {', '.join(sorted(ACTIVATIONS))}"
        ) from None


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """Sinusoidal positions (num_positions, dim): sines in the first half, cosines in the second.

    This is the Marian / fairseq layout (not interleaved), so Marian weights import unchanged.
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    half = dim // 2
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    # Marian divides by dim // 2 via `np.power(10000, 2 * (j // 2) / dim)`; identical for even dim.
    angles = position * inv_freq[None, :]
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, :half] = torch.sin(angles)
    table[:, half : 2 * half] = torch.cos(angles)
    return table.to(torch.float32)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions, looked up by explicit position ids."""

    table: Tensor  # a buffer

    def __init__(self, num_positions: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(num_positions, dim), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return F.embedding(position_ids, self.table)  # (B, T, D)


class LearnedPositions(nn.Module):
    """Learned absolute positions, looked up by explicit position ids."""

    def __init__(self, num_positions: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_positions, dim))
        nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, position_ids: Tensor) -> Tensor:
        return F.embedding(position_ids, self.weight)  # (B, T, D)


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the input dtype (same parameters as nn.LayerNorm).

    In a half model the normalisation statistics are where fp16 loses the most; mixed-precision
    inference keeps them in fp32 (for fp32 models this is exactly nn.LayerNorm).
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        out = F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
        return out.to(x.dtype)


class FeedForward(nn.Module):
    """Position-wise feed-forward: fc1 -> activation -> fc2."""

    def __init__(self, dim: int, hidden: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = activation_fn(activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class EncoderBlock(nn.Module):
    """Self-attention + feed-forward, pre-norm or post-norm (Vaswani / Marian)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        norm_first: bool,
        activation: str = "relu",
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(dim, num_heads, dropout)
        self.self_attn_norm = LayerNorm(dim, eps=layer_norm_eps)
        self.ffn = FeedForward(dim, ffn_dim, activation, dropout)
        self.ffn_norm = LayerNorm(dim, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, dim), mask (B, 1, S, S) boolean."""
        if self.norm_first:
            h = self.self_attn_norm(x)
            key, value = self.self_attn.project_kv(h)
            x = x + self.dropout(self.self_attn.attend(h, key, value, mask))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        key, value = self.self_attn.project_kv(x)
        x = self.self_attn_norm(x + self.dropout(self.self_attn.attend(x, key, value, mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class DecoderBlock(nn.Module):
    """Causal self-attention with a KV cache, cross-attention to precomputed keys/values, FFN."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        norm_first: bool,
        activation: str = "relu",
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(dim, num_heads, dropout)
        self.self_attn_norm = LayerNorm(dim, eps=layer_norm_eps)
        self.cross_attn = MultiHeadAttention(dim, num_heads, dropout)
        self.cross_attn_norm = LayerNorm(dim, eps=layer_norm_eps)
        self.ffn = FeedForward(dim, ffn_dim, activation, dropout)
        self.ffn_norm = LayerNorm(dim, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def cross_kv(self, memory: Tensor) -> KVCache:
        """Cross-attention keys/values of the encoder output, computed once per request."""
        return self.cross_attn.project_kv(memory)

    def forward(
        self,
        x: Tensor,
        past: KVCache,
        self_mask: Tensor,
        cross: KVCache,
        cross_mask: Tensor,
    ) -> tuple[Tensor, KVCache]:
        """One block over T new tokens.

        Args:
            x: (B, T, dim) new token states.
            past: past self-attention keys/values, each (B, H, P, head_dim); P may be 0.
            self_mask: (B, 1, T, P + T) boolean.
            cross: cross-attention keys/values, each (B, H, S, head_dim).
            cross_mask: (B, 1, T, S) boolean.

        Returns:
            The new states (B, T, dim) and the present keys/values (B, H, P + T, head_dim).
        """
        if self.norm_first:
            h = self.self_attn_norm(x)
            attn, key, value = self.self_attn.self_attend(h, past[0], past[1], self_mask)
            x = x + self.dropout(attn)
            h = self.cross_attn_norm(x)
            x = x + self.dropout(self.cross_attn.attend(h, cross[0], cross[1], cross_mask))
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
            return x, (key, value)
        attn, key, value = self.self_attn.self_attend(x, past[0], past[1], self_mask)
        x = self.self_attn_norm(x + self.dropout(attn))
        cross_out = self.cross_attn.attend(x, cross[0], cross[1], cross_mask)
        x = self.cross_attn_norm(x + self.dropout(cross_out))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, (key, value)

    def forward_inplace(
        self,
        x: Tensor,
        cache: KVCache,
        cache_lengths: Tensor,
        cross: KVCache,
        cross_lengths: Tensor,
    ) -> tuple[Tensor, KVCache]:
        """One block for one new token per row with a fixed-capacity cache.

        Args:
            x: (B, 1, dim).
            cache: self-attention keys / values, each (B, H, P, head_dim).
            cache_lengths: (B,) tokens already in each row's cache.
            cross: cross-attention keys / values, each (B, H, S, head_dim).
            cross_lengths: (B,) real source positions per row (sources are left-aligned).

        Returns:
            The new states (B, 1, dim) and the caches with this token written.
        """
        self_attn, cross_attn = self.self_attn, self.cross_attn
        if self.norm_first:
            h = self.self_attn_norm(x)
            attn, key, value = self_attn.self_attend_inplace(h, *cache, cache_lengths)
            x = x + self.dropout(attn)
            h = self.cross_attn_norm(x)
            x = x + self.dropout(cross_attn.attend_lengths(h, *cross, cross_lengths))
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
            return x, (key, value)
        attn, key, value = self_attn.self_attend_inplace(x, *cache, cache_lengths)
        x = self.self_attn_norm(x + self.dropout(attn))
        cross_out = cross_attn.attend_lengths(x, *cross, cross_lengths)
        x = self.cross_attn_norm(x + self.dropout(cross_out))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, (key, value)


class TransformerDecoder(nn.Module):
    """Token embedding + positions + decoder blocks + LM head (tied to the embedding).

    Shared by the translator and the captioner: both call ``cross_kv`` once on the encoder output
    and ``forward`` for every step.
    """

    final_logits_bias: Tensor  # a buffer

    def __init__(
        self,
        *,
        vocab_size: int,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        num_layers: int,
        max_positions: int,
        norm_first: bool,
        activation: str,
        dropout: float,
        scale_embedding: bool,
        learned_positions: bool,
        pad_id: int,
        embedding: nn.Embedding | None = None,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.embed_tokens = embedding or nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.embed_scale = math.sqrt(dim) if scale_embedding else 1.0
        self.positions: nn.Module = (
            LearnedPositions(max_positions, dim)
            if learned_positions
            else SinusoidalPositions(max_positions, dim)
        )
        self.layers = nn.ModuleList(
            DecoderBlock(
                dim,
                num_heads,
                ffn_dim,
                norm_first=norm_first,
                activation=activation,
                dropout=dropout,
                layer_norm_eps=layer_norm_eps,
            )
            for _ in range(num_layers)
        )
        # Pre-norm stacks end with a norm; post-norm stacks (Marian) are already normalised.
        self.final_norm = LayerNorm(dim, eps=layer_norm_eps) if norm_first else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        # Marian keeps a (1, vocab) bias on the logits; zero and frozen for our own models.
        self.register_buffer("final_logits_bias", torch.zeros(1, vocab_size))
        self.kv_dtype: torch.dtype | None = None  # storage dtype of the KV cache (None: compute)

    def cross_kv(self, memory: Tensor) -> list[KVCache]:
        """Every layer's cross-attention keys/values for encoder output ``memory`` (B, S, dim).

        They come out in ``kv_dtype`` when set (fp16 exports keep the cache in half precision
        while computing in fp32).
        """
        pairs: list[KVCache] = []
        for layer in self.layers:
            assert isinstance(layer, DecoderBlock)  # the blocks __init__ made
            pairs.append(layer.cross_kv(memory))
        if self.kv_dtype is None:
            return pairs
        return [(k.to(self.kv_dtype), v.to(self.kv_dtype)) for k, v in pairs]

    def empty_past(self, batch: int, memory: Tensor) -> list[KVCache]:
        """A zero-length self-attention cache matching ``memory``'s dtype and device."""
        block = self.layers[0]
        assert isinstance(block, DecoderBlock)  # the blocks __init__ made
        shape = (batch, block.self_attn.num_heads, 0, block.self_attn.head_dim)
        empty = memory.new_zeros(shape)
        return [(empty, empty) for _ in self.layers]

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        past: Sequence[KVCache],
        self_key_mask: Tensor,
        cross: Sequence[KVCache],
        cross_key_mask: Tensor,
    ) -> tuple[Tensor, list[KVCache]]:
        """Run T new tokens through the decoder.

        Args:
            input_ids: (B, T) int64.
            position_ids: (B, T) int64, explicit so rows of a ragged batch keep their own positions.
            past: per layer (key, value), each (B, H, P, head_dim).
            self_key_mask: (B, P + T), nonzero where the key is a real token.
            cross: per layer (key, value), each (B, H, S, head_dim).
            cross_key_mask: (B, S), nonzero where the source position is real.

        Returns:
            logits (B, T, vocab) and the present keys/values per layer (B, H, P + T, head_dim).
        """
        new_len = input_ids.shape[1]
        x = self.embed_tokens(input_ids) * self.embed_scale + self.positions(position_ids)
        x = self.dropout(x)
        self_mask = causal_self_mask(self_key_mask, new_len)
        cross_mask = key_padding_mask(cross_key_mask, new_len)
        presents: list[KVCache] = []
        for layer, layer_past, layer_cross in zip(self.layers, past, cross, strict=True):
            x, present = layer(x, layer_past, self_mask, layer_cross, cross_mask)
            presents.append(present)
        return self.logits(x), presents

    def step_inplace(
        self,
        input_ids: Tensor,
        cache_lengths: Tensor,
        caches: Sequence[KVCache],
        cross: Sequence[KVCache],
        cross_lengths: Tensor,
    ) -> tuple[Tensor, list[KVCache]]:
        """One new token per row with fixed-capacity caches (the in-place decoder graph).

        Args:
            input_ids: (B, 1) int64.
            cache_lengths: (B,) int64 tokens already cached per row; also the new token's
                position.
            caches: per layer (key, value), each (B, H, P, head_dim), P = capacity.
            cross: per layer (key, value), each (B, H, S, head_dim).
            cross_lengths: (B,) int64 real source positions per row.

        Returns:
            logits (B, 1, vocab) and the caches with the new token written at ``cache_lengths``.
        """
        positions = cache_lengths[:, None]  # (B, 1)
        x = self.embed_tokens(input_ids) * self.embed_scale + self.positions(positions)
        x = self.dropout(x)
        written: list[KVCache] = []
        for layer, cache, layer_cross in zip(self.layers, caches, cross, strict=True):
            assert isinstance(layer, DecoderBlock)  # the blocks __init__ made
            x, cache = layer.forward_inplace(x, cache, cache_lengths, layer_cross, cross_lengths)
            written.append(cache)
        return self.logits(x), written

    def logits(self, x: Tensor) -> Tensor:
        """(B, T, vocab) logits of the last block's states, in fp32."""
        x = self.final_norm(x)
        # Logits in fp32 even in a half model: fp16 cannot resolve logits above 16 to 1e-2.
        weight = self.embed_tokens.weight.float()
        return F.linear(x.float(), weight) + self.final_logits_bias.float()  # (B, T, V)


class EncoderStack(nn.Module):
    """Encoder blocks plus the final norm of a pre-norm stack; embeddings belong to the model."""

    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        num_layers: int,
        norm_first: bool,
        activation: str,
        dropout: float,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderBlock(
                dim,
                num_heads,
                ffn_dim,
                norm_first=norm_first,
                activation=activation,
                dropout=dropout,
                layer_norm_eps=layer_norm_eps,
            )
            for _ in range(num_layers)
        )
        self.final_norm = LayerNorm(dim, eps=layer_norm_eps) if norm_first else nn.Identity()

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """x (B, S, dim); key_mask (B, S) nonzero where real, or None when all positions are."""
        mask = None if key_mask is None else key_padding_mask(key_mask, x.shape[1])
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x)


class EncoderDecoderModel(nn.Module):
    """Base of the translator and the captioner: ``decode_step`` is the decoder graph.

    Subclasses set ``self.decoder`` (a ``TransformerDecoder``) and define ``encode``.
    """

    decoder: TransformerDecoder

    def decode_step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        past: list[KVCache],
        self_key_mask: Tensor,
        cross: list[KVCache],
        cross_key_mask: Tensor,
    ) -> tuple[Tensor, list[KVCache]]:
        """Decoder graph: see ``TransformerDecoder.forward``."""
        return self.decoder(input_ids, position_ids, past, self_key_mask, cross, cross_key_mask)

    def decode_step_inplace(
        self,
        input_ids: Tensor,
        cache_lengths: Tensor,
        caches: list[KVCache],
        cross: list[KVCache],
        cross_lengths: Tensor,
    ) -> tuple[Tensor, list[KVCache]]:
        """In-place decoder graph: see ``TransformerDecoder.step_inplace``."""
        return self.decoder.step_inplace(input_ids, cache_lengths, caches, cross, cross_lengths)
