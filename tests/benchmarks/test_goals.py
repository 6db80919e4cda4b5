"""The serving goals: stable ids, the committed results re-evaluate to what they record, and every
goal's text states its figure and source instead of pointing at a document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import schema
from benchmarks.serve_goals import RETIRED_GOALS, evaluate_goals, find_point, goal_record

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED = sorted(p for p in RESULTS.glob("serve-*.json") if not p.stem.endswith("-tiny"))
GOAL_IDS = {
    "translator_served_vs_offline_c32[batching]",
    "translator_served_vs_offline_c32[no_inflight]",
    "translator_served_vs_offline_c32[no_batching]",
    "overhead_p50_ms[translate]",
    "overhead_p50_ms[classify,batching]",
    "overhead_p50_ms[classify,no_batching]",
    "vit_c32_vs_ort_b32[batching]",
    "vit_c32_vs_ort_b32[no_batching]",
}


def _point(model: str, variant: str, method: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "variant": variant, "method": method, "workload": "fixed", **fields}


def synthetic_run() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Load points and offline figures covering every goal of a full run."""
    points = [
        _point(
            "translator",
            "batching",
            "translate",
            workload="minimal",
            loop="closed",
            concurrency=1,
            latency_ms={"p50": 3.0},
            server_total_ms={"p50": 2.5},
        )
    ]
    for setup, tokens in (("batching", 8000.0), ("no_inflight", 6000.0), ("no_batching", 1000.0)):
        rates = {"tokens_per_s": tokens, "throughput_rps": tokens / 64}
        points.append(
            _point("translator", setup, "translate_stream", loop="closed", concurrency=32, **rates)
        )
    for setup, c1, c32 in (("batching", 400.0, 500.0), ("no_batching", 250.0, 260.0)):
        common = {"loop": "closed", "latency_ms": {"p50": 1000 / c1}}
        points.append(_point("vit", setup, "classify", concurrency=1, throughput_rps=c1, **common))
        points.append(
            _point("vit", setup, "classify", concurrency=32, throughput_rps=c32, **common)
        )
    offline = {
        "translator": {"tokens_per_s": {"32": 10000.0}, "minimal_request_ms": {"p50": 2.0}},
        "vit": {"images_per_s": {"1": 420.0, "32": 550.0}, "batch1_ms": {"p50": 2.4}},
    }
    return points, offline


def test_a_full_run_has_every_goal_id() -> None:
    points, offline = synthetic_run()
    goals = evaluate_goals(points, offline)
    assert {g["name"] for g in goals} == GOAL_IDS
    by_name = {g["name"]: g for g in goals}
    assert by_name["translator_served_vs_offline_c32[batching]"]["measured"] == 0.8
    assert by_name["translator_served_vs_offline_c32[batching]"]["passed"] is False
    assert by_name["overhead_p50_ms[translate]"]["measured"] == 1.0
    assert by_name["overhead_p50_ms[translate]"]["grpc_p50_ms"] == 0.5
    assert by_name["vit_c32_vs_ort_b32[no_batching]"]["measured"] == pytest.approx(260 / 550, 1e-3)


def test_the_instances_overhead_takes_one_engine_s_own_threads() -> None:
    """Two one-thread instances: the minimal request's engine time is the one-thread engine's."""
    points, offline = synthetic_run()
    minimal = dict(next(p for p in points if p["workload"] == "minimal"), variant="instances")
    minimal["latency_ms"] = {"p50": 2.6}
    offline["translator"]["threads"] = 2
    offline["translator"]["minimal_request_ms_by_threads"] = {"2": {"p50": 2.0}, "1": {"p50": 1.7}}
    goals = {g["name"]: g for g in evaluate_goals([*points, minimal], offline)}
    instances = goals["overhead_p50_ms[translate,instances]"]
    assert instances["engine_p50_ms"] == 1.7 and instances["measured"] == pytest.approx(0.9)
    assert goals["overhead_p50_ms[translate]"]["engine_p50_ms"] == 2.0
    del offline["translator"]["minimal_request_ms_by_threads"]  # older results: the one figure
    goals = {g["name"]: g for g in evaluate_goals([*points, minimal], offline)}
    assert goals["overhead_p50_ms[translate,instances]"]["engine_p50_ms"] == 2.0


