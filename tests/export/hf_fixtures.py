"""Tiny random-weight Hugging Face models with real tokenizer and processor files, made here.

Nothing is downloaded: the SentencePiece models, the byte-level BPE and the image processors are
trained or configured on small generated corpora and saved with the transformers classes
(``MarianTokenizer``, ``GPT2TokenizerFast``, ``ViTImageProcessor``), next to random weights saved
with ``save_pretrained``, so that the directories look like the hub's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contract.images import encode_png
from models.data import shapes
from models.data.translation import generate_pairs

MARIAN_MAX_LENGTH = 20  # generation_config max_length: 19 new tokens
CAPTION_MAX_LENGTH = 16
VIT_LABELS = ("cat", "dog", "owl", "eel", "yak", "emu", "gnu")
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Move every weight off its init (norms included) so that a wrong mapping cannot pass."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "embed_positions" not in name:  # Marian's fixed sinusoidal table
            param.add_(torch.randn(param.shape, generator=generator) * scale)


def tiny_marian_config(vocab_size: int, pad: int, eos: int, **overrides: Any) -> Any:
    """A 2+2-layer, d_model 32 ``MarianConfig`` (the tests' tiny Marian; ``overrides`` win)."""
    import transformers

    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 64,
        "activation_function": "swish",
        "scale_embedding": True,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "decoder_start_token_id": pad,
        "forced_eos_token_id": None,
        "dropout": 0.0,
    }
    return transformers.MarianConfig(**{**fields, **overrides})


def _sentencepiece(texts: list[str], path: Path, vocab_size: int) -> None:
    """Train a unigram SentencePiece model (Marian's kind) on ``texts`` into ``path``."""
    import sentencepiece

    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    path.write_bytes(buffer.getvalue())


def marian_texts(count: int, seed: int = 3) -> list[str]:
    """English source texts: held-out number phrases, some typed carelessly (case, spaces,
    punctuation, characters the SentencePiece model never saw, special-token strings)."""
    rng = np.random.default_rng(seed)
    texts = []
    for i, pair in enumerate(generate_pairs(count, seed=seed, split="test")):
        text = pair.source
        if i % 5 == 1:
            text = text.capitalize() + "."
        elif i % 5 == 2:
            text = f"  {text.upper()}  !"
        elif i % 5 == 3:
            text = text.replace("-", " ") + (" </s> €" if rng.random() < 0.5 else " <unk>")
        texts.append(text)
    return texts


def save_marian_tokenizer(directory: Path, seed: int = 0, vocab_size: int | None = None) -> dict:
    """SentencePiece models (English sources, German targets), vocab.json and the
    MarianTokenizer files; ``</s>`` is id 0, ``<unk>`` 1 and ``<pad>`` the last id.

    Args:
        directory: Where to save (created).
        seed: The corpus seed.
        vocab_size: Keep this many ids (pieces beyond it are unknown to vocab.json); None: all.

    Returns:
        vocab.json's mapping.
    """
    import sentencepiece
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    pairs = generate_pairs(3000, seed=seed, split="train")
    _sentencepiece([p.source for p in pairs], directory / "source.spm", 120)
    _sentencepiece([p.target for p in pairs if p.lang == "de"], directory / "target.spm", 120)
    vocab = {"</s>": 0, "<unk>": 1}
    for name in ("source.spm", "target.spm"):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / name))
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
    if vocab_size is not None:
        vocab = {piece: i for piece, i in vocab.items() if i < vocab_size - 1}
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    transformers.MarianTokenizer(
        str(directory / "source.spm"),
        str(directory / "target.spm"),
        str(directory / "vocab.json"),
        source_lang="en",
        target_lang="de",
    ).save_pretrained(directory)
    return vocab


def save_marian(directory: Path, seed: int = 0) -> Path:
    """A MarianMTModel (en -> de) with its SentencePiece tokenizer and generation config.

    The pad token (Marian's decoder start) gets a large logit bias, so that greedy decoding
    would choose it often if ``bad_words_ids=[[pad]]`` were not applied; EOS gets one that
    ends some translations early, the others get a forced EOS at ``max_length``.
    """
    import transformers

    vocab = save_marian_tokenizer(directory, seed)
    pad, eos = vocab["<pad>"], vocab["</s>"]
    config = tiny_marian_config(len(vocab), pad, eos, forced_eos_token_id=eos)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config)
    randomise(model, seed + 1)
    with torch.no_grad():
        bias = model.final_logits_bias
        bias.normal_(generator=torch.Generator().manual_seed(seed + 2))
        bias[0, pad] += 3.0
        bias[0, eos] += 7.0
    generation = model.generation_config
    generation.update(
        bad_words_ids=[[pad]],
        forced_eos_token_id=eos,
        max_length=MARIAN_MAX_LENGTH,
        num_beams=4,
        renormalize_logits=True,
    )
    model.eval().save_pretrained(directory, safe_serialization=True)
    return directory


