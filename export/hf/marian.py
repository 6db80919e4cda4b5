"""``MarianMTModel`` -> ``models.translator.Translator``.

Post-norm layers, sinusoidal positions, embeddings shared by encoder, decoder and the LM head,
and a ``final_logits_bias``: the shape of our translator. Pre-norm variants, embedding norms and
untied embeddings are refused. The entry carries the SentencePiece tokenizer (text in, text out)
and the generation config's token rules (Marian never generates its pad token).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from export.hf.common import activation, max_new_tokens, require_equal, token_id, unsupported
from export.hf.generation import token_rules
from export.hf.registry import ArchitectureLoader, register_architecture
from export.hf.text import load_tokenizer, marian_tokenizer
from export.hf.weights import Weights, map_attention
from export.sources import EntryExtras
from models.layers import sinusoidal_table
from models.translator import Translator, TranslatorConfig

_MARIAN = "MarianMTModel"
POSITION_TOLERANCE = 1e-5  # HF's sinusoidal table against ours
# Marian config flags that switch on a layout our post-norm translator does not have.
_MARIAN_REFUSED_FLAGS = (
    "normalize_before",
    "add_final_layer_norm",
    "normalize_embedding",
    "layernorm_embedding",
    "add_bias_logits",
)


@register_architecture(_MARIAN, model_type="marian", kind="translator")
class MarianLoader(ArchitectureLoader[Translator]):
    """Marian translation models (Helsinki-NLP opus-mt and the like)."""

    # transformers computes the sinusoidal tables; checkpoints need not store them.
    computed_weights = ("embed_positions",)

    def make_model(self, hf_config: Any, directory: Path) -> Translator:
        """Our Translator for the Marian config (see ``ArchitectureLoader.make_model``)."""
        return Translator(translator_config(hf_config, directory))

    def copy_weights(self, hf_model: nn.Module, model: Translator) -> None:
        """Marian weights -> our Translator (see ``ArchitectureLoader.copy_weights``)."""
        config: TranslatorConfig = model.config
        weights = Weights(hf_model, _MARIAN)
        shared = "model.shared.weight"
        weights.copy("embed_tokens.weight", shared)
        weights.copy("decoder.embed_tokens.weight", shared)
        for name, what in (
            ("model.encoder.embed_tokens.weight", "the encoder embedding"),
            ("model.decoder.embed_tokens.weight", "the decoder embedding"),
            ("lm_head.weight", "the LM head"),
        ):
            weights.check_tied(name, shared, what)
        for side in ("encoder", "decoder"):
            _check_sinusoidal(weights, f"model.{side}.embed_positions.weight", config)
        for i in range(config.encoder_layers):
            _map_layer(weights, f"encoder.layers.{i}", f"model.encoder.layers.{i}", False)
        for i in range(config.decoder_layers):
            _map_layer(weights, f"decoder.layers.{i}", f"model.decoder.layers.{i}", True)
        weights.copy("decoder.final_logits_bias", "final_logits_bias")
        weights.load_into(model)

    def entry_extras(
        self, transformers: Any, hf_model: nn.Module, model: Translator, directory: Path
    ) -> EntryExtras:
        """The SentencePiece tokenizer, target languages and token rules (``bad_words_ids``,
        ``forced_eos_token_id``) of a Marian directory (see ``ArchitectureLoader``)."""
        config: TranslatorConfig = model.config
        tokenizer = load_tokenizer(transformers, _MARIAN, directory)
        ids = {"pad": config.pad_id, "eos": config.eos_id}
        text = marian_tokenizer(tokenizer, directory, ids)
        rules = token_rules(_MARIAN, hf_model.generation_config, config.eos_id, config.vocab_size)
        return EntryExtras(
            tokenizer=text.spec,
            tokenizer_files=text.files,
            languages=text.languages,
            suppress_ids=rules.suppress_ids,
            bad_words=rules.bad_words,
            forced_eos=rules.forced_eos,
            notes={"tokenizer": text.notes, "generation": rules.notes},
        )


def translator_config(hf: Any, directory: Path) -> TranslatorConfig:
    """Our TranslatorConfig for a HF ``MarianConfig``.

    Args:
        hf: The HF config.
        directory: The source directory (for generation_config.json).

    Returns:
        The config of the matching post-norm translator.

    Raises:
        SourceError: for anything our translator cannot express.
    """
    _check_layout(hf)
    pad_id = token_id(_MARIAN, "pad_token_id", hf.pad_token_id)
    max_positions = int(hf.max_position_embeddings)
    return TranslatorConfig(
        vocab_size=int(hf.vocab_size),
        d_model=int(hf.d_model),
        num_heads=int(hf.encoder_attention_heads),
        encoder_layers=int(hf.encoder_layers),
        decoder_layers=int(hf.decoder_layers),
        ffn_dim=int(hf.encoder_ffn_dim),
        max_positions=max_positions,
        dropout=0.0,
        norm_first=False,
        activation=activation(_MARIAN, hf.activation_function, "activation_function"),
        scale_embedding=bool(hf.scale_embedding),
        layer_norm_eps=1e-5,  # MarianEncoderLayer / MarianDecoderLayer: nn.LayerNorm defaults
        pad_id=pad_id,
        eos_id=token_id(_MARIAN, "eos_token_id", hf.eos_token_id),
        decoder_start_id=token_id(
            _MARIAN, "decoder_start_token_id", hf.decoder_start_token_id, pad_id
        ),
        max_source_length=max_positions,
        max_target_length=max_new_tokens(directory, max_positions),
    )


def _check_layout(hf: Any) -> None:
    """Refuse what our translator has as one thing and Marian may have as two, or lacks."""
    for flag in _MARIAN_REFUSED_FLAGS:
        if getattr(hf, flag, False):
            raise unsupported(
                _MARIAN,
                f"{flag}=true (our translator is post-norm, without embedding or final "
                "layer norms or a logits bias layer)",
            )
    if not getattr(hf, "share_encoder_decoder_embeddings", True):
        raise unsupported(_MARIAN, "separate encoder and decoder embeddings (we share one)")
    decoder_vocab = getattr(hf, "decoder_vocab_size", None) or hf.vocab_size
    require_equal(
        _MARIAN, "vocabulary", ("vocab_size", hf.vocab_size), ("decoder_vocab_size", decoder_vocab)
    )
    require_equal(
        _MARIAN,
        "attention heads",
        ("encoder_attention_heads", hf.encoder_attention_heads),
        ("decoder_attention_heads", hf.decoder_attention_heads),
    )
    require_equal(
        _MARIAN,
        "feed-forward width",
        ("encoder_ffn_dim", hf.encoder_ffn_dim),
        ("decoder_ffn_dim", hf.decoder_ffn_dim),
    )


def _check_sinusoidal(weights: Weights, name: str, config: TranslatorConfig) -> None:
    """Marian's position table must be the one our translator computes (it is not exported)."""
    theirs = weights.get(name)
    ours = sinusoidal_table(config.max_positions, config.d_model)
    worst = (theirs - ours).abs().max().item() if theirs.shape == ours.shape else math.inf
    if not worst <= POSITION_TOLERANCE:
        raise unsupported(
            _MARIAN,
            f"{name} is not the [sin | cos] sinusoidal table our translator uses "
            f"(max abs diff {worst:.3g})",
        )


def _map_layer(weights: Weights, ours: str, theirs: str, decoder: bool) -> None:
    """One Marian encoder or decoder layer -> ours (decoder layers add cross-attention)."""
    map_attention(weights, f"{ours}.self_attn", f"{theirs}.self_attn")
    weights.layer_norm(f"{ours}.self_attn_norm", f"{theirs}.self_attn_layer_norm")
    if decoder:
        map_attention(weights, f"{ours}.cross_attn", f"{theirs}.encoder_attn")
        weights.layer_norm(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
    weights.linear(f"{ours}.ffn.fc1", f"{theirs}.fc1")
    weights.linear(f"{ours}.ffn.fc2", f"{theirs}.fc2")
    weights.layer_norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")
