"""Multi-head attention over an explicit KV cache, and the masks it takes.

- ``self_attend``: past keys / values in, present (past + new) out, so a decoder step feeds
  them back in; masks are boolean (True = attend) of shape (B, 1, T_query, T_key): ONNX Runtime's
  CPU ``Attention`` kernel wants the query axis spelt out rather than broadcast;
- ``self_attend_inplace`` / ``attend_lengths``: a fixed-capacity cache, one new token per row
  written at the row's own position, attention over each row's first ``lengths`` keys
  (``models.cache_ops``), so the cache never grows or moves.

Attention is ``torch.nn.functional.scaled_dot_product_attention`` on 4-D (B, H, T, D) tensors,
which the ONNX exporter turns into the standard ``Attention`` op at opset >= 23.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.cache_ops import attend_prefix, cache_write

KVCache = tuple[Tensor, Tensor]


def key_padding_mask(key_mask: Tensor, query_len: int) -> Tensor:
    """Expand a (B, S) key mask (nonzero = attend) to a boolean (B, 1, T, S) attention mask."""
    mask = key_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S)
    return mask.expand(-1, -1, query_len, -1)  # (B, 1, T, S)


def causal_self_mask(self_key_mask: Tensor, new_len: int) -> Tensor:
    """Self-attention mask for ``new_len`` new tokens over past + new keys.

    Args:
        self_key_mask: (B, P + T) int or bool, nonzero where a key (past or new) is a real token.
            Padding inside the past (ragged batches) is simply a zero here.
        new_len: T, the number of new (query) tokens; they are the last T keys.

    Returns:
        Boolean (B, 1, T, P + T): query i attends to key j when the key is real and j is not a
        later new token.
    """
    total = self_key_mask.shape[1]
    query = torch.arange(new_len, device=self_key_mask.device)[:, None]  # (T, 1)
    key = torch.arange(total, device=self_key_mask.device)[None, :]  # (1, P + T)
    past_len = total - new_len
    causal = key <= query + past_len  # (T, P + T)
    return self_key_mask.to(torch.bool)[:, None, None, :] & causal[None, None]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate Q/K/V projections (the Marian / ViT parameter layout)."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"d_model {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def split_heads_one(self, x: Tensor) -> Tensor:
        """``split_heads`` of one token per row, (B, 1, dim) -> (B, H, 1, D): a reshape alone
        (the token axis has one entry, so the transpose moves nothing), one node and on a GPU
        one kernel fewer per projection of a decode step."""
        return x.reshape(x.shape[0], self.num_heads, 1, self.head_dim)

    def project_kv(self, x: Tensor) -> KVCache:
        """Keys and values of ``x`` (B, S, dim), each (B, H, S, head_dim)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def attend(self, x: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
        """Attend from queries of ``x`` (B, T, dim) to given keys/values (B, H, S, head_dim)."""
        batch, length, dim = x.shape
        query = self.split_heads(self.q_proj(x))  # (B, H, T, D)
        dropout = self.dropout if self.training else 0.0
        # Cached keys/values may be stored in a lower precision than the computation (fp16
        # exports); a no-op when the dtypes agree.
        key, value = key.to(query.dtype), value.to(query.dtype)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout)
        out = out.transpose(1, 2).reshape(batch, length, dim)  # (B, T, H*D)
        return self.out_proj(out)

    def self_attend(
        self, x: Tensor, past_key: Tensor, past_value: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention over past + new tokens; returns (output, present_key, present_value)."""
        new_key, new_value = self.project_kv(x)
        key = torch.cat([past_key, new_key.to(past_key.dtype)], dim=2)  # (B, H, P + T, D)
        value = torch.cat([past_value, new_value.to(past_value.dtype)], dim=2)
        return self.attend(x, key, value, mask), key, value

    def attend_lengths(self, x: Tensor, key: Tensor, value: Tensor, lengths: Tensor) -> Tensor:
        """Attend from ``x`` (B, 1, dim), one token per row, to each row's first ``lengths[b]``
        keys / values."""
        batch, _, dim = x.shape
        query = self.split_heads_one(self.q_proj(x))  # (B, H, 1, D)
        # Attention runs in the cache's dtype: casting the small query, not the whole cache
        # (an fp16 cache would otherwise be copied to fp32 every step).
        out = attend_prefix(query.to(key.dtype), key, value, lengths).to(query.dtype)
        return self.out_proj(out.reshape(batch, 1, dim))  # (B, H, 1, D) -> (B, 1, H*D)

    def self_attend_inplace(
        self, x: Tensor, cache_key: Tensor, cache_value: Tensor, cache_lengths: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention for one new token per row over a fixed-capacity cache.

        Args:
            x: (B, 1, dim) the new tokens.
            cache_key, cache_value: (B, H, P, head_dim), the rows' caches (P = capacity).
            cache_lengths: (B,) tokens already cached per row: the new one goes there.

        Returns:
            The output (B, 1, dim) and the caches with the new key / value written.
        """
        new_key = self.split_heads_one(self.k_proj(x))  # (B, H, 1, D)
        new_value = self.split_heads_one(self.v_proj(x))
        key = cache_write(cache_key, new_key.to(cache_key.dtype), cache_lengths)
        value = cache_write(cache_value, new_value.to(cache_value.dtype), cache_lengths)
        return self.attend_lengths(x, key, value, cache_lengths + 1), key, value
