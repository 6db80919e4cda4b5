"""Flat-input/-output wrappers that turn ``encode`` / ``decode_step`` into exportable graphs.

Their inputs and outputs are named by ``contract.graphs`` (the graph contract shared with
serving); ``export.spec`` pairs each wrapper with those names, example inputs and dynamic axes.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.captioner import Captioner
from models.layers import EncoderDecoderModel
from models.translator import Translator
from models.vit import ViT

KV = tuple[tuple[Tensor, Tensor], ...]


def _flatten(pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, ...]:
    return tuple(t for pair in pairs for t in pair)


class TextEncoderGraph(nn.Module):
    """Translator encoder: ids + mask -> states and every layer's cross keys/values."""

    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory, cross = self.model.encode(input_ids, attention_mask)
        return (memory, *_flatten(cross))


class ImageEncoderGraph(nn.Module):
    """Captioner encoder: pixels -> states and every layer's cross keys/values."""

    def __init__(self, model: Captioner) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        memory, cross = self.model.encode(pixel_values)
        return (memory, *_flatten(cross))


class DecoderGraph(nn.Module):
    """One decoder step (one or more new tokens) with the self-attention KV cache."""

    def __init__(self, model: EncoderDecoderModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        self_attention_mask: Tensor,
        cross_attention_mask: Tensor,
        past: KV,
        cross: KV,
    ) -> tuple[Tensor, ...]:
        logits, presents = self.model.decode_step(
            input_ids,
            position_ids,
            list(past),
            self_attention_mask,
            list(cross),
            cross_attention_mask,
        )
        return (logits, *_flatten(presents))


class InPlaceDecoderGraph(nn.Module):
    """One decoder step (one new token per row) over a fixed-capacity cache written in place."""

    def __init__(self, model: EncoderDecoderModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        cache_lengths: Tensor,
        cross_lengths: Tensor,
        caches: KV,
        cross: KV,
    ) -> tuple[Tensor, ...]:
        logits, written = self.model.decode_step_inplace(
            input_ids, cache_lengths, list(caches), list(cross), cross_lengths
        )
        return (logits, *_flatten(written))


class ClassifierGraph(nn.Module):
    """ViT: pixels -> logits."""

    def __init__(self, model: ViT) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values)
