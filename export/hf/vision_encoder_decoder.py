"""``VisionEncoderDecoderModel`` (ViT encoder, GPT-2 decoder) -> ``models.captioner.Captioner``.

GPT-2 is pre-norm with learned positions (no offset), a final norm and an LM head tied to the
token embedding: the shape of our captioner's decoder. Our captioner shares width, heads,
feed-forward width, activation and layer-norm epsilon between encoder and decoder, so pairs that
differ in any of them are refused, as are other encoders and decoders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from export.errors import SourceError
from export.hf.common import (
    activation,
    generation_config,
    max_new_tokens,
    require_equal,
    token_id,
    unsupported,
)
from export.hf.generation import token_rules
from export.hf.registry import ArchitectureLoader, register_architecture
from export.hf.text import load_tokenizer, tokenizers_json
from export.hf.vit import image_preprocessing, map_vit_encoder, vit_geometry
from export.hf.weights import Weights
from export.sources import EntryExtras
from models.captioner import Captioner, CaptionerConfig

_VED = "VisionEncoderDecoderModel"
SUPPORTED_CAPTION_ENCODERS: tuple[str, ...] = ("vit",)
SUPPORTED_CAPTION_DECODERS: tuple[str, ...] = ("gpt2",)


@register_architecture(_VED, model_type="vision-encoder-decoder", kind="captioner")
class VisionEncoderDecoderLoader(ArchitectureLoader[Captioner]):
    """Image captioners made of a ViT encoder and a GPT-2 decoder (nlpconnect/vit-gpt2-...)."""

    def make_model(self, hf_config: Any, directory: Path) -> Captioner:
        """Our Captioner for the HF config (see ``ArchitectureLoader.make_model``)."""
        return Captioner(captioner_config(hf_config, directory))

    def copy_weights(self, hf_model: nn.Module, model: Captioner) -> None:
        """ViT + GPT-2 weights -> our Captioner (see ``ArchitectureLoader.copy_weights``)."""
        config: CaptionerConfig = model.config
        weights = Weights(hf_model, _VED)
        map_vit_encoder(weights, "encoder", "encoder", config.encoder_layers)
        weights.ignore(r"^encoder\.pooler\.")  # ViTModel's pooler: unused by the decoder
        _map_gpt2_decoder(weights, "decoder", "decoder", config.decoder_layers)
        weights.load_into(model)

    def entry_extras(
        self, transformers: Any, hf_model: nn.Module, model: Captioner, directory: Path
    ) -> EntryExtras:
        """The GPT-2 tokenizer (tokenizer.json), the image processor's resize filter and the
        token rules (see ``ArchitectureLoader.entry_extras``)."""
        config: CaptionerConfig = model.config
        preprocessing = image_preprocessing(directory, config.image_size)
        text = tokenizers_json(load_tokenizer(transformers, _VED, directory), directory)
        rules = token_rules(_VED, hf_model.generation_config, config.eos_id, config.vocab_size)
        return EntryExtras(
            tokenizer=text.spec,
            tokenizer_files=text.files,
            suppress_ids=rules.suppress_ids,
            bad_words=rules.bad_words,
            forced_eos=rules.forced_eos,
            resample=preprocessing.resample,
            notes={
                "tokenizer": text.notes,
                "generation": rules.notes,
                "image_processor": vars(preprocessing),
            },
        )


def captioner_config(hf: Any, directory: Path) -> CaptionerConfig:
    """Our CaptionerConfig for a HF ``VisionEncoderDecoderConfig`` (ViT encoder, GPT-2 decoder).

    Args:
        hf: The HF config.
        directory: The source directory.

    Returns:
        The config of the matching captioner.

    Raises:
        SourceError: for another encoder or decoder, or anything our captioner cannot express
            (it shares width, heads, feed-forward width, activation and layer-norm epsilon
            between encoder and decoder).
    """
    # The checks run in this order so that a config with several problems names the same first.
    encoder, decoder = hf.encoder, hf.decoder
    _check_encoder_and_decoder(encoder, decoder)
    ffn_dim = decoder.n_inner if decoder.n_inner is not None else 4 * decoder.n_embd
    shared_activation = activation(_VED, encoder.hidden_act, "encoder hidden_act")
    _check_shared_fields(encoder, decoder, ffn_dim)
    generation = generation_config(directory)
    eos_id = _eos_id(hf, decoder, generation)
    max_positions = int(decoder.n_positions)
    geometry = vit_geometry(_VED, encoder)
    preprocessing = image_preprocessing(directory, geometry["image_size"])
    return CaptionerConfig(
        **geometry,
        d_model=int(encoder.hidden_size),
        num_heads=int(encoder.num_attention_heads),
        encoder_layers=int(encoder.num_hidden_layers),
        decoder_layers=int(decoder.n_layer),
        ffn_dim=int(ffn_dim),
        vocab_size=int(decoder.vocab_size),
        max_positions=max_positions,
        dropout=0.0,
        activation=shared_activation,
        layer_norm_eps=float(encoder.layer_norm_eps),
        pad_id=_pad_id(hf, decoder, generation, eos_id),
        eos_id=eos_id,
        decoder_start_id=_decoder_start_id(hf, decoder, generation),
        max_target_length=max_new_tokens(directory, max_positions),
        image_mean=preprocessing.mean,
        image_std=preprocessing.std,
    )


def _check_encoder_and_decoder(encoder: Any, decoder: Any) -> None:
    """Step 1: a ViT encoder and a GPT-2 decoder whose attention works as ours does."""
    if encoder.model_type not in SUPPORTED_CAPTION_ENCODERS:
        raise unsupported(
            _VED,
            f"encoder {encoder.model_type!r}; supported: " + ", ".join(SUPPORTED_CAPTION_ENCODERS),
        )
    if decoder.model_type not in SUPPORTED_CAPTION_DECODERS:
        raise SourceError(
            f"unsupported decoder {decoder.model_type!r} in {_VED}; supported: "
            + ", ".join(SUPPORTED_CAPTION_DECODERS)
        )
    if not getattr(decoder, "add_cross_attention", False):
        raise unsupported(_VED, "the GPT-2 decoder has no cross-attention (add_cross_attention)")
    if not getattr(decoder, "scale_attn_weights", True):
        raise unsupported(_VED, "scale_attn_weights=false (we scale by 1/sqrt(head_dim))")
    if getattr(decoder, "scale_attn_by_inverse_layer_idx", False):
        raise unsupported(_VED, "scale_attn_by_inverse_layer_idx=true")
    cross_size = getattr(decoder, "cross_attention_hidden_size", None)
    if cross_size not in (None, decoder.n_embd):
        raise unsupported(_VED, f"cross_attention_hidden_size={cross_size} != n_embd")


def _check_shared_fields(encoder: Any, decoder: Any, ffn_dim: int) -> None:
    """Step 2: what our captioner has once for encoder and decoder must agree between the two."""
    pairs = (
        (
            "width (no encoder-to-decoder projection)",
            ("encoder hidden_size", encoder.hidden_size),
            ("decoder n_embd", decoder.n_embd),
        ),
        (
            "attention heads",
            ("encoder num_attention_heads", encoder.num_attention_heads),
            ("decoder n_head", decoder.n_head),
        ),
        (
            "feed-forward width",
            ("encoder intermediate_size", encoder.intermediate_size),
            ("decoder n_inner", ffn_dim),
        ),
        (
            "activation",
            ("encoder hidden_act", encoder.hidden_act),
            ("decoder activation_function", decoder.activation_function),
        ),
        (
            "layer-norm epsilon",
            ("encoder layer_norm_eps", encoder.layer_norm_eps),
            ("decoder layer_norm_epsilon", decoder.layer_norm_epsilon),
        ),
    )
    for what, first, second in pairs:
        require_equal(_VED, what, first, second)


# Step 3: the special tokens. GPT-2 checkpoints set each in some of the top-level config, the
# decoder's config and generation_config.json, so each is the first one set, in the order listed.


def _eos_id(hf: Any, decoder: Any, generation: dict[str, Any]) -> int:
    """The end-of-sequence token."""
    return token_id(
        _VED,
        "eos_token_id",
        getattr(hf, "eos_token_id", None),
        decoder.eos_token_id,
        generation.get("eos_token_id"),
    )


def _pad_id(hf: Any, decoder: Any, generation: dict[str, Any], eos_id: int) -> int:
    """The padding token; GPT-2 has none of its own, so EOS pads when nothing else is set."""
    return token_id(
        _VED,
        "pad_token_id",
        getattr(hf, "pad_token_id", None),
        decoder.pad_token_id,
        generation.get("pad_token_id"),
        eos_id,
    )


def _decoder_start_id(hf: Any, decoder: Any, generation: dict[str, Any]) -> int:
    """The token decoding starts from; GPT-2's BOS when nothing else is set."""
    return token_id(
        _VED,
        "decoder_start_token_id",
        getattr(hf, "decoder_start_token_id", None),
        generation.get("decoder_start_token_id"),
        decoder.bos_token_id,
    )


