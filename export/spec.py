"""Per-model export specs: which graphs, their I/O names, example inputs and dynamic axes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from export.graphs import (
    ClassifierGraph,
    DecoderGraph,
    ImageEncoderGraph,
    TextEncoderGraph,
    decoder_input_names,
    decoder_output_names,
    encoder_output_names,
)

# Example sizes >= 2 on every dynamic axis: torch.export specialises axes seen as 0 or 1.
EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_PAST, EXAMPLE_NEW = 3, 7, 5, 2
BATCH = Dim("batch", min=1, max=4096)
SOURCE = Dim("source_length", min=1, max=8192)
PAST = Dim("past_length", min=0, max=8192)
NEW = Dim("new_tokens", min=1, max=8192)
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


def decoder_spec(model: nn.Module, source_axis: Any, source_length: int) -> GraphSpec:
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
        name="decoder",
        filename="decoder.onnx",
        module=DecoderGraph(model),
        example_inputs=decoder_example(config, source_length),
        input_names=decoder_input_names(layers),
        output_names=decoder_output_names(layers),
        dynamic_shapes=dynamic,
    )


def translator_specs(model: nn.Module) -> list[GraphSpec]:
    """Encoder and decoder graphs of a translator."""
    config = model.config

    def encoder_inputs(g: torch.Generator) -> tuple[Tensor, Tensor]:
        ids = torch.randint(3, config.vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE), generator=g)
        mask = torch.ones_like(ids)
        mask[1, EXAMPLE_SOURCE - 3 :] = 0
        return ids.masked_fill(mask == 0, config.pad_id), mask

    encoder = GraphSpec(
        name="encoder",
        filename="encoder.onnx",
        module=TextEncoderGraph(model),
        example_inputs=encoder_inputs,
        input_names=["input_ids", "attention_mask"],
        output_names=encoder_output_names(config.decoder_layers),
        dynamic_shapes=({0: BATCH, 1: SOURCE}, {0: BATCH, 1: SOURCE}),
    )
    return [encoder, decoder_spec(model, SOURCE, EXAMPLE_SOURCE)]


def captioner_specs(model: nn.Module) -> list[GraphSpec]:
    """Encoder and decoder graphs of a captioner (the source length is fixed by the image)."""
    config = model.config
    size = config.image_size

    def encoder_inputs(g: torch.Generator) -> tuple[Tensor]:
        return (torch.randn(EXAMPLE_BATCH, config.num_channels, size, size, generator=g),)

    encoder = GraphSpec(
        name="encoder",
        filename="encoder.onnx",
        module=ImageEncoderGraph(model),
        example_inputs=encoder_inputs,
        input_names=["pixel_values"],
        output_names=encoder_output_names(config.decoder_layers),
        dynamic_shapes=({0: BATCH},),
    )
    positions = config.num_patches + 1
    return [encoder, decoder_spec(model, positions, positions)]


def vit_specs(model: nn.Module) -> list[GraphSpec]:
    """The single classifier graph of a ViT."""
    config = model.config
    size = config.image_size

    def inputs(g: torch.Generator) -> tuple[Tensor]:
        return (torch.randn(EXAMPLE_BATCH, config.num_channels, size, size, generator=g),)

    return [
        GraphSpec(
            name="model",
            filename="model.onnx",
            module=ClassifierGraph(model),
            example_inputs=inputs,
            input_names=["pixel_values"],
            output_names=["logits"],
            dynamic_shapes=({0: BATCH},),
        )
    ]


SPECS: dict[str, Callable[[nn.Module], list[GraphSpec]]] = {
    "translator": translator_specs,
    "captioner": captioner_specs,
    "vit": vit_specs,
}


def graph_specs(kind: str, model: nn.Module) -> list[GraphSpec]:
    """The graphs exported for a model of ``kind``."""
    return SPECS[kind](model)
