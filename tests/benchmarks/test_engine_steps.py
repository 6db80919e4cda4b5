"""The engine benchmark's steps on fake runners: timing rounds, noise retries, failures, derived
figures, which runners the settings ask for, and the machine facts (no model is built)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import engine_timing, machine, runners
from benchmarks.engine_figures import derive, summary
from benchmarks.engine_settings import EngineSettings
from benchmarks.engine_timing import bench_batch
from benchmarks.marian import EOS_ID, TINY, source_ids
from benchmarks.peers import (
    CTranslate2Runner,
    Runner,
    Unavailable,
    ct2_forced_isas,
    thread_splits,
)
from benchmarks.report import _engine_notes


class FakeRunner(Runner):
    """Returns ``value`` for every token; optionally fails or returns the wrong shape."""

    def __init__(
        self, name: str, family: str = "attnserve", value: int = 5, fail: bool = False
    ) -> None:
        super().__init__(name, family, "fp32", name)
        self.value, self.fail, self.calls = value, fail, 0
        self.shape: tuple[int, int] | None = None

    def run(self, ids: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.fail:
            raise RuntimeError("boom")
        return np.full(self.shape or (len(ids), 4), self.value, dtype=np.int64)


def settings(**overrides: Any) -> EngineSettings:
    base = {"new_tokens": 4, "repetitions": 3, "warmup": 1, "max_foreign_share": None}
    return EngineSettings.tiny_settings(**{**base, **overrides})


def test_every_runner_is_timed_once_per_round_after_its_warmup() -> None:
    ours, hf = FakeRunner("attnserve-fp32", value=5), FakeRunner("hf-generate-kv", "hf", 5)
    ids = np.zeros((2, 8), dtype=np.int64)
    rows = bench_batch(settings(), [ours, hf], ids, failed={})
    assert ours.calls == hf.calls == 1 + 3
    assert [r["engine"] for r in rows] == ["attnserve-fp32", "hf-generate-kv"]
    for row in rows:
        assert row["batch"] == 2 and len(row["runs_s"]) == 3 and row["error"] is None
        assert row["median_s"] is not None and row["discarded_runs"] == []
        assert row["foreign_cpu_share_runs"] == [None] * 3  # intervals too short to gauge
        assert row["agreement_with_hf"] == 1.0


def test_a_failing_runner_is_recorded_and_the_others_go_on() -> None:
    broken, wrong, fine = FakeRunner("a", fail=True), FakeRunner("b"), FakeRunner("c")
    wrong.shape = (1, 1)
    failed: dict[str, str] = {}
    rows = bench_batch(settings(), [broken, wrong, fine], np.zeros((2, 8), np.int64), failed)
    assert failed == {"a": "RuntimeError: boom", "b": "produced shape (1, 1), expected (2, 4)"}
    assert broken.calls == wrong.calls == 1  # the warm-up failed; never run again
    by_engine = {r["engine"]: r for r in rows}
    assert by_engine["a"]["error"] == "RuntimeError: boom" and by_engine["a"]["median_s"] is None
    assert by_engine["c"]["error"] is None and len(by_engine["c"]["runs_s"]) == 3
    assert "agreement_with_hf" not in by_engine["c"]  # no HF reference in this batch
    rows = bench_batch(settings(), [broken, wrong, fine], np.zeros((1, 8), np.int64), failed)
    assert [r["engine"] for r in rows] == ["c"]  # failed engines skip later batches


def test_a_noisy_run_is_discarded_and_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = iter([0.5, 0.5, 0.0, 0.0, 0.0, 0.9, 0.9])
    monkeypatch.setattr(engine_timing, "foreign_cpu_share", lambda *a: next(shares))
    waits: list[float] = []
    monkeypatch.setattr(engine_timing, "wait_for_quiet", lambda limit, pids: waits.append(limit))
    runner = FakeRunner("x")
    config = settings(repetitions=2, warmup=0, max_foreign_share=0.1, noise_retries=2)
    (row,) = bench_batch(config, [runner], np.zeros((1, 8), np.int64), {})
    # Round 1: two noisy runs discarded, the third kept. Round 2: quiet at once.
    assert [d["share"] for d in row["discarded_runs"]] == [0.5, 0.5]
    assert row["foreign_cpu_share_runs"] == [0.0, 0.0] and len(row["runs_s"]) == 2
    assert runner.calls == 4 and len(waits) == 2 + 2  # before each round, after each discard


def test_the_last_retry_is_kept_even_when_noisy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_timing, "foreign_cpu_share", lambda *a: 0.9)
    monkeypatch.setattr(engine_timing, "wait_for_quiet", lambda limit, pids: None)
    config = settings(repetitions=1, warmup=0, max_foreign_share=0.1, noise_retries=1)
    (row,) = bench_batch(config, [FakeRunner("x")], np.zeros((1, 8), np.int64), {})
    assert len(row["discarded_runs"]) == 1 and row["foreign_cpu_share_runs"] == [0.9]


def _row(engine: str, family: str, precision: str, batch: int, median: float | None) -> dict:
    return {
        "engine": engine,
        "family": family,
        "precision": precision,
        "batch": batch,
        "median_s": median,
    }


def test_derived_rates_ratios_and_summary() -> None:
    config = settings(batches=(1,), new_tokens=10)
    rows = [
        _row("attnserve-fp32", "attnserve", "fp32", 1, 0.1),
        _row("attnserve-int8", "attnserve", "int8", 1, 0.05),
        _row("ctranslate2-fp32-1x2", "ctranslate2", "fp32", 1, 0.2),
        _row("ctranslate2-fp32-2x1", "ctranslate2", "fp32", 1, 0.125),
        _row("hf-generate-kv", "hf", "fp32", 1, 0.5),
        _row("hf-generate-nokv", "hf", "fp32", 1, None),
    ]
    derive(rows, config, peak_gflops=100.0)
    ours, int8, _, best_ct2, hf, failed = rows
    assert ours["tokens_per_s"] == 100.0 and ours["ms_per_step"] == 10.0
    flops = config.shape.flops_per_sequence(config.source_length, 10)
    assert ours["gflops"] == round(flops / 0.1 / 1e9, 2)
    assert ours["ratio_to_ctranslate2"] == 1.25 and ours["ratio_to_hf"] == 5.0
    assert int8["ratio_to_ctranslate2"] == 2.5  # no int8 CTranslate2: compared with fp32's best
    assert best_ct2["ratio_to_ctranslate2"] == 1.0 and hf["ratio_to_hf"] == 1.0
    assert failed["tokens_per_s"] is None and failed["ratio_to_hf"] is None
    entry = summary(rows, config)["by_batch"]["1"]
    assert entry["best_ctranslate2_fp32"] == {
        "engine": "ctranslate2-fp32-2x1",
        "tokens_per_s": 80.0,
    }
    assert "best_ctranslate2_int8" not in entry and "hf-generate-nokv" not in entry["tokens_per_s"]
    assert entry["attnserve_int8"]["tokens_per_s"] == 200.0


def test_ratios_per_interleaved_round() -> None:
    """Each round's ratio pairs the two engines' runs of that round; the range spans them."""
    config = settings(batches=(1,), new_tokens=10)
    rows = [
        {**_row("attnserve-fp32", "attnserve", "fp32", 1, 0.1), "runs_s": [0.1, 0.2, 0.1]},
        {**_row("ctranslate2-fp32-1x2", "ctranslate2", "fp32", 1, 0.2), "runs_s": [0.2, 0.2, 0.3]},
        {**_row("hf-generate-kv", "hf", "fp32", 1, 0.4), "runs_s": [0.4, 0.5]},  # a round short
    ]
    derive(rows, config, peak_gflops=100.0)
    ours, ct2, _ = rows
    assert ours["ratio_to_ctranslate2"] == 2.0  # medians: 0.2 / 0.1
    assert ours["ratio_to_ctranslate2_rounds"] == [2.0, 1.0, 3.0]
    assert ours["ratio_to_ctranslate2_range"] == [1.0, 3.0]
    assert ct2["ratio_to_ctranslate2_rounds"] == [1.0, 1.0, 1.0]
    assert ours["ratio_to_hf"] == 4.0 and ours["ratio_to_hf_rounds"] is None  # not paired
    assert ours["ratio_to_hf_range"] is None


def test_fp16_rows_are_compared_with_the_fp16_peers() -> None:
    config = settings(batches=(1,), new_tokens=10, device="cuda", precisions=("fp32", "fp16"))
    rows = [
        _row("attnserve-fp16", "attnserve", "fp16", 1, 0.05),
        _row("ctranslate2-fp16-1x1", "ctranslate2", "fp16", 1, 0.1),
        _row("ctranslate2-fp32-1x1", "ctranslate2", "fp32", 1, 0.2),
        _row("hf-generate-kv", "hf", "fp32", 1, 0.5),
        _row("hf-generate-kv-fp16", "hf", "fp16", 1, 0.25),
    ]
    derive(rows, config, peak_gflops=100.0)
    ours, _, _, hf32, hf16 = rows
    assert ours["ratio_to_ctranslate2"] == 2.0 and ours["ratio_to_hf"] == 5.0  # fp16 peers
    assert hf32["ratio_to_hf"] == 1.0 and hf16["ratio_to_hf"] == 1.0
    entry = summary(rows, config)["by_batch"]["1"]
    assert entry["best_ctranslate2_fp16"]["engine"] == "ctranslate2-fp16-1x1"
    assert entry["attnserve_fp16"]["ratio_to_hf"] == 5.0
    derive(rows[:4], config, peak_gflops=100.0)  # no fp16 HF run: the fp32 one
    assert rows[0]["ratio_to_hf"] == 10.0


def test_runner_specs_and_skips(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runners, "ctranslate2_available", lambda device: None)
    monkeypatch.setattr(runners, "convert_ctranslate2", lambda d, c, q: tmp_path / f"ct2-{q}")
    monkeypatch.setattr(runners, "hf_available", lambda device: "transformers is not installed")
    monkeypatch.setattr(runners, "cpu_model_and_flags", lambda: ("Intel(R) Xeon(R)", AVX512))
    config = settings(engines=("ctranslate2", "hf"), threads=2)
    specs, skipped = runners.runner_specs(config, tmp_path / "marian", tmp_path)
    assert [s.name for s in specs] == [
        "ctranslate2-fp32-1x2",
        "ctranslate2-fp32-2x1",
        "ctranslate2-int8-1x2",
        "ctranslate2-int8-2x1",
    ]
    assert specs[3].kwargs["model_dir"] == tmp_path / "ct2-int8"
    assert specs[3].kwargs["inter_threads"] == 2 and specs[3].kwargs["intra_threads"] == 1
    assert [s["engine"] for s in skipped] == ["hf-generate-kv", "hf-generate-nokv"]
    assert thread_splits(1) == [(1, 1)]
    with pytest.raises(ValueError, match="factory"):
        runners.make_runner(runners.RunnerSpec("x", "nope", {}))


AVX512 = {"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}


def test_ctranslate2_also_runs_its_avx512_kernels_where_it_would_not_pick_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a CPU with AVX-512 that is not Intel's, each CTranslate2 split also runs with
    CT2_FORCE_CPU_ISA=AVX512 (in its own process only), and the faster one is the peer."""
    assert ct2_forced_isas("AMD EPYC", AVX512) == ["AVX512"]
    assert ct2_forced_isas("Intel(R) Xeon(R) Processor", AVX512) == []  # its own pick already
    assert ct2_forced_isas("AMD EPYC 7B12", {"avx2", "fma"}) == []
    assert ct2_forced_isas("AMD EPYC", AVX512 - {"avx512bw"}) == []
    monkeypatch.setattr(runners, "ctranslate2_available", lambda device: None)
    monkeypatch.setattr(runners, "convert_ctranslate2", lambda d, c, q: tmp_path / f"ct2-{q}")
    monkeypatch.setattr(runners, "cpu_model_and_flags", lambda: ("AMD EPYC", AVX512))
    config = settings(engines=("ctranslate2",), threads=2, precisions=("int8",))
    specs, _ = runners.runner_specs(config, tmp_path / "marian", tmp_path)
    assert [(s.name, s.kwargs["cpu_isa"]) for s in specs] == [
        ("ctranslate2-int8-1x2", None),
        ("ctranslate2-int8-2x1", None),
        ("ctranslate2-int8-1x2-avx512", "AVX512"),
        ("ctranslate2-int8-2x1-avx512", "AVX512"),
    ]
    shared = settings(engines=("ctranslate2",), threads=2, precisions=("int8",), isolate=False)
    specs, _ = runners.runner_specs(shared, tmp_path / "marian", tmp_path)
    assert [s.kwargs["cpu_isa"] for s in specs] == [None, None]  # one process: one pick
    rows = [
        _row("attnserve-int8", "attnserve", "int8", 1, 0.1),
        _row("ctranslate2-int8-2x1", "ctranslate2", "int8", 1, 0.3),
        _row("ctranslate2-int8-2x1-avx512", "ctranslate2", "int8", 1, 0.2),
    ]
    derive(rows, config, peak_gflops=100.0)
    assert rows[0]["ratio_to_ctranslate2"] == 2.0  # against the faster, forced one
    document = {"summary": summary(rows, config), "settings": {"batches": [1]}, "skipped": []}
    (note,) = [line for line in _engine_notes(document) if line]
    assert note == (
        "Best CTranslate2 split (inter × intra; -avx512: with CT2_FORCE_CPU_ISA=AVX512): "
        "batch 1: int8 2x1-avx512."
    )


