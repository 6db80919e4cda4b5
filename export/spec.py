"""Per-model export specs: which graphs, their I/O names, example inputs and dynamic axes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from contract.graphs import (
    CLASSIFIER,
    CLASSIFIER_FILE,
    DECODER,
    DECODER_FILE,
    DECODER_INPLACE,
    DECODER_INPLACE_FILE,
    ENCODER,
    ENCODER_FILE,
    IMAGE_INPUT,
    INPLACE_OPSET,
    LOGITS,
    TEXT_ENCODER_INPUTS,
    decoder_inplace_input_names,
    decoder_input_names,
    decoder_output_names,
    encoder_output_names,
)
from export.graphs import (
    ClassifierGraph,
    DecoderGraph,
    ImageEncoderGraph,
    InPlaceDecoderGraph,
    TextEncoderGraph,
)
from models.captioner import Captioner
from models.translator import Translator
from models.vit import ViT

# Example sizes >= 2 on every dynamic axis: torch.export specialises axes seen as 0 or 1.
EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_PAST, EXAMPLE_NEW = 3, 7, 5, 2
BATCH = Dim("batch", min=1, max=4096)
SOURCE = Dim("source_length", min=1, max=8192)
PAST = Dim("past_length", min=0, max=8192)
NEW = Dim("new_tokens", min=1, max=8192)
CAPACITY = Dim("capacity", min=1, max=8192)  # the in-place decoder's cache positions per row
EXAMPLE_CAPACITY = 6
# ONNX names for axes torch.export derives itself (Dim.AUTO), by (input name, axis).
AUTO_AXIS_NAMES = {("self_attention_mask", 1): "total_length"}


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph of a model."""

    name: str  # encoder | decoder | model
    filename: str
    module: nn.Module
    example_inputs: Callable[[torch.Generator], tuple[Any, ...]]
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: tuple[Any, ...]
    opset: int | None = None  # None: the export's --opset; set for graphs that need a newer one
    custom_translations: dict[Any, Any] | None = None  # ONNX translations of custom torch ops


def _kv(batch: int, heads: int, length: int, head_dim: int, layers: int, g: torch.Generator):
    return tuple(
        (
            torch.randn(batch, heads, length, head_dim, generator=g),
            torch.randn(batch, heads, length, head_dim, generator=g),
        )
        for _ in range(layers)
    )


def decoder_example(config: Any, source_length: int) -> Callable[[torch.Generator], tuple]:
    """Random decoder inputs: a ragged batch (one row has padding in its past and source)."""

    def make(g: torch.Generator) -> tuple:
        b, p, t = EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW
        ids = torch.randint(3, config.vocab_size, (b, t), generator=g)
        positions = torch.arange(p, p + t).expand(b, -1).clone()
        self_mask = torch.ones(b, p + t, dtype=torch.long)
        self_mask[1, 1:3] = 0  # a hole in row 1's cache, as in-flight batching leaves
        cross_mask = torch.ones(b, source_length, dtype=torch.long)
        cross_mask[2, source_length - 2 :] = 0
        layers, heads, hd = config.decoder_layers, config.num_heads, config.head_dim
        past = _kv(b, heads, p, hd, layers, g)
        cross = _kv(b, heads, source_length, hd, layers, g)
        return ids, positions, self_mask, cross_mask, past, cross

    return make


def decoder_spec(model: Translator | Captioner, source_axis: Any, source_length: int) -> GraphSpec:
    config = model.config
    layers = config.decoder_layers
    past_axes = {0: BATCH, 2: PAST}
    cross_axes = {0: BATCH, 2: source_axis}
    dynamic = (
        {0: BATCH, 1: NEW},
        {0: BATCH, 1: NEW},
        {0: BATCH, 1: Dim.AUTO},
        {0: BATCH, 1: source_axis},
        tuple((past_axes, past_axes) for _ in range(layers)),
        tuple((cross_axes, cross_axes) for _ in range(layers)),
    )
    return GraphSpec(
        name=DECODER,
        filename=DECODER_FILE,
        module=DecoderGraph(model),
        example_inputs=decoder_example(config, source_length),
        input_names=decoder_input_names(layers),
        output_names=decoder_output_names(layers),
        dynamic_shapes=dynamic,
    )