def test_setups_engine_threads_and_merged_offline_figures() -> None:
    from benchmarks.serve_offline import merge_offline, setup_engine_threads
    from benchmarks.serve_settings import ServeSettings

    assert setup_engine_threads(ServeSettings(threads=2)) == {2, 1}
    assert setup_engine_threads(ServeSettings(threads=16)) == {16, 8}
    assert setup_engine_threads(ServeSettings(threads=1)) == {1}
    assert setup_engine_threads(ServeSettings(threads=4, setups=("batching",))) == {4}
    before = {"tokens_per_s": {"1": 10.0}, "minimal_request_ms_by_threads": {"1": {"p50": 1.0}}}
    after = {"tokens_per_s": {"1": 12.0}, "minimal_request_ms_by_threads": {"1": {"p50": 2.0}}}
    merged = merge_offline(before, after, "tokens_per_s")
    assert merged["tokens_per_s"] == {"1": 11.0}
    assert merged["minimal_request_ms_by_threads"]["1"] == {
        "p50": 1.5,
        "before_p50": 1.0,
        "after_p50": 2.0,
    }


def test_goals_not_measured_are_recorded_as_such() -> None:
    points, offline = synthetic_run()
    goals = evaluate_goals([p for p in points if p["variant"] != "batching"], offline)
    missing = [g for g in goals if g["measured"] is None]
    # The batching setup's goals stay, unmeasured; setups without points drop out.
    assert {g["name"] for g in missing} >= {
        "translator_served_vs_offline_c32[batching]",
        "overhead_p50_ms[translate]",
        "vit_c32_vs_ort_b32[batching]",
    }
    assert all(g["passed"] is None and g["note"] == "not measured in this run" for g in missing)
    assert evaluate_goals(points, {}) == []


def test_goal_texts_state_figures_not_documents() -> None:
    points, offline = synthetic_run()
    goals = evaluate_goals(points + peer_points(), offline, peer_sections())
    for goal in goals:
        text = goal["goal"]
        assert "FACTS" not in text and "shared/" not in text and ".md" not in text, text
    vit = next(g for g in goals if g["name"] == "vit_vs_triton_c1[kserve]")
    assert vit["target"] == 2.5 and vit["goal"].startswith(
        "ViT at concurrency 1: attnserve images/s >= 2.5x those of the Triton peer "
        "(Triton Inference Server 2.51.0 in PyTriton"
    )
    assert "same run" in vit["goal"]


def test_goal_record_margins() -> None:
    at_least = goal_record("g", "text", 0.8, 0.85, True, "fraction")
    assert at_least["passed"] is False and at_least["gap"] == 0.05
    at_most = goal_record("g", "text", 0.7, 1.0, False, "ms", variant="batching")
    assert at_most["passed"] is True and at_most["margin"] == 0.3 and at_most["gap"] == 0.0
    assert at_most["variant"] == "batching"
    assert find_point([{"a": 1, "b": 2}, {"a": 1, "b": 3}], a=1, b=3) == {"a": 1, "b": 3}
    assert find_point([{"a": 1}], a=2) is None


@pytest.mark.skipif(not COMMITTED, reason="no committed serve results")
@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_results_re_evaluate_to_their_goals(path: Path) -> None:
    """Same ids, figures, targets and verdicts from the recorded points, offline figures and
    sections: the goals are what older results were judged by, so `bench report` reads them
    alike (a retired goal is no longer evaluated)."""
    document = json.loads(path.read_text())
    schema.validate(document)
    sections = {k: document[k] for k in ("triton", "perf_analyzer") if k in document}
    device = document["settings"].get("device", "cpu")
    goals = evaluate_goals(document["points"], document["offline"], sections, device)
    recorded = [g for g in document["goals"] if g["name"] not in RETIRED_GOALS]
    assert [g["name"] for g in goals] == [g["name"] for g in recorded]
    for new, old in zip(goals, recorded, strict=True):
        fields = ("name", "measured", "target", "passed")
        assert {k: new[k] for k in fields} == {k: old[k] for k in fields}, new["name"]