def _map_gpt2_decoder(weights: Weights, ours: str, theirs: str, num_layers: int) -> None:
    """HF GPT2LMHeadModel with cross-attention (prefix ``theirs``) -> our TransformerDecoder."""
    body = f"{theirs}.transformer"
    embedding = f"{body}.wte.weight"
    weights.copy(f"{ours}.embed_tokens.weight", embedding)
    weights.copy(f"{ours}.positions.weight", f"{body}.wpe.weight")
    for i in range(num_layers):
        _map_gpt2_layer(weights, f"{ours}.layers.{i}", f"{body}.h.{i}")
    weights.layer_norm(f"{ours}.final_norm", f"{body}.ln_f")
    # transformers 4.x keeps the causal mask as buffers named attn.bias / attn.masked_bias.
    weights.ignore(r"\.(attn|crossattention)\.(bias|masked_bias)$")
    weights.check_tied(f"{theirs}.lm_head.weight", embedding, "the LM head")
    vocab = weights.get(embedding).shape[0]
    if weights.has(f"{theirs}.lm_head.bias"):
        weights.ours[f"{ours}.final_logits_bias"] = weights.get(f"{theirs}.lm_head.bias")[None]
    else:
        weights.ours[f"{ours}.final_logits_bias"] = torch.zeros(1, vocab)