def decoder_inplace_example(config: Any, source_length: int) -> Callable[[torch.Generator], tuple]:
    """Random in-place decoder inputs: a fresh row, a row in mid-sequence, a nearly full one,
    with full, padded and one-token sources."""

    def make(g: torch.Generator) -> tuple:
        b = EXAMPLE_BATCH
        ids = torch.randint(3, config.vocab_size, (b, 1), generator=g)
        cache_lengths = torch.tensor([0, 2, EXAMPLE_CAPACITY - 1])
        cross_lengths = torch.tensor([source_length, max(1, source_length - 2), 1])
        layers, heads, hd = config.decoder_layers, config.num_heads, config.head_dim
        caches = _kv(b, heads, EXAMPLE_CAPACITY, hd, layers, g)
        cross = _kv(b, heads, source_length, hd, layers, g)
        return ids, cache_lengths, cross_lengths, caches, cross

    return make


def decoder_inplace_spec(
    model: Translator | Captioner, source_axis: Any, source_length: int
) -> GraphSpec:
    """The decoder step over a fixed-capacity cache written in place (opset 24)."""
    from export.onnx_ops import CUSTOM_TRANSLATIONS

    config = model.config
    layers = config.decoder_layers
    cache_axes = {0: BATCH, 2: CAPACITY}
    cross_axes = {0: BATCH, 2: source_axis}
    dynamic = (
        {0: BATCH},
        {0: BATCH},
        {0: BATCH},
        tuple((cache_axes, cache_axes) for _ in range(layers)),
        tuple((cross_axes, cross_axes) for _ in range(layers)),
    )
    return GraphSpec(
        name=DECODER_INPLACE,
        filename=DECODER_INPLACE_FILE,
        module=InPlaceDecoderGraph(model),
        example_inputs=decoder_inplace_example(config, source_length),
        input_names=decoder_inplace_input_names(layers),
        output_names=decoder_output_names(layers),
        dynamic_shapes=dynamic,
        opset=INPLACE_OPSET,
        custom_translations=CUSTOM_TRANSLATIONS,
    )


def translator_specs(model: Translator) -> list[GraphSpec]:
    """Encoder and decoder graphs of a translator."""
    config = model.config

    def encoder_inputs(g: torch.Generator) -> tuple[Tensor, Tensor]:
        ids = torch.randint(3, config.vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE), generator=g)
        mask = torch.ones_like(ids)
        mask[1, EXAMPLE_SOURCE - 3 :] = 0
        return ids.masked_fill(mask == 0, config.pad_id), mask

    encoder = GraphSpec(
        name=ENCODER,
        filename=ENCODER_FILE,
        module=TextEncoderGraph(model),
        example_inputs=encoder_inputs,
        input_names=list(TEXT_ENCODER_INPUTS),
        output_names=encoder_output_names(config.decoder_layers),
        dynamic_shapes=({0: BATCH, 1: SOURCE}, {0: BATCH, 1: SOURCE}),
    )
    return [
        encoder,
        decoder_spec(model, SOURCE, EXAMPLE_SOURCE),
        decoder_inplace_spec(model, SOURCE, EXAMPLE_SOURCE),
    ]


def captioner_specs(model: Captioner) -> list[GraphSpec]:
    """Encoder and decoder graphs of a captioner (the source length is fixed by the image)."""
    config = model.config
    size = config.image_size

    def encoder_inputs(g: torch.Generator) -> tuple[Tensor]:
        return (torch.randn(EXAMPLE_BATCH, config.num_channels, size, size, generator=g),)

    encoder = GraphSpec(
        name=ENCODER,
        filename=ENCODER_FILE,
        module=ImageEncoderGraph(model),
        example_inputs=encoder_inputs,
        input_names=[IMAGE_INPUT],
        output_names=encoder_output_names(config.decoder_layers),
        dynamic_shapes=({0: BATCH},),
    )
    positions = config.num_patches + 1
    return [
        encoder,
        decoder_spec(model, positions, positions),
        decoder_inplace_spec(model, positions, positions),
    ]


def vit_specs(model: ViT) -> list[GraphSpec]:
    """The single classifier graph of a ViT."""
    config = model.config
    size = config.image_size

    def inputs(g: torch.Generator) -> tuple[Tensor]:
        return (torch.randn(EXAMPLE_BATCH, config.num_channels, size, size, generator=g),)

    return [
        GraphSpec(
            name=CLASSIFIER,
            filename=CLASSIFIER_FILE,
            module=ClassifierGraph(model),
            example_inputs=inputs,
            input_names=[IMAGE_INPUT],
            output_names=[LOGITS],
            dynamic_shapes=({0: BATCH},),
        )
    ]


# kind -> its graph specs; each function takes the model class of its kind
SPECS: dict[str, Callable[[Any], list[GraphSpec]]] = {
    "translator": translator_specs,
    "captioner": captioner_specs,
    "vit": vit_specs,
}


def graph_specs(kind: str, model: nn.Module) -> list[GraphSpec]:
    """The graphs exported for a model of ``kind``."""
    return SPECS[kind](model)
