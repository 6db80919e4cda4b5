"""Encoder-decoder execution over a backend: encode once, then decoder steps with the KV cache.

This is the numpy counterpart of ``models.generation`` and the building block of the serving
engine (which adds in-flight batching); ``serving.engine.greedy`` decodes whole batches with it for
the export's end-to-end parity check against PyTorch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.graphs import DECODER, DECODER_INPLACE, kv_names, present_name
from contract.model_config import DecoderSpec
from serving.backends.base import Backend

_ONNX_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def padded_sources(sources: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id rows of different lengths as the encoder takes them: ``input_ids`` right-padded
    with ``pad_id`` and ``attention_mask`` (1 on real tokens), both (B, longest) int64."""
    length = max(len(ids) for ids in sources)
    ids = np.full((len(sources), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(sources), length), dtype=np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
        mask[row, : len(source)] = 1
    return ids, mask


@dataclass
class Encoded:
    """Encoder output of a batch: per-layer cross keys/values and the source mask."""

    # [cross_key.0, cross_value.0, ...], each (B, H, S, D): numpy arrays, or ONNX Runtime
    # OrtValues left on a device (``Seq2SeqRunner.encode(..., device=...)``)
    cross: list[Any]
    mask: np.ndarray  # (B, S) int64

    @property
    def batch(self) -> int:
        return int(self.mask.shape[0])


class Seq2SeqRunner:
    """Runs the ``encoder`` and ``decoder`` graphs of a seq2seq model."""

    def __init__(self, backend: Backend, spec: DecoderSpec) -> None:
        self.backend = backend
        self.spec = spec
        self.layers = spec.num_layers
        self.cross_names = kv_names("cross", self.layers)
        self.past_names = kv_names("past", self.layers)
        self.present_names = [present_name(name) for name in self.past_names]
        decoder = next((g for g in (DECODER, DECODER_INPLACE) if g in backend.graphs()), None)
        input_types = getattr(backend, "input_types", None)
        types = input_types(decoder) if decoder is not None and input_types is not None else {}
        self.kv_dtype = _ONNX_FLOAT.get(types.get(self.past_names[0], ""), np.float32)

    def encode(
        self, feeds: Mapping[str, np.ndarray], device: tuple[str, int] | None = None
    ) -> Encoded:
        """Run the encoder; ``feeds`` are input_ids + attention_mask, or pixel_values. With
        ``device`` (an ONNX Runtime backend's; e.g. ("cuda", 0)) the cross keys and values stay
        there as OrtValues, for a cache on that device: not copied to the host and back."""
        cross: list[Any]
        if device is None:
            outputs = self.backend.run("encoder", feeds)
            cross = [outputs[name] for name in self.cross_names]
            batch, _, length, _ = cross[0].shape
        else:  # an ONNX Runtime backend's device (the in-place cache's)
            run_on_device = self.backend.run_on_device  # type: ignore[attr-defined]
            cross = run_on_device("encoder", feeds, self.cross_names, device)
            batch, _, length, _ = cross[0].shape()
        if "attention_mask" in feeds:
            mask = np.asarray(feeds["attention_mask"], dtype=np.int64)
        else:  # images: every encoder position is real
            mask = np.ones((batch, length), dtype=np.int64)
        return Encoded(cross, mask)

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """A zero-length cache for ``batch`` rows."""
        shape = (batch, self.spec.num_heads, 0, self.spec.head_dim)
        return [np.zeros(shape, dtype=self.kv_dtype) for _ in self.past_names]

    def step(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        self_mask: np.ndarray,
        past: list[np.ndarray],
        encoded: Encoded,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call; returns logits (B, T, V) and the present cache (past + new)."""
        feeds: dict[str, np.ndarray] = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "self_attention_mask": self_mask,
            "cross_attention_mask": encoded.mask,
        }
        feeds.update(zip(self.past_names, past, strict=True))
        feeds.update(zip(self.cross_names, encoded.cross, strict=True))
        outputs = self.backend.run("decoder", feeds)
        presents = [outputs[name] for name in self.present_names]
        return outputs["logits"], presents
