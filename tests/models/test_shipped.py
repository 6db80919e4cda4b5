"""The checkpoints shipped in the repository meet the held-out thresholds of the foundation issue.

Runs `attnserve eval KIND` (the command a user runs) and reads the JSON on its last line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from models.checkpoint import MODEL_KINDS, shipped_checkpoint

THRESHOLDS = {
    "translator": {"exact_match": 0.98, "bleu": 95.0},
    "vit": {"accuracy": 0.97},
    "captioner": {"exact_match": 0.90},
}
SIZE_BUDGET_BYTES = 30 * 1024 * 1024


def run_eval(kind: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "attnserve_cli", "eval", kind],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_shipped_checkpoint_meets_its_thresholds(kind: str) -> None:
    result = run_eval(kind)
    assert result["kind"] == kind
    for metric, minimum in THRESHOLDS[kind].items():
        assert result[metric] >= minimum, f"{kind} {metric} {result[metric]} < {minimum}"


def test_shipped_checkpoints_fit_the_size_budget() -> None:
    total = sum(
        path.stat().st_size for kind in MODEL_KINDS for path in shipped_checkpoint(kind).iterdir()
    )
    assert total <= SIZE_BUDGET_BYTES, f"{total / 2**20:.1f} MiB > 30 MiB"


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_shipped_checkpoint_files(kind: str) -> None:
    files = {p.name for p in shipped_checkpoint(kind).iterdir()}
    assert {"model.safetensors", "config.json", "metrics.json"} <= files
    assert ("tokenizer.json" in files) == (kind != "vit")
    assert not any(name.endswith((".pt", ".pth", ".pkl", ".bin")) for name in files)
