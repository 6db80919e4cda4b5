"""`attnserve bench engine | serve | report` in their tiny configurations (CI).

Checks structure only: the commands run, their JSON validates against the schema, the PNGs exist,
the report renders, and the schema rejects a malformed result. No timing assertions.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("matplotlib")
pytest.importorskip("grpc")

from benchmarks import schema
from benchmarks.machine import cpu_model_and_flags
from benchmarks.peers import ct2_forced_isas


def bench(*argv: str) -> Path:
    """Run `attnserve bench ...` in this process; returns the path it prints."""
    import attnserve_cli

    if "benchmarks.cli" in attnserve_cli.COMMAND_MODULES:
        parser = attnserve_cli.build_parser()
    else:  # until the lead registers the module
        from benchmarks.cli import build_parser

        parser = build_parser()
    args = parser.parse_args(["bench", *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = args.handler(args)
    assert code == 0
    return Path(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-results")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-cache")


@pytest.fixture(scope="module")
def engine_json(out_dir: Path, cache_dir: Path) -> Path:
    return bench("engine", "--tiny", "--out", str(out_dir), "--cache", str(cache_dir))


@pytest.fixture(scope="module")
def serve_json(
    out_dir: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Path:
    try:  # a session-wide tiny repository, when a conftest above this folder provides one
        repository = Path(request.getfixturevalue("tiny_repository"))
    except pytest.FixtureLookupError:
        from export.exporter import export
        from tests.repositories import FAST, tiny_sources

        repository = tmp_path_factory.mktemp("bench-repository")
        for source in tiny_sources():
            if source.kind in ("translator", "vit"):
                export(source, repository, FAST)
    return bench(
        "serve",
        "--tiny",
        "--out",
        str(out_dir),
        "--cache",
        str(tmp_path_factory.mktemp("serve-cache")),
        "--repository",
        str(repository),
        "--perf-analyzer",
    )


def _load(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    schema.validate(document)
    return document


def test_an_fp16_entry_with_the_matmul_attention_is_exported_at_fp16(
    engine_json: Path, cache_dir: Path
) -> None:
    """fp16 is not derived from the fp32 entry (as fp32's and int8's other attention are): it
    is exported at fp16 with ``decode_attention`` matmul (the fp16 export runs on the CPU)."""
    import onnx

    from benchmarks.attnserve_runner import entry_decode_attention, export_attnserve
    from benchmarks.marian import TINY, build_marian
    from contract.graphs import DECODER_INPLACE_FILE
    from contract.repository import read_manifest, resolve_version

    marian = build_marian(cache_dir, TINY)
    entry = export_attnserve(marian, cache_dir, TINY, "fp16", True, decode_attention="matmul")
    assert entry.name == "marian-fp16-matmul"
    version = resolve_version(entry)
    manifest = read_manifest(version)
    assert manifest["precision"] == "fp16" and "derived_from" not in manifest
    assert entry_decode_attention(entry) == "matmul"
    graph = onnx.load(str(version / DECODER_INPLACE_FILE), load_external_data=False).graph
    assert not [node for node in graph.node if node.op_type == "Attention"]
    past = next(i for i in graph.input if i.name == "past_key.0")
    assert past.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_engine_tiny_writes_valid_json_and_plot(engine_json: Path) -> None:
    result = _load(engine_json)
    assert result["kind"] == "engine" and result["settings"]["tiny"]
    assert result["settings"]["batches"] == [1, 2]
    names = {e["name"] for e in result["engines"]}
    assert {"attnserve-fp32", "attnserve-int8", "hf-generate-kv", "hf-generate-nokv"} <= names
    assert "attnserve-int8-kv8" in names  # the int8 KV cache, on its own entry
    kv8 = next(e for e in result["engines"] if e["name"] == "attnserve-int8-kv8")
    assert kv8["config"]["entry"].endswith("marian-int8-kv8") and kv8["error"] is None
    for batch in result["summary"]["by_batch"].values():
        assert batch["attnserve_int8_kv8"]["tokens_per_s"] > 0
    # the other decode attention on the CPU: int8's fused op (its default: MatMuls), fp32's
    # MatMuls (its default: the fused op), each on an entry of its own
    attention = {e["name"]: e for e in result["engines"] if "decode_attention" in e["config"]}
    assert attention["attnserve-int8"]["config"]["decode_attention"] == "matmul"
    assert attention["attnserve-int8-fused"]["config"]["decode_attention"] == "fused"
    assert attention["attnserve-fp32"]["config"]["decode_attention"] == "fused"
    assert attention["attnserve-fp32-matmul"]["config"]["decode_attention"] == "matmul"
    assert attention["attnserve-fp32-matmul"]["config"]["entry"].endswith("marian-fp32-matmul")
    for engine in result["engines"]:  # N x 1 instances share their sessions, as the server's do
        if engine["config"].get("instances", 1) > 1:
            assert engine["config"]["intra_op_threads"] == 1
            assert engine["config"]["shared_sessions"] is True
    try:
        import ctranslate2  # noqa: F401

        assert any(n.startswith("ctranslate2-") for n in names)
        # on an AVX-512 CPU that is not Intel's, CTranslate2 also ran with its AVX-512 kernels
        for isa in ct2_forced_isas(*cpu_model_and_flags()):
            forced = [e for e in result["engines"] if e["config"].get("cpu_isa") == isa]
            assert forced and all(e["error"] is None for e in forced), forced
    except ImportError:
        assert any(s["engine"].startswith("ctranslate2") for s in result["skipped"])
    for row in result["results"]:
        assert row["error"] is None, row
        assert len(row["runs_s"]) == result["settings"]["repetitions"]
        assert row["tokens_per_s"] is not None and row["fraction_of_peak"] is not None
    ours = [r for r in result["results"] if r["engine"] == "attnserve-fp32"]
    # Same weights and greedy decoding in every engine: fp32 outputs agree with HF's.
    assert all(r["agreement_with_hf"] >= 0.75 for r in ours)
    assert result["roofline"]["matmul_peak_gflops"] > 0
    for plot in result["plots"]:
        assert (engine_json.parent / plot).is_file()
    assert result["plots"]


def test_serve_tiny_writes_valid_json_and_plots(serve_json: Path) -> None:
    result = _load(serve_json)
    assert result["kind"] == "serve" and result["settings"]["tiny"]
    points = result["points"]
    assert {p["variant"] for p in points} == {
        "batching",
        "no_batching",
        "two_frontends",
        "instances",
    }
    assert {p["loop"] for p in points} == {"closed", "open"}
    assert {p["method"] for p in points} == {
        "translate",
        "translate_stream",
        "classify",
        "kserve_infer",
    }
    assert all(p["errors"] == 0 and p["requests"] > 0 for p in points)
    # the server's own figures per request (KServe ModelStatistics around each point): a
    # request's queue wait and compute time within its server latency, that within the client's
    for p in points:
        own = p["server_side"]
        assert own["requests"] >= p["requests"], p
        assert own["compute_ms"] > 0 and own["queue_ms"] >= 0, own
        assert own["queue_ms"] + own["compute_ms"] <= 1.1 * own["latency_ms"], own
        assert own["latency_ms"] <= p["latency_ms"]["p99"], (own, p["latency_ms"])
    stream = [p for p in points if p["method"] == "translate_stream" and p["loop"] == "closed"]
    assert all(p["tokens_per_request"] == result["settings"]["new_tokens"] for p in stream)
    assert all(p["ttft_ms"]["p50"] is not None for p in stream)
    batchings = {(v["name"], v["model"]): v["batching"] for v in result["variants"]}
    assert batchings[("no_batching", "vit")]["max_batch_size"] == 1
    assert batchings[("no_batching", "translator")]["in_flight"] is False
    assert batchings[("batching", "translator")]["in_flight"] is True
    workers = {(v["name"], v["model"]): v["frontend_workers"] for v in result["variants"]}
    assert workers[("two_frontends", "vit")] == 2 and workers[("batching", "vit")] == 1
    assert batchings[("two_frontends", "translator")] == batchings[("batching", "translator")]
    # Two instances of each model share the run's threads.
    assert batchings[("instances", "translator")]["instances"] == 2
    assert batchings[("instances", "vit")]["instances"] == 2
    threads = {
        (v["name"], v["model"]): v["onnxruntime"]["intra_op_threads"] for v in result["variants"]
    }
    total = result["settings"]["threads"]
    assert threads[("instances", "translator")] == max(1, total // 2)
    assert threads[("instances", "vit")] == max(1, total // 2)
    classified = {p["variant"] for p in points if p["method"] == "classify"}
    assert "instances" in classified
    assert threads[("batching", "translator")] == total
    assert result["settings"]["connections"] == 4
    spread = result["settings"]["client_processes"]
    assert spread >= 1 and all(1 <= p.get("client_processes", 1) <= spread for p in points)
    names = {g["name"] for g in result["goals"]}
    assert "overhead_p50_ms[translate]" in names
    assert "overhead_p50_ms[translate,two_frontends]" in names
    # the instances' lone request is judged against one engine of their own threads
    instances = next(
        g for g in result["goals"] if g["name"] == "overhead_p50_ms[translate,instances]"
    )
    by_threads = result["offline"]["translator"]["minimal_request_ms_by_threads"]
    assert set(by_threads) == {str(total), str(max(1, total // 2))}
    assert instances["engine_p50_ms"] == by_threads[str(max(1, total // 2))]["p50"]
    assert "vit_vs_triton_c1[kserve]" in names
    kserve = [p for p in points if p["method"] == "kserve_infer"]
    assert [p["concurrency"] for p in kserve] == [1, 4]
    assert all(p["server"] == "attnserve" and p["variant"] == "batching" for p in kserve)
    # A fresh cache has no Python with PyTriton, and --tiny does not create one.
    assert result["triton"]["status"] == "skipped" and "PyTriton" in result["triton"]["reason"]
    perf = result["perf_analyzer"]
    if perf["status"] == "measured":
        runs = {(r["model"], r["concurrency"]): r for r in perf["runs"]}
        assert set(runs) == {("vit", 1), ("vit", 4), ("translator", 1), ("translator", 4)}
        assert all(r["errors"] == 0 and r["throughput_rps"] > 0 for r in runs.values())
        assert runs[("vit", 1)]["flags"] == [] and "--streaming" in runs[("translator", 1)]["flags"]
        around = [r["loadgen_rps_around"] for r in runs.values()]  # the load generator's points
        assert all(len(pair) == 2 and min(pair) > 0 for pair in around)
        agree = [g for g in result["goals"] if g["name"].startswith("perf_analyzer_vs_loadgen")]
        assert agree and all(g["loadgen_measured"] == "before and after the run" for g in agree)
    else:
        assert perf["status"] == "skipped" and perf["reason"]
    assert set(result["offline"]) == {"translator", "vit"}
    for plot in result["plots"]:
        assert (serve_json.parent / plot).is_file()
    assert len(result["plots"]) == 3


def test_report_renders_the_latest_results(engine_json: Path, serve_json: Path) -> None:
    table = bench("report", "--results", str(engine_json.parent))
    assert table == engine_json.parent / "README-table.md"
    text = table.read_text()
    assert "### Engine: greedy decoding" in text and "### Serving over gRPC" in text
    assert "| attnserve ONNX Runtime fp32 |" in text
    assert "| goal | measured | target | result |" in text
    assert "Machine: " in text


def test_report_splices_the_readme(engine_json: Path, serve_json: Path, tmp_path: Path) -> None:
    from benchmarks.report import README_BEGIN, README_END

    readme = tmp_path / "README.md"
    readme.write_text(
        f"# Title\n\n## Benchmarks\n\n{README_BEGIN}\nold table\n{README_END}\n\nafter\n"
    )
    bench("report", "--results", str(engine_json.parent), "--readme", str(readme))
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{README_END}\n\nafter\n")
    assert "| attnserve ONNX Runtime fp32 |" in text and "## Benchmark results" not in text
    links = [line for line in text.splitlines() if line.startswith("![")]
    assert links
    for line in links:  # plot links resolve from the README's folder
        target = line[line.index("(") + 1 : -1]
        assert (readme.parent / target).is_file(), target
    readme.write_text("# no markers\n")
    with pytest.raises(schema.BenchError, match="markers"):
        bench("report", "--results", str(engine_json.parent), "--readme", str(readme))


def test_report_splices_a_section_between_its_own_markers(
    engine_json: Path, serve_json: Path, tmp_path: Path
) -> None:
    """--section gpu writes between the gpu markers and leaves the main tables alone."""
    from benchmarks.report import README_BEGIN, README_END, readme_markers

    begin, end = readme_markers("gpu")
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_BEGIN}\nmain\n{README_END}\n\n{begin}\nold gpu\n{end}\n")
    args = ("report", "--results", str(engine_json.parent), "--readme", str(readme))
    bench(*args, "--section", "gpu")
    text = readme.read_text()
    assert f"{README_BEGIN}\nmain\n{README_END}" in text and "old gpu" not in text
    assert text.index("| attnserve ONNX Runtime fp32 |") > text.index(begin)
    with pytest.raises(schema.BenchError, match="markers"):
        bench(*args, "--section", "other")
    with pytest.raises(schema.BenchError, match="lowercase"):
        bench(*args, "--section", "GPU tables")


def test_schema_rejects_malformed_results(engine_json: Path, serve_json: Path) -> None:
    engine = json.loads(engine_json.read_text())
    serve = json.loads(serve_json.read_text())
    broken = copy.deepcopy(engine)
    del broken["results"][0]["tokens_per_s"]
    with pytest.raises(schema.ResultSchemaError, match="tokens_per_s"):
        schema.validate(broken)
    broken = copy.deepcopy(serve)
    del broken["goals"][0]["passed"]
    with pytest.raises(schema.ResultSchemaError, match="passed"):
        schema.validate(broken)
    broken = copy.deepcopy(serve)
    broken["points"][0]["latency_ms"]["p99"] = "slow"
    with pytest.raises(schema.ResultSchemaError):
        schema.validate(broken)
    with pytest.raises(schema.ResultSchemaError, match="schema"):
        schema.validate({"kind": "engine"})
    # The hand-written checker (used when jsonschema is not installed) agrees.
    schema._check(engine, schema.ENGINE_SCHEMA, "$", "engine")
    missing = copy.deepcopy(engine)
    del missing["machine"]
    with pytest.raises(schema.ResultSchemaError, match="machine"):
        schema._check(missing, schema.ENGINE_SCHEMA, "$", "engine")


def test_ort_profile_shares_the_decoder_time(engine_json: Path, cache_dir: Path, tmp_path: Path):
    """The profile the engine goals' gaps are explained with: operator shares of a decode step."""
    from benchmarks import ort_profile

    argv = ["--tiny", "--batch", "1", "3", "--cache", str(cache_dir), "--out", str(tmp_path)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert ort_profile.main(argv) == 0
    (path,) = tmp_path.glob("ort-profile-fp32-*-tiny.json")
    result = json.loads(path.read_text())
    assert [b["batch"] for b in result["batches"]] == [1, 3]
    for batch in result["batches"]:
        assert batch["decoder_runs"] == result["new_tokens"]
        assert "MatMul" in batch["op_share"]
        assert sum(batch["op_share"].values()) == pytest.approx(1.0, abs=0.01)


def test_grpc_floor_times_every_server_client_pair(tmp_path: Path) -> None:
    """The empty call's round trip the unary overhead goal is explained with: real servers in
    their own processes, real clients."""
    from benchmarks import grpc_floor

    with contextlib.redirect_stdout(io.StringIO()):
        assert grpc_floor.main(["--tiny", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("grpc-floor-*-tiny.json")
    result = json.loads(path.read_text())
    pairs = {(p["server"], p["client"]): p for p in result["pairs"]}
    servers = ("aio", "aio-strict", "sync", "aio-engine", "sync-engine", "aio-inline")
    servers += ("sync-inline",)
    assert set(pairs) == {(s, c) for s in servers for c in ("aio", "sync")}
    for pair in pairs.values():
        assert pair["calls"] == 50 and 0 < pair["p50"] <= pair["p99"] < 1000
    for server in servers[3:]:
        for client in ("aio", "sync"):  # the answer waited for the 2 ms of work
            working = pairs[(server, client)]
            assert working["work_ms"] == 2.0 and working["p50"] >= 2.0
            assert working["overhead_p50"] == pytest.approx(working["p50"] - 2.0)
    assert "work_ms" not in pairs[("aio", "aio")] and "work_ms" not in pairs[("sync", "sync")]
    assert result["machine"]["cpu_model"]