def save_vit(directory: Path, seed: int = 0) -> Path:
    """A ViTForImageClassification (32 px) with a ViTImageProcessor that resizes bicubically
    and normalises with ImageNet's mean and std."""
    import transformers

    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        num_labels=len(VIT_LABELS),
        id2label=dict(enumerate(VIT_LABELS)),
        label2id={label: i for i, label in enumerate(VIT_LABELS)},
    )
    torch.manual_seed(seed)
    model = transformers.ViTForImageClassification(config)
    randomise(model, seed + 3, scale=0.5)
    model.eval().save_pretrained(directory, safe_serialization=True)
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32},
        resample=3,  # PIL bicubic
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    )
    processor.save_pretrained(directory)
    return directory


def save_captioner(directory: Path, seed: int = 0) -> Path:
    """A VisionEncoderDecoderModel (ViT 48 px + GPT-2) with a byte-level BPE GPT-2 tokenizer
    trained on generated captions and a ViTImageProcessor. The end token's logit is raised by
    2 at every position, so that some captions end before ``max_length``."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    texts = [text for _, text in shapes.generate(400, seed=seed, split="train")]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(directory)
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    encoder = transformers.ViTConfig(
        image_size=48,
        patch_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
    )
    decoder = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=64,
        activation_function="gelu",
        layer_norm_epsilon=1e-5,
        add_cross_attention=True,
        is_decoder=True,
        bos_token_id=end,
        eos_token_id=end,
    )
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = end, end, end
    torch.manual_seed(seed)
    model = transformers.VisionEncoderDecoderModel(config=config)
    randomise(model, seed + 4)
    with torch.no_grad():  # raise the end token's logit everywhere: some captions end early
        embedding, final_bias = (
            model.decoder.transformer.wte.weight,
            model.decoder.transformer.ln_f.bias,
        )
        embedding[end] += 2.0 * final_bias / final_bias.dot(final_bias)
    model.generation_config.update(
        decoder_start_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        max_length=CAPTION_MAX_LENGTH,
    )
    model.eval().save_pretrained(directory, safe_serialization=True)
    transformers.ViTImageProcessor(size={"height": 48, "width": 48}).save_pretrained(directory)
    return directory


def sample_images(count: int, seed: int = 5) -> list[bytes]:
    """PNG images of assorted sizes (smaller, larger, non-square, the model's own), smooth
    random colours with some noise, so that the resize filter matters."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        height, width = (int(v) for v in rng.integers(12, 90, size=2))
        coarse = rng.integers(0, 256, size=(4, 4, 3)).astype(np.float64)
        rows = np.linspace(0, 3, height)[:, None]
        cols = np.linspace(0, 3, width)[None, :]
        r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
        r1, c1 = np.minimum(r0 + 1, 3), np.minimum(c0 + 1, 3)
        fr, fc = (rows - r0)[..., None], (cols - c0)[..., None]
        smooth = (
            coarse[r0, c0] * (1 - fr) * (1 - fc)
            + coarse[r1, c0] * fr * (1 - fc)
            + coarse[r0, c1] * (1 - fr) * fc
            + coarse[r1, c1] * fr * fc
        )
        noisy = smooth + rng.normal(0, 12, size=smooth.shape)
        images.append(encode_png(np.clip(noisy, 0, 255).astype(np.uint8)))
    return images


def hf_generated(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    """HF ``generate`` output as attnserve reports it: no start token, cut at the first EOS."""
    row = row[1:]
    row = row[: row.index(eos_id)] if eos_id in row else row
    assert pad_id not in row or pad_id == eos_id
    return row


def count_pad(rows: Any, pad_id: int) -> int:
    """How often ``pad_id`` appears after the start token of generated rows."""
    return int(sum(list(row[1:]).count(pad_id) for row in rows.tolist()))


def save_word_tokenizer(directory: Path, vocab_size: int, specials: dict[str, int]) -> None:
    """A word-level tokenizers tokenizer of ``vocab_size`` ids, saved with transformers (for
    models whose ids matter more than their text: the weight-mapping tests).

    Args:
        directory: Where to save.
        vocab_size: The number of ids.
        specials: Special token -> id (e.g. {"<pad>": 0, "<s>": 1, "</s>": 2}).
    """
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = {i: token for token, i in specials.items()}
    vocab = {names.get(i, f"w{i}"): i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(specials))))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(list(specials))
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(directory)
