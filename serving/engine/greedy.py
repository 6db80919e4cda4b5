"""Greedy decoding of a whole batch through a ``DecodeCache`` (no in-flight joins).

The offline loop that export parity checks and repository evaluation run, over either cache, so
they decode exactly as the server does.
"""

from __future__ import annotations

import numpy as np

from contract.model_config import DecoderSpec
from serving.engine.decode_cache import DecodeCache
from serving.seq2seq import Encoded


def greedy(
    cache: DecodeCache, encoded: Encoded, spec: DecoderSpec, max_new_tokens: int
) -> list[list[int]]:
    """Greedy tokens of every row of ``encoded`` (without the start token and EOS).

    Args:
        cache: an empty cache with room for ``encoded.batch`` rows; it is empty again after.
        encoded: the encoder output of the batch.
        spec: the decoder facts (start and end ids).
        max_new_tokens: the most tokens per row.
    """
    rows = np.concatenate(cache.admit(encoded, [1] * encoded.batch))
    outputs: list[list[int]] = [[] for _ in range(encoded.batch)]
    active = np.arange(encoded.batch)
    next_ids = np.full(encoded.batch, spec.decoder_start_id, dtype=np.int64)
    try:
        for position in range(max_new_tokens):
            positions = np.full(len(active), position, dtype=np.int64)
            logits = cache.step(rows[active], next_ids[active], positions)
            chosen = logits.argmax(-1)
            ended = chosen == spec.eos_id
            for index, token in zip(active[~ended], chosen[~ended], strict=True):
                outputs[index].append(int(token))
            next_ids[active] = chosen
            if ended.any():
                cache.release(rows[active[ended]])
            active = active[~ended]
            if not len(active):
                break
    finally:
        if len(active):
            cache.release(rows[active])
    return outputs
