"""The engine goals of `bench engine`: attnserve's best configuration per precision and batch
against the run's peers, the VNNI rule, and the GPU goals of a CUDA run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.engine_goals import engine_goals
from benchmarks.report import engine_section

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _row(engine: str, precision: str, batch: int, **figures: Any) -> dict[str, Any]:
    family = engine.split("-")[0]
    return {"engine": engine, "family": family, "precision": precision, "batch": batch, **figures}


def _document(rows: list[dict], batches: list[int], device: str = "cpu", flags=()) -> dict:
    return {
        "results": rows,
        "settings": {"batches": batches, "device": device},
        "machine": {"cpu_flags": list(flags)},
    }


def cpu_rows() -> list[dict[str, Any]]:
    return [
        _row("attnserve-fp32", "fp32", 16, ratio_to_ctranslate2=1.2),
        _row("attnserve-fp32-2x1", "fp32", 16, ratio_to_ctranslate2=1.35),
        _row("ctranslate2-fp32-1x2", "fp32", 16, tokens_per_s=500.0),
        _row("attnserve-int8", "int8", 1, ratio_to_ctranslate2=1.5),
        _row("attnserve-int8", "int8", 16, ratio_to_ctranslate2=1.05),
        _row("attnserve-int8-kv8-2x1", "int8", 16, ratio_to_ctranslate2=None),  # failed
    ]


def test_each_goal_takes_the_best_configuration_and_names_it() -> None:
    goals = {g["name"]: g for g in engine_goals(_document(cpu_rows(), [1, 16]))}
    fp32 = goals["fp32_vs_ctranslate2_b16"]
    assert fp32["measured"] == 1.35 and fp32["passed"] is True
    assert fp32["engine"] == "attnserve-fp32-2x1" and fp32["target"] == 1.3
    assert goals["int8_vs_ctranslate2_b16"]["engine"] == "attnserve-int8"
    assert set(goals) == {
        "fp32_vs_ctranslate2_b16",
        "int8_vs_ctranslate2_b1",
        "int8_vs_ctranslate2_b16",
    }


def test_int8_needs_1_1x_on_a_vnni_cpu_and_1x_elsewhere() -> None:
    avx2 = {g["name"]: g for g in engine_goals(_document(cpu_rows(), [1, 16], flags=["avx2"]))}
    vnni = {
        g["name"]: g
        for g in engine_goals(_document(cpu_rows(), [1, 16], flags=["avx2", "avx512_vnni"]))
    }
    assert avx2["int8_vs_ctranslate2_b16"]["passed"] is True
    assert avx2["int8_vs_ctranslate2_b16"]["target"] == 1.0
    assert vnni["int8_vs_ctranslate2_b16"]["passed"] is False
    assert vnni["int8_vs_ctranslate2_b16"]["gap"] == pytest.approx(0.05)


def gpu_rows() -> list[dict[str, Any]]:
    rows = []
    for batch, fp32, fp16, hf32, hf16 in (
        (1, 400.0, 380.0, 160.0, 160.0),
        (64, 32_000.0, 36_000.0, 10_000.0, 11_000.0),
        (256, 64_000.0, 70_000.0, 40_000.0, 52_000.0),
    ):
        for precision, rate, hf in (("fp32", fp32, hf32), ("fp16", fp16, hf16)):
            figures = {"tokens_per_s": rate, "ratio_to_hf": rate / hf}
            ms = batch * 1000 / rate
            rows.append(_row(f"attnserve-{precision}", precision, batch, **figures, ms_per_step=ms))
        rows.append(_row("hf-generate-kv", "fp32", batch, tokens_per_s=hf32))
    return rows


def test_a_cuda_run_is_judged_by_the_gpu_goals() -> None:
    goals = {g["name"]: g for g in engine_goals(_document(gpu_rows(), [1, 64, 256], "cuda"))}
    assert goals["vs_hf_b64[fp32]"]["passed"] is True  # 3.2x
    assert goals["vs_hf_b256[fp32]"]["passed"] is False  # 1.6x
    assert goals["vs_hf_b256[fp16]"]["measured"] == pytest.approx(70 / 52, abs=1e-3)
    assert goals["tokens_per_s_b256"]["measured"] == 70_000.0
    assert goals["tokens_per_s_b256"]["engine"] == "attnserve-fp16"
    step = goals["step_ms_b1"]
    assert (
        step["measured"] == 2.5 and step["passed"] is False and step["engine"] == "attnserve-fp32"
    )
    assert goals["fp16_vs_fp32_b1"]["passed"] is False and goals["fp16_vs_fp32_b64"]["passed"]
    assert not any(name.startswith(("fp32_vs_ct", "int8_vs")) for name in goals)


def test_the_report_judges_committed_engine_results() -> None:
    run = re.compile(r"engine-\d{8}T\d{6}Z(-tiny)?")  # not engine-loop-* probes
    committed = sorted(p for p in RESULTS.rglob("engine-*.json") if run.fullmatch(p.stem))
    assert any(p.parent.name == "gpu" for p in committed)
    judged = 0
    for path in committed:
        document = json.loads(path.read_text())
        goals = engine_goals(document)
        lines = "\n".join(engine_section(document, path.name))
        assert all(g["name"] in lines for g in goals)
        judged += bool(goals)
    assert judged >= len(committed) - 1  # one committed run measured only the KV-cache variant


def test_the_latest_engine_run_is_not_another_benchmark_s_file(tmp_path: Path) -> None:
    """``transport-floor-*`` or a future ``engine-floor-*`` file sorts after ``engine-2026...``;
    the report's latest engine run skips what is not ``engine-<run id>``."""
    from benchmarks.report import latest

    for name in ("engine-20261123T223901Z", "engine-floor-20261126T045434Z", "engine-x"):
        (tmp_path / f"{name}.json").write_text("{}")
    assert latest(tmp_path, "engine") == tmp_path / "engine-20261123T223901Z.json"
    (tmp_path / "engine-20261124T000000Z-tiny.json").write_text("{}")
    assert latest(tmp_path, "engine", include_tiny=True).name.endswith("000000Z-tiny.json")
