"""Export's one deliberate tie to serving: graphs are checked through the server's own runner.

Parity checks (``export.parity``) and repository evaluation (``export.evaluate``) run the exported
graphs with the very ONNX Runtime backend, encoder-decoder runner, KV caches and greedy loop that
``attnserve serve`` uses, so a passing export means the served model decodes the same tokens. No
other export module imports ``serving`` (tests/contract/test_import_rules.py checks it).
"""

from __future__ import annotations

import dataclasses

from contract.graphs import DECODER
from contract.model_config import GeneratorConfig
from serving.backends.base import Backend
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.engine.decode_cache import DecodeCache
from serving.engine.greedy import greedy
from serving.engine.padded_cache import PaddedKVCache
from serving.repository import make_backend
from serving.seq2seq import Encoded, Seq2SeqRunner, padded_sources
from serving.served.generator import inplace_cache

__all__ = [
    "Backend",
    "DecodeCache",
    "Encoded",
    "OnnxRuntimeBackend",
    "Seq2SeqRunner",
    "decode_caches",
    "greedy",
    "held_out_source_capacity",
    "make_backend",
    "padded_sources",
]


def decode_caches(
    backend: Backend, config: GeneratorConfig, rows: int, source_capacity: int | None = None
) -> dict[str, DecodeCache]:
    """A KV cache of ``rows`` rows per decoder graph the backend has loaded: ``growing``
    (decoder.onnx) and ``inplace`` (decoder_inplace.onnx, with room for sources of
    ``source_capacity`` positions, by default the served limit)."""
    caches: dict[str, DecodeCache] = {}
    runner = Seq2SeqRunner(backend, config.decoder)
    if DECODER in backend.graphs():
        caches["growing"] = PaddedKVCache(runner, rows * config.decoder.max_positions)
    batching = dataclasses.replace(config.batching, max_active_sequences=rows, in_flight=True)
    limits = dataclasses.replace(
        config.limits, max_source_length=source_capacity or config.limits.max_source_length
    )
    inplace = inplace_cache(backend, dataclasses.replace(config, batching=batching, limits=limits))
    if inplace is not None:
        caches["inplace"] = inplace
    return caches


def held_out_source_capacity(config: GeneratorConfig) -> int:
    """Cross-attention positions for held-out decoding (export parity, `attnserve eval`): held-out
    texts may be longer than the served limit (the position table bounds them); image encoders
    always give ``limits.max_source_length`` positions."""
    if config.input == "text":
        return max(config.limits.max_source_length, config.decoder.max_positions)
    return config.limits.max_source_length
