"""A random-weight Marian model in Hugging Face format: the one set of weights every engine loads.

``build_marian(cache, shape)`` writes a ``save_pretrained`` directory (config.json,
model.safetensors, generation_config.json) plus the tokenizer files Marian directories carry
(vocab.json, source.spm, target.spm, tokenizer_config.json), which CTranslate2's converter loads
through ``AutoTokenizer``. The vocabulary is synthetic ("</s>", "<unk>", "▁t2", ..., "<pad>"): the
benchmarks feed token ids (CTranslate2 takes the matching token strings), so the sentencepiece
models only have to exist and load; they are trained on a few generated lines.

Layout follows the opus-mt models: EOS is id 0, ``<pad>`` is the last id and is also the decoder
start token, the pad row of the shared embedding is zero (CTranslate2 starts the decoder from a
zero embedding), swish activation, scaled embeddings, sinusoidal positions.

One deliberate change from plain random weights: ``final_logits_bias[eos] = EOS_BIAS`` so that an
unconstrained greedy decode stops at once. The export's end-to-end parity check (greedy decoding
through ONNX Runtime must match PyTorch exactly, for fp32 and int8) is then well defined for a
random model, whose long EOS-free outputs would otherwise hinge on near-tied logits. Every
benchmark suppresses EOS (exactly N new tokens), so the bias changes no timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

EOS_ID = 0
UNK_ID = 1
EOS_BIAS = 10.0
COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class MarianShape:
    """Shape of the random Marian model."""

    vocab_size: int = 8000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    heads: int = 8
    ffn_dim: int = 2048
    max_positions: int = 512
    activation: str = "swish"
    seed: int = 0

    @property
    def pad_id(self) -> int:
        return self.vocab_size - 1

    def key(self) -> str:
        """A short hash of the shape (names the cache folders built from it)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def flops_per_sequence(self, source: int, new_tokens: int) -> float:
        """Multiply-add FLOPs (x2) of encoding ``source`` tokens and decoding ``new_tokens``.

        Encoder: per token 4 d^2 (attention projections) + 2 d ffn, plus 2 S d for scores and
        values. Decoder step t (past length t): self-attention 4 d^2 + 2 (t+1) d, cross-attention
        2 d^2 (keys / values are computed once from the encoder output: 2 d^2 per source token and
        layer) + 2 S d, feed-forward 2 d ffn; then the LM head d V.
        """
        d, f, v = self.d_model, self.ffn_dim, self.vocab_size
        macs = source * self.encoder_layers * (4 * d * d + 2 * d * f + 2 * source * d)
        macs += source * self.decoder_layers * 2 * d * d  # cross keys / values
        for t in range(new_tokens):
            per_layer = 6 * d * d + 2 * d * f + 2 * (t + 1) * d + 2 * source * d
            macs += self.decoder_layers * per_layer + d * v
        return 2.0 * macs

    def decoder_flops_per_token(self) -> float:
        """FLOPs of one decoder step for one row, without the attention-length terms."""
        d = self.d_model
        return 2.0 * (
            self.decoder_layers * (6 * d * d + 2 * d * self.ffn_dim) + d * self.vocab_size
        )

    def weight_bytes_fp32(self) -> int:
        """Bytes of fp32 decoder weights read per decode step (memory floor at batch 1)."""
        d = self.d_model
        per_layer = 6 * d * d + 2 * d * self.ffn_dim
        return 4 * (self.decoder_layers * per_layer + d * self.vocab_size)


BASE = MarianShape()
TINY = MarianShape(
    vocab_size=256,
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    heads=4,
    ffn_dim=128,
    max_positions=64,
)


def default_cache() -> Path:
    """``$ATTNSERVE_BENCH_CACHE``, else ``$XDG_CACHE_HOME/attnserve-bench`` (~/.cache/...)."""
    explicit = os.environ.get("ATTNSERVE_BENCH_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnserve-bench"


def vocabulary(shape: MarianShape) -> list[str]:
    """Token strings by id: "</s>", "<unk>", "▁t2", ..., "<pad>" (the last id)."""
    tokens = [f"▁t{i}" for i in range(shape.vocab_size)]
    tokens[EOS_ID] = "</s>"
    tokens[UNK_ID] = "<unk>"
    tokens[shape.pad_id] = "<pad>"
    return tokens


def source_ids(rng: np.random.Generator, batch: int, length: int, shape: MarianShape) -> np.ndarray:
    """(batch, length) random token ids ending in EOS; no special tokens elsewhere."""
    ids = rng.integers(2, shape.vocab_size - 1, size=(batch, length), dtype=np.int64)
    ids[:, -1] = EOS_ID
    return ids


def build_marian(cache: Path, shape: MarianShape = BASE) -> Path:
    """The HF Marian directory for ``shape`` under ``cache`` (built once, then reused).

    Returns:
        ``cache/marian-<key>``, complete (built into a temporary folder, then renamed).
    """
    target = Path(cache) / f"marian-{shape.key()}"
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".marian-", dir=target.parent))
    try:
        _write_model(scratch, shape)
        _write_tokenizer(scratch, shape)
        (scratch / COMPLETE_MARKER).write_text(json.dumps(asdict(shape)) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def _write_model(directory: Path, shape: MarianShape) -> None:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=shape.vocab_size,
        decoder_vocab_size=shape.vocab_size,
        d_model=shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn_dim,
        decoder_ffn_dim=shape.ffn_dim,
        max_position_embeddings=shape.max_positions,
        activation_function=shape.activation,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        pad_token_id=shape.pad_id,
        eos_token_id=EOS_ID,
        decoder_start_token_id=shape.pad_id,
        forced_eos_token_id=None,  # HF would force EOS as the last of the fixed-length tokens
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        architectures=["MarianMTModel"],
    )
    torch.manual_seed(shape.seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.model.shared.weight[shape.pad_id].zero_()
        model.final_logits_bias.zero_()
        model.final_logits_bias[0, EOS_ID] = EOS_BIAS
    model.generation_config = GenerationConfig(
        decoder_start_token_id=shape.pad_id,
        eos_token_id=EOS_ID,
        pad_token_id=shape.pad_id,
        max_new_tokens=64,
        num_beams=1,
        do_sample=False,
    )
    model.save_pretrained(directory, safe_serialization=True)


def _write_tokenizer(directory: Path, shape: MarianShape) -> None:
    tokens = vocabulary(shape)
    (directory / "vocab.json").write_text(
        json.dumps({token: i for i, token in enumerate(tokens)}, ensure_ascii=False) + "\n"
    )
    spm = _tiny_sentencepiece()
    (directory / "source.spm").write_bytes(spm)
    (directory / "target.spm").write_bytes(spm)
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "MarianTokenizer",
                "model_max_length": shape.max_positions,
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "separate_vocabs": False,
            },
            indent=2,
        )
        + "\n"
    )


def _tiny_sentencepiece() -> bytes:
    """A small unigram sentencepiece model (only loaded, never used to tokenize benchmarks)."""
    import io

    import sentencepiece as spm

    words = [f"t{i}" for i in range(200)]
    lines = [" ".join(words[j : j + 8]) for j in range(0, len(words), 4)] * 4
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buffer,
        vocab_size=64,
        hard_vocab_limit=False,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    return buffer.getvalue()
