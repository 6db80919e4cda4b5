"""Flat-input/-output wrappers that turn ``encode`` / ``decode_step`` into exportable graphs.

The names are the ONNX contract shared with the serving package (see shared/DESIGN.md):

encoder (translator): input_ids, attention_mask            [batch, source_length] int64
encoder (captioner):  pixel_values                         [batch, 3, H, W] float
   -> encoder_hidden_states [batch, source_length, d_model],
      cross_key.{i}, cross_value.{i} [batch, heads, source_length, head_dim] for every layer i
decoder: input_ids, position_ids [batch, new_tokens] int64,
         self_attention_mask [batch, past_length + new_tokens] int64 (1 = real token),
         cross_attention_mask [batch, source_length] int64,
         past_key.{i}, past_value.{i} [batch, heads, past_length, head_dim],
         cross_key.{i}, cross_value.{i}
   -> logits [batch, new_tokens, vocab], present_key.{i}, present_value.{i}
      [batch, heads, past_length + new_tokens, head_dim] (past + new, fed back as the next past)
classifier: pixel_values [batch, 3, H, W] -> logits [batch, classes]
"""

from __future__ import annotations

from torch import Tensor, nn

KV = tuple[tuple[Tensor, Tensor], ...]


def kv_names(prefix: str, num_layers: int) -> list[str]:
    """[prefix_key.0, prefix_value.0, prefix_key.1, ...] in the order the graphs flatten them."""
    return [f"{prefix}_{part}.{i}" for i in range(num_layers) for part in ("key", "value")]


def encoder_output_names(num_layers: int) -> list[str]:
    return ["encoder_hidden_states", *kv_names("cross", num_layers)]


def decoder_input_names(num_layers: int) -> list[str]:
    return [
        "input_ids",
        "position_ids",
        "self_attention_mask",
        "cross_attention_mask",
        *kv_names("past", num_layers),
        *kv_names("cross", num_layers),
    ]


def decoder_output_names(num_layers: int) -> list[str]:
    return ["logits", *kv_names("present", num_layers)]


def _flatten(pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, ...]:
    return tuple(t for pair in pairs for t in pair)


class TextEncoderGraph(nn.Module):
    """Translator encoder: ids + mask -> states and every layer's cross keys/values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory, cross = self.model.encode(input_ids, attention_mask)
        return (memory, *_flatten(cross))


class ImageEncoderGraph(nn.Module):
    """Captioner encoder: pixels -> states and every layer's cross keys/values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        memory, cross = self.model.encode(pixel_values)
        return (memory, *_flatten(cross))


class DecoderGraph(nn.Module):
    """One decoder step (one or more new tokens) with the self-attention KV cache."""

    def __init__(self, model: nn.Module) -> None:
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


class ClassifierGraph(nn.Module):
    """ViT: pixels -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values)
