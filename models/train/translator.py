"""Train the multilingual number translator (English -> de / fr / es) from generated pairs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from contract.normalize import SourceNormalizer, write_normalizer
from contract.tokenizer import SubwordTokenizer
from models.checkpoint import round_to_storage, save_checkpoint
from models.data.translation import (
    SOURCE_NORMALIZER,
    Pair,
    generate_pairs,
    language_tag,
    language_tags,
)
from models.evaluate import evaluate_translator
from models.train.common import (
    TrainSettings,
    decoder_io,
    pad_batch,
    seed_everything,
    sequence_loss,
    train_loop,
)
from models.translator import Translator, preset

DEFAULTS = TrainSettings(
    steps=1800, batch_size=128, learning_rate=1.5e-3, warmup_steps=150, time_budget_s=780.0
)
TRAIN_PAIRS = 300_000
VOCAB_SIZE = 1000

Batch = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def train_tokenizer(pairs: list[Pair], vocab_size: int = VOCAB_SIZE) -> SubwordTokenizer:
    """A BPE tokenizer over sources and targets, with the language tags as special tokens."""
    texts = [text for pair in pairs for text in (pair.source, pair.target)]
    return SubwordTokenizer.train(texts, vocab_size, extra_special_tokens=language_tags())


def encode_pairs(pairs: list[Pair], tokenizer: SubwordTokenizer) -> tuple[list, list]:
    """Token ids of tagged sources and of targets, both ending in EOS.

    Sources go through ``SOURCE_NORMALIZER`` first, as serving's request text does (the
    generated sources are already in its spelling, so this changes none of them).
    """
    normalize = SourceNormalizer(SOURCE_NORMALIZER)
    tagged = [f"{language_tag(p.lang)} {normalize(p.source)}" for p in pairs]
    sources = tokenizer.encode_batch(tagged)
    targets = tokenizer.encode_batch([p.target for p in pairs])
    return sources, targets


def batches(
    sources: list[list[int]], targets: list[list[int]], batch_size: int, seed: int, start_id: int
) -> Iterator[Batch]:
    """Endless shuffled batches: (src ids, src mask, decoder inputs, decoder mask, labels)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(sources))
        for first in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[first : first + batch_size]
            src, src_mask = pad_batch([sources[i] for i in rows], pad=0)
            dec_in, dec_mask, labels = decoder_io([targets[i] for i in rows], start_id, pad=0)
            yield src, src_mask, dec_in, dec_mask, labels


def train(
    out_dir: Path,
    *,
    settings: TrainSettings = DEFAULTS,
    preset_name: str = "small",
    train_pairs: int = TRAIN_PAIRS,
    eval_examples: int = 1500,
    **config_overrides: Any,
) -> dict[str, Any]:
    """Generate data, train a tokenizer and the model, evaluate, write a checkpoint.

    Returns:
        The metrics written to metrics.json (training history and held-out metrics).
    """
    seed_everything(settings.seed)
    pairs = generate_pairs(train_pairs, seed=settings.seed, split="train")
    tokenizer = train_tokenizer(pairs)
    config = preset(preset_name, vocab_size=tokenizer.vocab_size, **config_overrides)
    sources, targets = encode_pairs(pairs, tokenizer)
    longest = max(max(map(len, sources)), max(map(len, targets)) + 1)
    if longest > config.max_positions:
        raise ValueError(f"training data needs {longest} positions > {config.max_positions}")
    model = Translator(config)
    start_id = config.decoder_start_id

    def loss_fn(model: nn.Module, batch: Batch) -> Tensor:
        src, src_mask, dec_in, dec_mask, labels = batch
        return sequence_loss(
            model(src, src_mask, dec_in, dec_mask), labels, settings.label_smoothing
        )

    stream = batches(sources, targets, settings.batch_size, settings.seed, start_id)
    history = train_loop(model, stream, loss_fn, settings, "train translator")
    history["train_examples"] = len(pairs)
    history["parameters"] = sum(p.numel() for p in model.parameters())
    round_to_storage(model)  # evaluate the fp16-stored weights that ship
    held_out = evaluate_translator(model, tokenizer, examples=eval_examples)
    metrics = {"training": history, "held_out": held_out}
    save_checkpoint(out_dir, "translator", model, tokenizer, metrics)
    write_normalizer(out_dir, SOURCE_NORMALIZER)  # serving normalises request text the same way
    return metrics


def quick_settings(**overrides: Any) -> TrainSettings:
    """Settings for a short run (tests, smoke checks)."""
    return replace(DEFAULTS, **overrides)


torch.set_float32_matmul_precision("high")
