"""Decoding loops over ``decode_step``, shared by the translator and the captioner.

These are the PyTorch references the exported graphs and the serving engine are checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from models.layers import KVCache, TransformerDecoder


class EncoderDecoder(Protocol):
    """What the decoding loops need: ``decode_step`` and the decoder's ``empty_past``."""

    decoder: TransformerDecoder

    def decode_step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        past: list[KVCache],
        self_key_mask: Tensor,
        cross: list[KVCache],
        cross_key_mask: Tensor,
    ) -> tuple[Tensor, list[KVCache]]: ...


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw the next token (B,) from logits (B, V); temperature 0 means greedy.

    Raises:
        ValueError: for a negative temperature, negative top_k or top_p outside (0, 1].
    """
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(
            f"bad sampling options temperature={temperature} top_k={top_k} top_p={top_p}: "
            "need temperature >= 0, top_k >= 0, 0 < top_p <= 1"
        )
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the first token always
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def greedy_generate(
    model: EncoderDecoder,
    cross: Sequence[KVCache],
    cross_key_mask: Tensor,
    *,
    max_new_tokens: int,
    start_id: int,
    eos_id: int,
    use_cache: bool = True,
) -> list[list[int]]:
    """Greedy decoding of a batch, one new token per step.

    Args:
        model: a translator or captioner.
        cross: per-layer cross keys/values from ``encode``.
        cross_key_mask: (B, S) source mask.
        max_new_tokens: the most tokens to produce per row (EOS not counted in the output).
        start_id: the decoder start token.
        eos_id: generation of a row stops at this token.
        use_cache: feed only the last token and the KV cache (True), or recompute the whole
            prefix every step (False, the reference the cache is tested against).

    Returns:
        The generated ids of each row, without the start token and the EOS.
    """
    batch = cross_key_mask.shape[0]
    device = cross_key_mask.device
    tokens = torch.full((batch, 1), start_id, dtype=torch.long, device=device)
    empty = model.decoder.empty_past(batch, cross[0][0])
    past = empty
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    for step in range(max_new_tokens):
        self_key_mask = torch.ones(batch, step + 1, dtype=torch.long, device=device)
        if use_cache:
            positions = torch.full((batch, 1), step, dtype=torch.long, device=device)
            logits, past = model.decode_step(
                tokens[:, -1:], positions, past, self_key_mask, list(cross), cross_key_mask
            )
        else:
            positions = torch.arange(step + 1, device=device).expand(batch, -1)
            logits, _ = model.decode_step(
                tokens, positions, empty, self_key_mask, list(cross), cross_key_mask
            )
        next_ids = logits[:, -1].argmax(-1)
        for row in (~finished).nonzero().flatten().tolist():
            if next_ids[row].item() != eos_id:
                outputs[row].append(int(next_ids[row]))
        finished |= next_ids == eos_id
        tokens = torch.cat([tokens, next_ids[:, None]], dim=1)
        if bool(finished.all()):
            break
    return outputs
