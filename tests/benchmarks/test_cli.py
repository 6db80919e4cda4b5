"""`attnserve bench engine | serve | report`: every flag reaches the settings it names, and the
serve benchmark's plan per setup (no benchmark runs here)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from benchmarks import engine, serve
from benchmarks.cli import DEFAULT_OUT, build_parser
from benchmarks.engine_settings import EngineSettings
from benchmarks.serve_settings import ServeSettings


def run(monkeypatch: pytest.MonkeyPatch, module: Any, *argv: str) -> dict[str, Any]:
    """Parse and run `bench ARGV` with ``module.main`` replaced; what main was called with."""
    seen: dict[str, Any] = {}

    def fake_main(settings: Any, out: Path, cache: Path | None, *rest: Any, **kw: Any) -> Path:
        seen.update(settings=settings, out=out, cache=cache, rest=rest, **kw)
        return out / "result.json"

    monkeypatch.setattr(module, "main", fake_main)
    args = build_parser().parse_args(["bench", *argv])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert args.handler(args) == 0
    assert printed.getvalue().strip() == str(seen["out"] / "result.json")
    return seen


def test_engine_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = run(
        monkeypatch,
        engine,
        "engine",
        *("--batches", "1,4", "--repetitions", "2", "--warmup", "0", "--source-length", "16"),
        *("--new-tokens", "8", "--engines", "attnserve,hf", "--precisions", "fp32"),
        *("--fast-int8", "--threads", "3", "--device", "cpu", "--no-plots"),
        *("--out", str(tmp_path), "--cache", str(tmp_path / "cache")),
    )
    settings: EngineSettings = seen["settings"]
    assert settings.batches == (1, 4) and settings.repetitions == 2 and settings.warmup == 0
    assert settings.source_length == 16 and settings.new_tokens == 8
    assert settings.engines == ("attnserve", "hf") and settings.precisions == ("fp32",)
    assert settings.fast_int8 is True and settings.threads == 3 and settings.device == "cpu"
    assert not settings.tiny and seen["plots"] is False
    assert seen["out"] == tmp_path and seen["cache"] == tmp_path / "cache"


def test_engine_tiny_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run(monkeypatch, engine, "engine", "--tiny", "--batches", "3")
    assert seen["settings"] == EngineSettings.tiny_settings(batches=(3,))
    assert seen["out"] == DEFAULT_OUT and seen["cache"] is None and seen["plots"] is True


def test_serve_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = run(
        monkeypatch,
        serve,
        "serve",
        *("--repository", str(tmp_path / "repo"), "--concurrency", "1 2", "--rates", "5,7.5"),
        *("--duration", "0.5", "--new-tokens", "4", "--models", "vit"),
        *("--setups", "batching,no_batching", "--threads", "1", "--device", "cpu"),
        "--tiny",
    )
    settings: ServeSettings = seen["settings"]
    assert settings.concurrency == (1, 2) and settings.rates == (5.0, 7.5)
    assert settings.duration_s == 0.5 and settings.new_tokens == 4 and settings.models == ("vit",)
    assert settings.setups == ("batching", "no_batching") and settings.threads == 1
    assert settings.tiny and settings.text == ServeSettings.tiny_settings().text
    assert seen["rest"] == (tmp_path / "repo",) and seen["plots"] is True


def test_gpu_goals_selects_the_goal_loads_and_given_flags_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 16)  # the lent GPU host's CPUs
    settings = run(monkeypatch, serve, "serve", "--device", "cuda", "--gpu-goals")["settings"]
    assert settings.device == "cuda" and settings.setups == (
        "batching",
        "two_frontends",
        "instances",
        "stream_interval",
        "four_frontends",
        "eight_frontends",
        "eight_frontends_overlap",
        "eight_frontends_block",
    )
    assert settings.concurrency == (1, 32, 128, 256) and settings.rate_fractions == ()
    assert settings.triton is False and settings.duration_s == 3.0
    flags = ("--gpu-goals", "--duration", "2", "--client-processes", "3", "--setups", "batching")
    settings = run(monkeypatch, serve, "serve", *flags)["settings"]
    assert settings.duration_s == 2.0 and settings.client_processes == 3
    assert settings.setups == ("batching",) and settings.concurrency == (1, 32, 128, 256)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["engine", "--batches", "one"], "expected integers"),
        (["serve", "--rates", ""], "at least one number"),
        (["serve", "--device", "tpu"], "invalid choice"),
    ],
)
def test_bad_flags_are_refused(argv: list[str], message: str) -> None:
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit):
        build_parser().parse_args(["bench", *argv])
    assert message in errors.getvalue()


def test_report_flags() -> None:
    args = build_parser().parse_args(["bench", "report"])
    assert args.results == DEFAULT_OUT and args.out is None and args.readme is None
    assert not args.include_tiny
    args = build_parser().parse_args(
        ["bench", "report", "--results", "r", "--out", "o.md", "--readme", "R.md", "--include-tiny"]
    )
    assert (args.results, args.out, args.readme) == (Path("r"), Path("o.md"), Path("R.md"))
    assert args.include_tiny


def test_serve_plans_per_setup() -> None:
    pytest.importorskip("grpc")
    from benchmarks.serve_workloads import closed_plan, open_plan

    both = ("translator", "vit")
    assert closed_plan("batching", both) == [
        ("translator", "translate_stream"),
        ("translator", "translate"),
        ("vit", "classify"),
    ]
    assert closed_plan("no_inflight", both) == [("translator", "translate_stream")]
    assert closed_plan("no_batching", ("vit",)) == [("vit", "classify")]
    assert open_plan("batching", both) == [("translator", "translate_stream"), ("vit", "classify")]
    assert open_plan("no_batching", both) == [("vit", "classify")]
