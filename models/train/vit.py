"""Train the ViT digits classifier on scikit-learn's handwritten digits."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contract.images import pixel_values
from models.checkpoint import round_to_storage, save_checkpoint
from models.data.digits import load_digits_split
from models.evaluate import evaluate_vit
from models.train.common import TrainSettings, seed_everything, train_loop
from models.vit import ViT, preset

DEFAULTS = TrainSettings(
    steps=3000,
    batch_size=32,
    learning_rate=1e-3,
    warmup_steps=100,
    weight_decay=0.05,
    label_smoothing=0.1,
)


def augment(pixels: Tensor, generator: torch.Generator) -> Tensor:
    """Random small rotation, scale and shift of a batch (B, C, H, W): handwriting varies so."""
    batch = pixels.shape[0]
    angle = (torch.rand(batch, generator=generator) - 0.5) * (2 * np.pi * 12 / 360)  # ±12°
    scale = 1 + (torch.rand(batch, generator=generator) - 0.5) * 0.2  # ±10%
    shift = (torch.rand(batch, 2, generator=generator) - 0.5) * 0.25  # ±12.5% of the side
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1
    )  # (B, 2, 3)
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    # Pixels outside the image become background (-1 after normalisation with mean = std = 0.5).
    return F.grid_sample(pixels + 1, grid, align_corners=False, padding_mode="zeros") - 1


def batches(
    pixels: Tensor, labels: Tensor, batch_size: int, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless shuffled, augmented batches."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(labels), generator=generator)
        for first in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[first : first + batch_size]
            yield augment(pixels[rows], generator), labels[rows]


def train(
    out_dir: Path,
    *,
    settings: TrainSettings = DEFAULTS,
    preset_name: str = "digits",
    **config_overrides: Any,
) -> dict[str, Any]:
    """Train on the digits train split, evaluate on the held-out split, write a checkpoint."""
    seed_everything(settings.seed)
    config = preset(preset_name, **config_overrides)
    images, labels = load_digits_split("train")
    pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
    if pixels.shape[-1] != config.image_size:
        pixels = F.interpolate(pixels, size=config.image_size, mode="bilinear")
    model = ViT(config)

    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y, label_smoothing=settings.label_smoothing)

    stream = batches(pixels, torch.from_numpy(labels), settings.batch_size, settings.seed)
    history = train_loop(model, stream, loss_fn, settings, "train vit")
    history["train_examples"] = len(labels)
    history["parameters"] = sum(p.numel() for p in model.parameters())
    round_to_storage(model)  # evaluate the fp16-stored weights that ship
    metrics = {"training": history, "held_out": evaluate_vit(model)}
    save_checkpoint(out_dir, "vit", model, None, metrics)
    return metrics


def quick_settings(**overrides: Any) -> TrainSettings:
    """Settings for a short run (tests, smoke checks)."""
    return replace(DEFAULTS, **overrides)
