"""Short training runs: the loss falls and a loadable checkpoint comes out."""

from __future__ import annotations

from pathlib import Path

from contract.normalize import read_normalizer
from models.checkpoint import load_checkpoint
from models.data.translation import SOURCE_NORMALIZER
from models.train import captioner, translator, vit


def _falls(metrics: dict) -> bool:
    curve = metrics["training"]["loss_curve"]
    return len(curve) >= 2 and curve[-1][1] < 0.8 * curve[0][1]


def test_translator_loss_falls(tmp_path: Path) -> None:
    settings = translator.quick_settings(steps=60, batch_size=32, warmup_steps=10, log_every=10)
    metrics = translator.train(
        tmp_path, settings=settings, preset_name="tiny", train_pairs=3000, eval_examples=30
    )
    assert _falls(metrics)
    assert 0.0 <= metrics["held_out"]["exact_match"] <= 1.0
    checkpoint = load_checkpoint(tmp_path, expected_kind="translator")
    assert checkpoint.config.vocab_size == checkpoint.tokenizer.vocab_size
    assert read_normalizer(tmp_path) == SOURCE_NORMALIZER  # what serving applies to requests


def test_vit_loss_falls(tmp_path: Path) -> None:
    settings = vit.quick_settings(
        steps=60,
        batch_size=32,
        warmup_steps=10,
        log_every=10,
        learning_rate=3e-3,
        label_smoothing=0.0,
    )
    metrics = vit.train(
        tmp_path, settings=settings, preset_name="tiny", image_size=32, patch_size=8
    )
    curve = metrics["training"]["loss_curve"]
    assert curve[-1][1] < 0.95 * curve[0][1]  # a ViT warms up slowly: 60 steps move it ~10%
    assert metrics["held_out"]["examples"] == 360
    assert metrics["held_out"]["accuracy"] > 0.2  # chance is 0.1


def test_captioner_loss_falls(tmp_path: Path) -> None:
    settings = captioner.quick_settings(steps=40, batch_size=16, warmup_steps=5, log_every=10)
    metrics = captioner.train(
        tmp_path,
        settings=settings,
        preset_name="tiny",
        eval_examples=20,
        image_size=48,
        patch_size=8,
    )
    assert _falls(metrics)
    assert load_checkpoint(tmp_path).kind == "captioner"
