"""The two operations of a fixed-capacity KV cache, as PyTorch custom ops.

A decoder step with an in-place cache writes each row's new key / value at that row's own
position (``cache_write``) and attends over each row's first ``lengths[b]`` keys
(``attend_prefix``). They are custom ops so that the exporter maps them one-to-one onto the ONNX
ops that do exactly this at opset 24, ``TensorScatter`` and ``Attention`` with
``nonpad_kv_seqlen`` (``export/onnx_ops.py``), which ONNX Runtime runs in place on a bound buffer.
In PyTorch they are the reference the exported graph is checked against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.library.custom_op("attnserve::cache_write", mutates_args=())
def cache_write(cache: Tensor, update: Tensor, positions: Tensor) -> Tensor:
    """``cache`` with one new entry per row written at that row's position.

    Args:
        cache: (B, H, P, D) keys or values of every row, P = the cache's capacity.
        update: (B, H, 1, D) the new token's key or value per row (same dtype as ``cache``).
        positions: (B,) int64 where each row's new entry goes (0 <= position < P).

    Returns:
        A (B, H, P, D) tensor equal to ``cache`` except at ``[b, :, positions[b]]``.
    """
    out = cache.clone()
    rows = torch.arange(cache.shape[0], device=cache.device)
    out[rows, :, positions] = update[:, :, 0]
    return out


@cache_write.register_fake
def _cache_write_shape(cache: Tensor, update: Tensor, positions: Tensor) -> Tensor:
    return torch.empty_like(cache)


@torch.library.custom_op("attnserve::attend_prefix", mutates_args=())
def attend_prefix(query: Tensor, key: Tensor, value: Tensor, lengths: Tensor) -> Tensor:
    """Scaled dot-product attention of each row over its first ``lengths[b]`` keys.

    Args:
        query: (B, H, T, D).
        key, value: (B, H, S, D) with S >= every length; later positions are ignored.
        lengths: (B,) int64, at least 1 for rows whose output matters.

    Returns:
        (B, H, T, D), as ``scaled_dot_product_attention`` with a key-padding mask.
    """
    capacity = key.shape[2]
    real = torch.arange(capacity, device=key.device)[None, :] < lengths[:, None]  # (B, S)
    mask = real[:, None, None, :].expand(-1, 1, query.shape[2], -1)  # (B, 1, T, S)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)


@attend_prefix.register_fake
def _attend_prefix_shape(query: Tensor, key: Tensor, value: Tensor, lengths: Tensor) -> Tensor:
    return torch.empty_like(query)
