"""`attnserve export-all`: a plan of several models, exported in parallel processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from attnserve_cli import main
from contract.schema import SchemaError
from export.batch import (
    SUMMARY_FILE,
    ExportTask,
    _startable,
    load_plan,
    run_plan,
    worker_threads,
)


def write_plan(directory: Path, plan: dict[str, Any]) -> Path:
    path = directory / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def tiny_vit_checkpoint(directory: Path) -> Path:
    from models.checkpoint import save_checkpoint
    from models.vit import ViT, preset

    # The parity check classifies 32x32 digits images, so the tiny ViT takes 32x32 input.
    return save_checkpoint(directory, "vit", ViT(preset("tiny", image_size=32, patch_size=8)))


@pytest.mark.slow
def test_plan_exports_good_models_and_reports_the_broken_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_vit_checkpoint(tmp_path / "ckpt_a")
    tiny_vit_checkpoint(tmp_path / "ckpt_b")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"kind": "vit", ')
    plan = write_plan(
        tmp_path,
        {
            "repository": "repo",
            "defaults": {"parity_examples": 100},
            "models": [
                {"source": "ckpt_a"},  # name: the checkpoint's kind
                {"source": "ckpt_b", "name": "vit-b", "version": 2},
                {"source": "broken"},
            ],
        },
    )

    assert run_plan(plan, jobs=2) == 1

    repository = tmp_path / "repo"
    for version_dir in (repository / "vit" / "1", repository / "vit-b" / "2"):
        manifest = json.loads((version_dir / "manifest.json").read_text())
        assert manifest["precision"] == "fp32"
        assert (version_dir / "model.onnx").is_file()
    assert not (repository / "broken").exists()

    summary = json.loads((repository / SUMMARY_FILE).read_text())
    assert (summary["ok"], summary["failed"], summary["jobs"]) == (2, 1, 2)
    rows = summary["models"]
    assert [(r["name"], r["version"], r["status"]) for r in rows] == [
        ("vit", 1, "ok"),
        ("vit-b", 2, "ok"),
        (None, 1, "failed"),
    ]
    assert all(r["agreement_kind"] == "top-1" and r["agreement"] == 1.0 for r in rows[:2])
    assert "is not valid JSON" in rows[2]["error"]
    assert rows[2]["source"] == str(broken)

    table = capsys.readouterr().out
    assert "top-1 100.00%" in table
    failed_line = next(line for line in table.splitlines() if "FAILED" in line)
    assert failed_line.startswith("broken") and "is not valid JSON" in failed_line


def test_duplicate_name_and_version_is_rejected_before_anything_runs(tmp_path: Path) -> None:
    plan = write_plan(
        tmp_path,
        {
            "repository": "repo",
            "models": [
                {"source": "vit"},
                {"source": "translator", "version": 2},
                {"source": "translator", "name": "vit", "precision": "int8"},
            ],
        },
    )
    with pytest.raises(
        SchemaError, match=r"models\[0\] and models\[2\] both export 'vit' version 1"
    ):
        run_plan(plan, jobs=2)
    assert not (tmp_path / "repo").exists()


def test_a_kv_cache_dtype_outside_its_choices_is_named(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, {"models": [{"source": "vit", "kv_cache_dtype": "int4"}]})
    with pytest.raises(SchemaError, match=r"kv_cache_dtype: must be one of 'float', 'int8'"):
        run_plan(plan)


def test_the_decode_attention_comes_from_the_plan(tmp_path: Path) -> None:
    plan_path = write_plan(
        tmp_path,
        {
            "defaults": {"decode_attention": "matmul"},
            "models": [{"source": "vit"}, {"source": "translator", "decode_attention": "fused"}],
        },
    )
    _, _, tasks = load_plan(plan_path)
    assert [t.options["decode_attention"] for t in tasks] == ["matmul", "fused"]
    (tmp_path / "unset").mkdir(), (tmp_path / "bad").mkdir()
    unset = write_plan(tmp_path / "unset", {"models": [{"source": "vit"}]})
    assert load_plan(unset)[2][0].options["decode_attention"] is None  # the precision's default
    bad = write_plan(tmp_path / "bad", {"models": [{"source": "vit", "decode_attention": "sdpa"}]})
    with pytest.raises(SchemaError, match=r"decode_attention: must be one of 'fused', 'matmul'"):
        load_plan(bad)


def test_unknown_field_is_named(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, {"models": [{"source": "vit", "precison": "int8"}]})
    with pytest.raises(SchemaError, match=r"models\[0\]: unknown field\(s\) precison"):
        run_plan(plan)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"repo": "x", "models": [{"source": "vit"}]}, r"ExportPlan: unknown field\(s\) repo"),
        ({"models": []}, r"models must list at least one model"),
        ({"models": [{"source": "vit", "version": 0}]}, r"models\[0\]: version must be >= 1"),
        ({"defaults": {"precision": "int4"}, "models": [{"source": "vit"}]}, r"defaults.precision"),
        ({"defaults": {"parity_examples": 10}, "models": [{"source": "vit"}]}, r">= 100"),
        ({"jobs": "two", "models": [{"source": "vit"}]}, r"jobs: must be an integer"),
    ],
)
def test_bad_plans_name_the_field(tmp_path: Path, plan: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        load_plan(write_plan(tmp_path, plan))


def test_plan_paths_and_defaults_resolve_relative_to_the_plan(tmp_path: Path) -> None:
    plan_path = write_plan(
        tmp_path,
        {
            "defaults": {"precision": "fp16", "opset": 18},
            "models": [
                {"source": "vit"},
                {"source": "ckpt", "name": "x", "precision": "int8", "kv_cache_dtype": "int8"},
            ],
        },
    )
    plan, repository, tasks = load_plan(plan_path)
    assert repository == tmp_path / "model_repository"
    assert plan.jobs is None
    assert [(t.source, t.name) for t in tasks] == [("vit", "vit"), (str(tmp_path / "ckpt"), "x")]
    assert tasks[0].options["precision"] == "fp16" and tasks[0].options["name"] is None
    assert tasks[1].options["precision"] == "int8" and tasks[1].options["opset"] == 18
    assert tasks[0].options["kv_cache_dtype"] == "float"
    assert tasks[1].options["kv_cache_dtype"] == "int8"


def test_entry_names_come_from_config_json_without_loading_weights(tmp_path: Path) -> None:
    configs = {
        "ours": {"kind": "captioner"},
        "marian": {"architectures": ["MarianMTModel"], "model_type": "marian"},
        "hf_vit": {"model_type": "vit"},
        "bert": {"model_type": "bert"},
        "broken": "{not json",
    }
    for folder, config in configs.items():
        (tmp_path / folder).mkdir()
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / folder / "config.json").write_text(text)
    models = [{"source": folder} for folder in configs] + [{"source": "missing"}]
    _, _, tasks = load_plan(write_plan(tmp_path, {"models": models}))
    names = [task.name for task in tasks]
    assert names == ["captioner", "translator", "vit", None, None, None]


def test_cli_reports_a_bad_plan_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path, {"models": [{"source": "vit"}, {"source": "vit"}]})
    assert main(["export-all", str(plan)]) == 2
    assert "both export 'vit' version 1" in capsys.readouterr().err


def test_entries_sharing_a_name_never_run_together() -> None:
    def task(index: int, name: str | None) -> ExportTask:
        return ExportTask(index, "src", name, {"version": index + 1})

    a1, a2, b, unknown = task(0, "a"), task(1, "a"), task(2, "b"), task(3, None)
    assert _startable([a1, a2, b, unknown], [], 4) == [a1, b]
    assert _startable([a2, unknown], [a1], 4) == []
    assert _startable([unknown], [], 2) == [unknown]
    assert _startable([a2, b], [unknown], 2) == []


def test_worker_threads_share_the_cores() -> None:
    assert worker_threads(2, cores=2) == 1
    assert worker_threads(1, cores=2) == 2
    assert worker_threads(4, cores=2) == 1