def _map_gpt2_layer(weights: Weights, ours: str, theirs: str) -> None:
    """One GPT-2 block with cross-attention; its ``Conv1D`` layers become our nn.Linear ones."""
    self_attn, cross = f"{ours}.self_attn", f"{ours}.cross_attn"
    weights.conv1d(
        [f"{self_attn}.q_proj", f"{self_attn}.k_proj", f"{self_attn}.v_proj"],
        f"{theirs}.attn.c_attn",
    )
    weights.conv1d([f"{self_attn}.out_proj"], f"{theirs}.attn.c_proj")
    weights.layer_norm(f"{ours}.self_attn_norm", f"{theirs}.ln_1")
    weights.conv1d([f"{cross}.q_proj"], f"{theirs}.crossattention.q_attn")
    weights.conv1d([f"{cross}.k_proj", f"{cross}.v_proj"], f"{theirs}.crossattention.c_attn")
    weights.conv1d([f"{cross}.out_proj"], f"{theirs}.crossattention.c_proj")
    weights.layer_norm(f"{ours}.cross_attn_norm", f"{theirs}.ln_cross_attn")
    weights.conv1d([f"{ours}.ffn.fc1"], f"{theirs}.mlp.c_fc")
    weights.conv1d([f"{ours}.ffn.fc2"], f"{theirs}.mlp.c_proj")
    weights.layer_norm(f"{ours}.ffn_norm", f"{theirs}.ln_2")
