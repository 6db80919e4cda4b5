"""Train the shapes captioner on generated scenes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from contract.images import pixel_values
from contract.tokenizer import SubwordTokenizer
from models.captioner import Captioner, preset
from models.checkpoint import round_to_storage, save_checkpoint
from models.data import shapes
from models.evaluate import evaluate_captioner
from models.train.common import (
    TrainSettings,
    decoder_io,
    seed_everything,
    sequence_loss,
    train_loop,
)

# Label smoothing keeps the logits moderate (unsmoothed, they grew past 100, where fp32 itself
# cannot hold the 1e-4 export parity).
DEFAULTS = TrainSettings(
    steps=2500, batch_size=64, learning_rate=1e-3, warmup_steps=150, label_smoothing=0.1
)
TOKENIZER_SCENES = 5000
VOCAB_SIZE = 160

Batch = tuple[Tensor, Tensor, Tensor, Tensor]


def batches(
    tokenizer: SubwordTokenizer, config: Any, batch_size: int, seed: int
) -> Iterator[Batch]:
    """Endless batches of freshly generated training scenes: (pixels, dec in, dec mask, labels)."""
    rng = np.random.default_rng([seed, 7])
    while True:
        chunk_seed = int(rng.integers(2**31))
        data = shapes.generate(batch_size, seed=chunk_seed, split="train")
        images = np.stack([image for image, _ in data])
        pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
        targets = tokenizer.encode_batch([text for _, text in data])
        dec_in, dec_mask, labels = decoder_io(targets, config.decoder_start_id, config.pad_id)
        yield pixels, dec_in, dec_mask, labels


def train(
    out_dir: Path,
    *,
    settings: TrainSettings = DEFAULTS,
    preset_name: str = "shapes",
    eval_examples: int = 1000,
    **config_overrides: Any,
) -> dict[str, Any]:
    """Train a caption tokenizer and the captioner, evaluate, write a checkpoint."""
    seed_everything(settings.seed)
    captions = [text for _, text in shapes.generate(TOKENIZER_SCENES, settings.seed, "train")]
    tokenizer = SubwordTokenizer.train(captions, VOCAB_SIZE)
    config = preset(preset_name, vocab_size=tokenizer.vocab_size, **config_overrides)
    model = Captioner(config)

    def loss_fn(model: nn.Module, batch: Batch) -> Tensor:
        pixels, dec_in, dec_mask, labels = batch
        return sequence_loss(model(pixels, dec_in, dec_mask), labels, settings.label_smoothing)

    stream = batches(tokenizer, config, settings.batch_size, settings.seed)
    history = train_loop(model, stream, loss_fn, settings, "train captioner")
    history["parameters"] = sum(p.numel() for p in model.parameters())
    history["train_examples"] = history["steps_done"] * settings.batch_size
    round_to_storage(model)  # evaluate the fp16-stored weights that ship
    metrics = {"training": history, "held_out": evaluate_captioner(model, tokenizer, eval_examples)}
    save_checkpoint(out_dir, "captioner", model, tokenizer, metrics)
    return metrics


def quick_settings(**overrides: Any) -> TrainSettings:
    """Settings for a short run (tests, smoke checks)."""
    return replace(DEFAULTS, **overrides)
