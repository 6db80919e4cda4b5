"""Held-out evaluation of the three models: the metrics `attnserve eval` prints."""

from __future__ import annotations

from typing import Any

import numpy as np
import sacrebleu
import torch

from contract.images import pixel_values
from contract.tokenizer import SubwordTokenizer
from models.captioner import Captioner
from models.data import digits, shapes
from models.data.translation import LANGUAGES, Pair, generate_pairs
from models.generation import greedy_generate
from models.train.common import pad_batch
from models.translator import Translator
from models.vit import ViT

EVAL_SEED = 1234  # held-out sets are drawn with their own seed, from the held-out split


def text_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """exact_match (0..1), corpus BLEU and chrF (sacreBLEU, 0..100)."""
    exact = float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)]))
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    return {"exact_match": round(exact, 4), "bleu": round(bleu, 2), "chrf": round(chrf, 2)}


def _greedy_texts(
    model: Translator | Captioner, tokenizer: SubwordTokenizer, cross: list, mask: torch.Tensor
) -> list[str]:
    """Greedy decoding from encoder outputs, detokenised."""
    config = model.config
    generated = greedy_generate(
        model,
        cross,
        mask,
        max_new_tokens=config.max_target_length,
        start_id=config.decoder_start_id,
        eos_id=config.eos_id,
    )
    return tokenizer.decode_batch(generated)


@torch.no_grad()
def translate(
    model: Translator,
    tokenizer: SubwordTokenizer,
    tagged_sources: list[str],
    batch_size: int = 128,
) -> list[str]:
    """Greedy translations of tagged sources ("<2de> three hundred and twelve")."""
    outputs: list[str] = []
    for first in range(0, len(tagged_sources), batch_size):
        ids = tokenizer.encode_batch(tagged_sources[first : first + batch_size])
        src, mask = pad_batch(ids, model.config.pad_id)
        _, cross = model.encode(src, mask)
        outputs.extend(_greedy_texts(model, tokenizer, cross, mask))
    return outputs


def evaluate_translator(
    model: Translator, tokenizer: SubwordTokenizer, examples: int = 1500
) -> dict[str, Any]:
    """Translator metrics on the held-out split, overall and per target language."""
    pairs = generate_pairs(examples, seed=EVAL_SEED, split="test")
    hypotheses = translate(model, tokenizer, [p.tagged_source() for p in pairs])
    return translation_report(pairs, hypotheses)


def translation_report(pairs: list[Pair], hypotheses: list[str]) -> dict[str, Any]:
    """Overall exact match / BLEU / chrF, and exact match / chrF per target language.

    BLEU is not reported per language: German numbers are single compound words, which have no
    4-grams, so German-only BLEU is 0 whatever the quality (chrF measures them).
    """
    metrics: dict[str, Any] = {
        "examples": len(pairs),
        **text_metrics(hypotheses, [p.target for p in pairs]),
    }
    for lang in LANGUAGES:
        rows = [i for i, p in enumerate(pairs) if p.lang == lang]
        scores = text_metrics([hypotheses[i] for i in rows], [pairs[i].target for i in rows])
        metrics[lang] = {"exact_match": scores["exact_match"], "chrf": scores["chrf"]}
    return metrics


@torch.no_grad()
def caption_images(
    model: Captioner, tokenizer: SubwordTokenizer, images: np.ndarray, batch_size: int = 128
) -> list[str]:
    """Greedy captions of uint8 images (N, H, W, 3)."""
    config = model.config
    outputs: list[str] = []
    for first in range(0, len(images), batch_size):
        pixels = torch.from_numpy(
            pixel_values(images[first : first + batch_size], config.image_mean, config.image_std)
        )
        memory, cross = model.encode(pixels)
        mask = torch.ones(memory.shape[:2], dtype=torch.long)
        outputs.extend(_greedy_texts(model, tokenizer, cross, mask))
    return outputs


def evaluate_captioner(
    model: Captioner, tokenizer: SubwordTokenizer, examples: int = 1000
) -> dict[str, Any]:
    """Captioner exact match and BLEU on held-out scenes."""
    data = shapes.generate(examples, seed=EVAL_SEED, split="test")
    images = np.stack([image for image, _ in data])
    hypotheses = caption_images(model, tokenizer, images)
    scores = text_metrics(hypotheses, [text for _, text in data])
    return {"examples": len(data), "exact_match": scores["exact_match"], "bleu": scores["bleu"]}


@torch.no_grad()
def evaluate_vit(model: ViT) -> dict[str, Any]:
    """ViT accuracy on the held-out digits."""
    images, labels = digits.load_digits_split("test")
    config = model.config
    pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
    predictions = torch.cat([model(chunk).argmax(-1) for chunk in pixels.split(256)])
    accuracy = float((predictions.numpy() == labels).mean())
    return {"examples": len(labels), "accuracy": round(accuracy, 4)}