# --- the same-run peer goals ----------------------------------------------------------------------
def peer_points() -> list[dict[str, Any]]:
    """attnserve's and the Triton peer's KServe ViT points at concurrency 1 and 32."""
    points = []
    for variant, c1, c32, p99 in (("batching", 300.0, 460.0, 80.0), ("triton", 100.0, 450.0, 90.0)):
        for concurrency, rate in ((1, c1), (32, c32)):
            points.append(
                _point(
                    "vit",
                    variant,
                    "kserve_infer",
                    loop="closed",
                    concurrency=concurrency,
                    throughput_rps=rate,
                    latency_ms={"p50": 1000 / rate, "p99": p99 / (32 // concurrency)},
                )
            )
    return points


def peer_sections(triton: str = "measured", perf: str = "measured") -> dict[str, Any]:
    runs = [
        {"server": "attnserve", "model": "vit", "concurrency": 1, "flags": [], "errors": 0,
         "throughput_rps": 310.0},
        {"server": "attnserve", "model": "vit", "concurrency": 32, "flags": [], "errors": 1,
         "error": "exit 99: boom"},
        {"server": "triton", "model": "vit", "concurrency": 32, "flags": [], "errors": 0,
         "throughput_rps": 440.0},
        {"server": "attnserve", "model": "translator", "concurrency": 32, "errors": 0,
         "flags": ["--streaming"], "throughput_rps": 125.0},
    ]  # fmt: skip
    return {
        "triton": {
            "status": triton,
            "reason": None if triton == "measured" else "no PyTriton here",
            "server": {"name": "triton", "version": "2.51.0"} if triton == "measured" else {},
        },
        "perf_analyzer": {
            "status": perf,
            "reason": None if perf == "measured" else "not installed",
            "version": "2.40.0",
            "runs": runs if perf == "measured" else [],
        },
    }


def test_peer_goals_compare_with_the_same_run() -> None:
    points, offline = synthetic_run()
    goals = evaluate_goals(points + peer_points(), offline, peer_sections())
    by_name = {g["name"]: g for g in goals}
    assert by_name["vit_vs_triton_c1[kserve]"]["measured"] == 3.0
    assert by_name["vit_vs_triton_c1[kserve]"]["passed"] is True
    c32 = by_name["vit_vs_triton_c32[kserve]"]
    assert c32["measured"] == pytest.approx(460 / 450, 1e-3) and c32["passed"] is False
    assert (c32["attnserve_images_per_s"], c32["triton_images_per_s"]) == (460.0, 450.0)
    assert by_name["vit_p99_vs_triton_c32[kserve]"]["measured"] == pytest.approx(80 / 90, 1e-3)
    assert by_name["vit_p99_vs_triton_c32[kserve]"]["passed"] is True
    errors = by_name["perf_analyzer_errors[vit]"]
    assert (
        errors["measured"] == 1
        and errors["passed"] is False
        and errors["errors"] == ["exit 99: boom"]
    )
    assert by_name["perf_analyzer_errors[vit,triton]"]["passed"] is True
    agree = by_name["perf_analyzer_vs_loadgen[vit,attnserve,c1]"]
    assert agree["ratio"] == pytest.approx(310 / 300, 1e-3) and agree["passed"] is True
    assert by_name["perf_analyzer_vs_loadgen[vit,triton,c32]"]["passed"] is True
    # The translator compares with the load generator's TranslateStream points: 125 vs 8000 / 64.
    assert by_name["perf_analyzer_vs_loadgen[translator,attnserve,c32]"]["measured"] == 0.0
    assert "perf_analyzer_vs_loadgen[vit,attnserve,c32]" not in by_name  # the run failed


def test_perf_analyzer_compares_with_the_load_generator_around_its_run() -> None:
    """A run recorded between two load generator points is judged against their mean, not the
    setup's point measured earlier in the run."""
    points, offline = synthetic_run()
    sections = peer_sections()
    translator = sections["perf_analyzer"]["runs"][3]
    translator["loadgen_rps_around"] = [100.0, 120.0]  # the machine slowed down since the setup
    goals = {g["name"]: g for g in evaluate_goals(points + peer_points(), offline, sections)}
    agree = goals["perf_analyzer_vs_loadgen[translator,attnserve,c32]"]
    assert agree["loadgen_rps"] == 110.0 and agree["ratio"] == pytest.approx(125 / 110, 1e-3)
    assert agree["passed"] is True and agree["loadgen_measured"] == "before and after the run"


def test_peer_goals_that_could_not_run_say_why() -> None:
    points, offline = synthetic_run()
    goals = evaluate_goals(points, offline, peer_sections(triton="skipped", perf="skipped"))
    peer = [g for g in goals if "triton" in g["name"] or "perf_analyzer" in g["name"]]
    assert [g["name"] for g in peer] == [
        "vit_vs_triton_c1[kserve]",
        "vit_vs_triton_c32[kserve]",
        "vit_p99_vs_triton_c1[kserve]",
        "vit_p99_vs_triton_c32[kserve]",
        "perf_analyzer_errors",
    ]
    assert all(g["measured"] is None and g["passed"] is None for g in peer)
    assert peer[0]["note"] == "Triton peer skipped: no PyTriton here"
    assert peer[-1]["note"] == "perf_analyzer skipped: not installed"
    assert RETIRED_GOALS == (
        "vit_c1_images_per_s[batching]",
        "vit_c1_images_per_s[no_batching]",
    )


def test_the_better_frontend_worker_count_is_judged_when_both_ran() -> None:
    points, offline = synthetic_run()
    names = {g["name"] for g in evaluate_goals(points, offline)}
    assert "translator_served_vs_offline_c32[best_frontend_workers]" not in names  # one count
    two = _point(
        "translator",
        "two_frontends",
        "translate_stream",
        loop="closed",
        concurrency=32,
        tokens_per_s=5500.0,
    )
    goals = {g["name"]: g for g in evaluate_goals([*points, two], offline)}
    best = goals["translator_served_vs_offline_c32[best_frontend_workers]"]
    # batching (one frontend) served 8000 of 10000 offline, two frontends 5500: one wins.
    assert (best["measured"], best["frontend_workers"], best["passed"]) == (0.8, 1, True)
    slower = {**points[1], "tokens_per_s": 5000.0}  # the batching setup's 32-stream point
    goals = {g["name"]: g for g in evaluate_goals([points[0], slower, *points[2:], two], offline)}
    best = goals["translator_served_vs_offline_c32[best_frontend_workers]"]
    assert (best["measured"], best["frontend_workers"], best["passed"]) == (0.55, 2, False)


def test_the_best_workers_count_engine_instances_too() -> None:
    points, offline = synthetic_run()

    def streams(setup: str, rate: float) -> dict:
        return _point(
            "translator",
            setup,
            "translate_stream",
            loop="closed",
            concurrency=32,
            tokens_per_s=rate,
        )

    two = streams("two_frontends", 5500.0)
    names = {g["name"] for g in evaluate_goals([*points, two], offline)}
    assert "translator_served_vs_offline_c32[best_workers]" not in names  # no instances point
    slower = {**points[1], "tokens_per_s": 5000.0}  # the batching setup's 32-stream point
    run = [points[0], slower, *points[2:], two, streams("instances", 6500.0)]
    goals = {g["name"]: g for g in evaluate_goals(run, offline)}
    best = goals["translator_served_vs_offline_c32[best_workers]"]
    assert (best["measured"], best["variant"], best["passed"]) == (0.65, "instances", True)
    assert (best["frontend_workers"], best["instances"]) == (1, 2)
    assert goals["translator_served_vs_offline_c32[instances]"]["measured"] == 0.65
    # The frontend-only judgement ignores the instances setup.
    frontends = goals["translator_served_vs_offline_c32[best_frontend_workers]"]
    assert (frontends["measured"], frontends["variant"]) == (0.55, "two_frontends")
    # Four frontends, measured on a larger machine, count for the best workers when best.
    wider = [*run, streams("four_frontends", 7000.0)]
    goals = {g["name"]: g for g in evaluate_goals(wider, offline)}
    best = goals["translator_served_vs_offline_c32[best_workers]"]
    assert (best["measured"], best["variant"]) == (0.7, "four_frontends")
    assert best["frontend_workers"] == 4
    assert goals["translator_served_vs_offline_c32[four_frontends]"]["measured"] == 0.7


def test_wide_frontend_setups_serve_batching_s_models_from_more_processes(
    tiny_repository: Path, tmp_path: Path
) -> None:
    from benchmarks.serve_setups import setup_repository
    from contract.repository import read_model_config

    models = ("translator", "vit")
    four, variants = setup_repository(tiny_repository, "four_frontends", models, 2, "cpu", tmp_path)
    plain, _ = setup_repository(tiny_repository, "batching", models, 2, "cpu", tmp_path)
    assert [v["frontend_workers"] for v in variants] == [4, 4]
    for model in models:
        assert read_model_config(four / model) == read_model_config(plain / model)


def test_on_cuda_the_setups_size_batching_for_the_largest_load(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """On CUDA every setup's translator has a cache row per stream of the largest load, and
    both models' queues hold it; a setup's own edits still win (no_batching stays at one)."""
    from benchmarks.serve_offline import served_config
    from benchmarks.serve_settings import GPU_VIT_CLIENTS
    from benchmarks.serve_setups import setup_repository
    from contract.repository import read_model_config

    models = ("translator", "vit")
    cuda, variants = setup_repository(tiny_repository, "batching", models, 2, "cuda", tmp_path)
    translator = read_model_config(cuda / "translator").batching
    assert translator.max_active_sequences == GPU_VIT_CLIENTS
    assert translator.max_queue_size >= 2 * GPU_VIT_CLIENTS
    assert read_model_config(cuda / "vit").batching.max_queue_size >= 2 * GPU_VIT_CLIENTS
    assert variants[0]["onnxruntime"]["execution_providers"][0] == "CUDAExecutionProvider"
    cpu, _ = setup_repository(tiny_repository, "batching", models, 2, "cpu", tmp_path / "cpu")
    assert read_model_config(cpu / "translator").batching.max_active_sequences < GPU_VIT_CLIENTS
    single, _ = setup_repository(tiny_repository, "no_batching", models, 2, "cuda", tmp_path / "1")
    assert read_model_config(single / "translator").batching.max_active_sequences == 1
    # the offline references decode up to the largest batch with the servers' CUDA batching
    offline = served_config(tiny_repository / "translator", 2, "cuda").batching
    assert offline.max_active_sequences == translator.max_active_sequences


def test_the_cuda_only_setups_run_on_cuda_alone(tiny_repository: Path, tmp_path: Path) -> None:
    """cuda_graphs / no_cuda_graphs serve the translator with / without CUDA graphs,
    conv_heuristic the ViT with cuDNN's heuristic search, no_batch_buckets the ViT's batches
    unpadded, each with that model alone; all are CUDA defaults and refused on the CPU."""
    from benchmarks.serve_settings import CUDA_SETUPS, ServeSettings
    from benchmarks.serve_setups import setup_repository
    from benchmarks.serve_workloads import closed_plan
    from contract.repository import read_model_config

    models = ("translator", "vit")
    graphs, _ = setup_repository(tiny_repository, "cuda_graphs", models, 2, "cuda", tmp_path)
    assert read_model_config(graphs / "translator").onnxruntime.cuda_graph is True
    assert not (graphs / "vit").exists()
    plain, _ = setup_repository(tiny_repository, "no_cuda_graphs", models, 2, "cuda", tmp_path)
    assert read_model_config(plain / "translator").onnxruntime.cuda_graph is False
    assert not (plain / "vit").exists()
    conv, _ = setup_repository(tiny_repository, "conv_heuristic", models, 2, "cuda", tmp_path)
    assert read_model_config(conv / "vit").onnxruntime.cudnn_conv_algo_search == "heuristic"
    assert not (conv / "translator").exists()
    assert closed_plan("conv_heuristic", models) == [("vit", "classify")]
    unpadded, _ = setup_repository(tiny_repository, "no_batch_buckets", models, 2, "cuda", tmp_path)
    assert read_model_config(unpadded / "vit").batching.batch_buckets == "off"
    assert read_model_config(conv / "vit").batching.batch_buckets == "auto"  # padded on CUDA
    assert not (unpadded / "translator").exists()
    assert closed_plan("cuda_graphs", models) == [("translator", "translate_stream")]
    assert not set(CUDA_SETUPS) & set(ServeSettings().setups)
    assert set(CUDA_SETUPS) <= set(ServeSettings(device="cuda").setups)
    with pytest.raises(ValueError, match="cuda only"):
        ServeSettings(setups=("batching", "cuda_graphs")).check()


def test_the_spinning_setup_bounds_the_spin_of_batching_s_models(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """The spinning setup's entries: batching's configuration, with bounded spinning; the
    variant records say so."""
    from benchmarks.serve_settings import SPIN_DURATION_US
    from benchmarks.serve_setups import setup_repository
    from contract.repository import read_model_config

    models = ("translator", "vit")
    spinning, variants = setup_repository(tiny_repository, "spinning", models, 2, "cpu", tmp_path)
    plain, _ = setup_repository(tiny_repository, "batching", models, 2, "cpu", tmp_path)
    for model in models:
        options = read_model_config(spinning / model).onnxruntime
        assert (options.allow_spinning, options.spin_duration_us) == (True, SPIN_DURATION_US)
        assert options.intra_op_threads == 2
        assert read_model_config(plain / model).onnxruntime.allow_spinning is False
        assert (
            read_model_config(spinning / model).batching
            == read_model_config(plain / model).batching
        )
    assert {v["onnxruntime"]["spin_duration_us"] for v in variants} == {SPIN_DURATION_US}
