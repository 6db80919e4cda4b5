"""Checkpoint round trip and the errors a user sees for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnserve_cli import main
from contract.tokenizer import SubwordTokenizer
from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.translator import Translator, preset


@pytest.fixture()
def tiny_checkpoint(tmp_path: Path) -> Path:
    tokenizer = SubwordTokenizer.train(["three hundred", "dreihundert", "trois cents"], 120)
    model = Translator(preset("tiny", vocab_size=tokenizer.vocab_size))
    return save_checkpoint(tmp_path / "ckpt", "translator", model, tokenizer, {"note": 1})


def test_round_trip_keeps_weights_and_tied_embeddings(tiny_checkpoint: Path) -> None:
    loaded = load_checkpoint(tiny_checkpoint, expected_kind="translator")
    original = Translator(loaded.config)
    assert loaded.metrics == {"note": 1}
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab_size == loaded.config.vocab_size
    assert loaded.model.decoder.embed_tokens.weight is loaded.model.embed_tokens.weight
    assert not torch.equal(original.embed_tokens.weight, loaded.model.embed_tokens.weight)
    files = sorted(p.name for p in tiny_checkpoint.iterdir())
    assert files == ["config.json", "metrics.json", "model.safetensors", "tokenizer.json"]


def test_missing_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"does not exist.*attnserve train"):
        load_checkpoint(tmp_path / "nope")


def test_wrong_kind_is_named(tiny_checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match="holds a translator checkpoint, not a vit"):
        load_checkpoint(tiny_checkpoint, expected_kind="vit")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not valid JSON"),
        ("[1, 2]", r"must hold a JSON object"),
        ('{"kind": "translator", "d_model": "wide"}', r"'d_model' must be int"),
        ('{"kind": "translator", "colour": 3}', r"unknown field.*colour"),
        ('{"kind": "rnn"}', r"unknown model kind 'rnn'; supported: translator, vit, captioner"),
        ('{"d_model": 3}', r'no "kind" field'),
    ],
)
def test_corrupt_config_is_explained(tiny_checkpoint: Path, content: str, message: str) -> None:
    (tiny_checkpoint / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tiny_checkpoint)


def test_weights_that_do_not_match_the_config(tiny_checkpoint: Path) -> None:
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config["d_model"] = 64
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"does not match config\.json"):
        load_checkpoint(tiny_checkpoint)


def test_missing_weights_and_tokenizer(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_checkpoint(tiny_checkpoint)
    (tiny_checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        load_checkpoint(tiny_checkpoint)


def test_cli_reports_bad_input_without_traceback(tmp_path: Path, capsys) -> None:
    assert main(["eval", "translator", "--checkpoint", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "error: checkpoint directory" in err and "Traceback" not in err


def test_cli_rejects_unknown_kind(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "resnet"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'resnet'" in capsys.readouterr().err