def test_a_forced_ctranslate2_isa_needs_a_fresh_process(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")  # imported here: CTranslate2 has picked its kernels
    with pytest.raises(Unavailable, match="process of its own"):
        CTranslate2Runner(tmp_path, [], "int8", 4, 1, 1, cpu_isa="AVX512")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_attnserve_specs_per_device(
    device: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CPU: one engine per thread beside each in-place engine, and the other decode attention
    (fp32: MatMuls) on an entry of its own; CUDA: CUDA graphs instead, the fused op only."""
    monkeypatch.setattr(runners, "export_attnserve", lambda *a: tmp_path / f"entry{a[5:]}")
    config = settings(engines=("attnserve",), threads=2, device=device, precisions=("fp32",))
    specs, _ = runners.runner_specs(config, tmp_path / "marian", tmp_path)
    split = "attnserve-fp32-2x1" if device == "cpu" else "attnserve-fp32-cudagraph"
    matmul = ["attnserve-fp32-matmul", "attnserve-fp32-matmul-2x1"] if device == "cpu" else []
    assert [s.name for s in specs] == ["attnserve-fp32", split, "attnserve-fp32-growing", *matmul]
    assert specs[1].kwargs.get("cuda_graph", False) is (device == "cuda")
    assert specs[1].kwargs.get("instances", 1) == (2 if device == "cpu" else 1)
    attentions = {s.name: s.kwargs["decode_attention"] for s in specs}
    assert attentions["attnserve-fp32"] is None  # the precision's default
    if device == "cpu":
        assert attentions["attnserve-fp32-matmul-2x1"] == "matmul"
        assert specs[3].kwargs["entry"] == tmp_path / "entry('float', 'matmul')"


@pytest.mark.parametrize(
    ("device", "precision", "asked", "names"),
    [
        # on CUDA both attentions (with CUDA graphs each), fp16 exported with the MatMuls
        (
            "cuda",
            "fp16",
            ("fused", "matmul", "fused"),
            [
                ("attnserve-fp16", None),
                ("attnserve-fp16-cudagraph", None),
                ("attnserve-fp16-growing", None),
                ("attnserve-fp16-matmul", "matmul"),
                ("attnserve-fp16-matmul-cudagraph", "matmul"),
            ],
        ),
        # only the MatMuls: the in-place runs take them, the growing fallback stays
        (
            "cpu",
            "fp32",
            ("matmul",),
            [
                ("attnserve-fp32-matmul", "matmul"),
                ("attnserve-fp32-matmul-2x1", "matmul"),
                ("attnserve-fp32-growing", None),
            ],
        ),
        # int8's default is matmul: asked alone, no fused run; the int8 KV cache as always
        (
            "cpu",
            "int8",
            ("matmul",),
            [
                ("attnserve-int8", None),
                ("attnserve-int8-2x1", None),
                ("attnserve-int8-growing", None),
                ("attnserve-int8-kv8", None),
                ("attnserve-int8-kv8-2x1", None),
            ],
        ),
    ],
)
def test_decode_attentions_asked_for(
    device: str,
    precision: str,
    asked: tuple[str, ...],
    names: list[tuple[str, str | None]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``--decode-attentions`` picks the in-place runs' attentions per precision (each once)."""
    exported = []

    def export(*args: Any) -> Path:
        exported.append((args[3], args[6]))
        return tmp_path / f"{args[3]}-{args[6]}"

    monkeypatch.setattr(runners, "export_attnserve", export)
    config = settings(
        engines=("attnserve",),
        threads=2,
        device=device,
        precisions=(precision,),
        decode_attentions=asked,
    )
    specs, _ = runners.runner_specs(config, tmp_path / "marian", tmp_path)
    assert [(s.name, s.kwargs["decode_attention"]) for s in specs] == names
    assert (precision, "matmul") in exported or precision == "int8"
    assert exported.count((precision, "fused")) == 0  # the default is asked for as None


def test_fp16_specs_on_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runners, "export_attnserve", lambda *a: tmp_path / a[3])
    monkeypatch.setattr(runners, "ctranslate2_available", lambda device: None)
    monkeypatch.setattr(runners, "convert_ctranslate2", lambda d, c, q: tmp_path / f"ct2-{q}")
    monkeypatch.setattr(runners, "hf_available", lambda device: None)
    config = settings(threads=2, device="cuda", precisions=("fp16",))
    specs, skipped = runners.runner_specs(config, tmp_path / "marian", tmp_path)
    assert not skipped
    assert [s.name for s in specs] == [
        "attnserve-fp16",
        "attnserve-fp16-cudagraph",
        "attnserve-fp16-growing",
        "ctranslate2-fp16-1x1",
        "hf-generate-kv",  # the fp32 reference every engine's agreement is measured against
        "hf-generate-nokv",
        "hf-generate-kv-fp16",
    ]
    assert specs[0].kwargs["entry"] == tmp_path / "fp16"
    assert specs[3].kwargs["model_dir"] == tmp_path / "ct2-float16"
    assert specs[-1].kwargs["precision"] == "fp16" and specs[-1].kwargs["device"] == "cuda"


def test_settings_checks_and_source_ids() -> None:
    with pytest.raises(ValueError, match="engine"):
        settings(engines=("tensorrt",)).check()
    with pytest.raises(ValueError, match="batches"):
        settings(batches=()).check()
    settings().check()
    with pytest.raises(ValueError, match="fp16 runs with --device cuda only"):
        settings(precisions=("fp16",)).check()
    settings(precisions=("fp32", "fp16"), device="cuda").check()
    settings(decode_attentions=("matmul", "fused")).check()
    for wrong in [("flash",), ()]:
        with pytest.raises(ValueError, match="--decode-attentions must list fused, matmul"):
            settings(decode_attentions=wrong).check()
    ids = source_ids(np.random.default_rng(0), 3, 6, TINY)
    assert ids.shape == (3, 6) and (ids[:, -1] == EOS_ID).all()
    assert ((ids[:, :-1] >= 2) & (ids[:, :-1] < TINY.pad_id)).all()


def test_machine_facts() -> None:
    facts = machine.machine_metadata("cpu")
    assert {"cpu_model", "logical_cpus", "versions", "device", "date"} <= set(facts)
    assert facts["device"] == "cpu" and facts["gpu"] is None
    assert set(facts["versions"]) == set(machine.LIBRARIES)
    assert machine.foreign_cpu_share(None) is None
    snapshot = machine.cpu_snapshot()
    if snapshot is not None:  # Linux
        assert machine.foreign_cpu_share(snapshot) is None  # shorter than /proc/stat's ticks
