"""The training loop shared by the three trainers: AdamW, warmup + cosine, budget, progress bar."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings; each trainer has its own defaults."""

    steps: int  # optimiser steps (the schedule ends here, or at the time budget)
    batch_size: int
    learning_rate: float
    warmup_steps: int = 200
    weight_decay: float = 0.01
    label_smoothing: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    time_budget_s: float = 840.0  # stop (and finish the schedule) by then: the 15-minute rule
    threads: int = 0  # torch intra-op threads; 0 = all cores
    log_every: int = 50


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(settings: TrainSettings, step: int, progress: float) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to 5% as ``progress`` goes 0 -> 1."""
    warm = min(1.0, (step + 1) / max(1, settings.warmup_steps))
    cosine = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return settings.learning_rate * warm * cosine


def make_optimizer(model: nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    """AdamW with no weight decay on biases, norms, embeddings of positions and the class token."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "positions" in name else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=(0.9, 0.98), eps=1e-9)


def sequence_loss(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Token cross-entropy; targets equal to -100 (padding) are ignored."""
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


def train_loop(
    model: nn.Module,
    batches: Iterator[Any],
    loss_fn: Callable[[nn.Module, Any], Tensor],
    settings: TrainSettings,
    description: str,
) -> dict[str, Any]:
    """Run the optimisation and return the training history.

    The schedule's progress is the larger of steps done / ``steps`` and time spent / time
    budget, so a slower machine still finishes the cosine decay within the budget.

    Returns:
        A dict with settings, steps done, wall time, the loss curve (every ``log_every`` steps)
        and first / last loss.
    """
    if settings.threads:
        torch.set_num_threads(settings.threads)
    optimizer = make_optimizer(model, settings)
    model.train()
    start = time.perf_counter()
    curve: list[tuple[int, float]] = []
    running = 0.0
    step = 0
    bar = tqdm(total=settings.steps, desc=description, unit="step", mininterval=2.0)
    while True:
        elapsed = time.perf_counter() - start
        progress = max(step / settings.steps, elapsed / settings.time_budget_s)
        if progress >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(settings, step, progress)
        loss = loss_fn(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        running += loss.item()
        step += 1
        if step % settings.log_every == 0:
            curve.append((step, running / settings.log_every))
            bar.set_postfix(loss=f"{running / settings.log_every:.4f}")
            running = 0.0
        bar.update(1)
    bar.close()
    model.eval()
    return {
        "settings": asdict(settings),
        "steps_done": step,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "loss_curve": curve,
        "first_loss": curve[0][1] if curve else None,
        "final_loss": curve[-1][1] if curve else None,
    }


def pad_batch(sequences: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists to (B, T) int64 ids and an int64 mask (1 = real token)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def decoder_io(targets: list[list[int]], start_id: int, pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forcing tensors from target ids ending in EOS.

    Returns:
        decoder inputs (start + target[:-1]), their mask, and labels (target, -100 on padding).
    """
    inputs, mask = pad_batch([[start_id, *t[:-1]] for t in targets], pad)
    labels, label_mask = pad_batch(targets, pad)
    labels = labels.masked_fill(label_mask == 0, -100)
    return inputs, mask, labels
