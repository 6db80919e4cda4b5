"""`attnserve bench report`: the README results table, rendered from the latest JSON results.

Reads the newest ``engine-*.json`` and ``serve-*.json`` of a results folder (full runs; ``--tiny``
runs only when no full run exists or when asked), validates them, and writes markdown: the
machine, the engine comparison (tokens/s, ms per step, ratios, fraction of peak), the serving
goals with pass / fail, and a closed-loop summary. `--readme README.md` splices the tables
between the README's markers.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from benchmarks.engine_goals import engine_goals
from benchmarks.schema import BenchError, validate

SUMMARY_CONCURRENCY = (1, 8, 32, 64)


def latest(results: Path, kind: str, include_tiny: bool = False) -> Path | None:
    """The newest KIND-<run id>.json in ``results`` (full runs before tiny ones); other files
    whose names start with KIND- (``engine-`` of another benchmark) are not runs of KIND."""
    run = re.compile(rf"{re.escape(kind)}-\d{{8}}T\d{{6}}Z(-tiny)?")
    files = sorted(p for p in Path(results).glob(f"{kind}-*.json") if run.fullmatch(p.stem))
    full = [p for p in files if not p.stem.endswith("-tiny")]
    tiny = [p for p in files if p.stem.endswith("-tiny")]
    if include_tiny:
        chosen = sorted(full + tiny, key=lambda p: p.stem.removesuffix("-tiny"))
        return chosen[-1] if chosen else None
    if full:
        return full[-1]
    return tiny[-1] if tiny else None


def load(path: Path) -> dict[str, Any]:
    document = json.loads(Path(path).read_text())
    validate(document)
    return document


def _fmt(value: Any, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100


def machine_line(result: dict[str, Any]) -> str:
    m = result["machine"]
    versions = ", ".join(
        f"{name} {version}"
        for name, version in m["versions"].items()
        if version
        and name
        in ("onnxruntime", "onnxruntime-gpu", "ctranslate2", "torch", "transformers", "grpcio")
    )
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    memory = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
    load_avg = m.get("load_average_start")
    load_text = f"; load average at start {load_avg[0]}" if load_avg else ""
    if m.get("foreign_cpu_share") is not None:
        load_text += f"; other processes used {m['foreign_cpu_share']:.0%} of the CPU time"
    return (
        f"Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs{memory}, device "
        f"{m['device']}{gpu}; {versions}; run {m['date']}{load_text}."
    )


def _tiny_note(result: dict[str, Any]) -> str:
    tiny = result["settings"].get("tiny")
    return " (TINY configuration: the numbers mean nothing)" if tiny else ""


def _batch_header(first: str, batches: list[int]) -> list[str]:
    return [
        f"| {first} | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|" + "---|" * len(batches),
    ]


def _row(rows: list[dict[str, Any]], engine: str, batch: int) -> dict[str, Any] | None:
    """The engine's result row at ``batch`` when it was measured, else None."""
    row = next((r for r in rows if r["engine"] == engine and r["batch"] == batch), None)
    return None if row is None or row["tokens_per_s"] is None else row


# --- the engine benchmark -----------------------------------------------------------------------


def engine_section(result: dict[str, Any], source: str) -> list[str]:
    """The engine benchmark's markdown: setup, rates, ratios to peers, CTranslate2 splits."""
    lines = [f"### Engine: greedy decoding{_tiny_note(result)}", ""]
    lines += [_engine_setup(result, source), "", machine_line(result), ""]
    lines += _engine_rate_table(result)
    lines += _engine_peer_table(result)
    lines += _engine_notes(result)
    goals = engine_goals(result)  # judged again: results written before the goals have none
    if goals:
        lines += ["", "Goals (attnserve's best configuration per precision and batch):", ""]
        lines += _goal_table(goals)
    for plot in result.get("plots", []):
        lines += ["", f"![engine comparison]({plot})"]
    return lines


def _engine_setup(result: dict[str, Any], source: str) -> str:
    s = result["settings"]
    shape = result["model"]["shape"]
    peak = result["roofline"]["matmul_peak_gflops"]
    return (
        f"Random Marian model (d_model {shape['d_model']}, {shape['encoder_layers']}+"
        f"{shape['decoder_layers']} layers, {shape['heads']} heads, ffn {shape['ffn_dim']}, "
        f"vocab {shape['vocab_size']}), source {s['source_length']} tokens, exactly "
        f"{s['new_tokens']} new tokens (EOS suppressed), {s['threads']} threads per engine; "
        f"medians of {s['repetitions']} interleaved runs after {s['warmup']} warm-up. "
        f"fp32 matmul peak measured in the same run: {peak:,.0f} GFLOP/s. Source: `{source}`."
    )


def _engine_rate_table(result: dict[str, Any]) -> list[str]:
    """New tokens/s (ms per step) per engine and batch; skipped engines as dashes."""
    batches = result["settings"]["batches"]
    rows = result["results"]
    lines = ["New tokens/s (ms per decode step of the whole batch, encoder amortised):", ""]
    lines += _batch_header("engine", batches)
    for engine in result["engines"]:
        cells = []
        for batch in batches:
            row = _row(rows, engine["name"], batch)
            cells.append(
                "—" if row is None else f"{row['tokens_per_s']:,.0f} ({row['ms_per_step']:.2f} ms)"
            )
        lines.append(f"| {engine['label']} | " + " | ".join(cells) + " |")
    for skipped in result["skipped"]:
        lines.append(f"| {skipped['engine']} | " + " | ".join("—" for _ in batches) + " |")
    return lines


def _engine_peer_table(result: dict[str, Any]) -> list[str]:
    """attnserve's ratios to CTranslate2 and HF and its fraction of the peak, per precision."""
    batches = result["settings"]["batches"]
    rows = result["results"]
    brackets = (
        " (in brackets: lowest and highest over the interleaved rounds, each round comparing "
        "runs made one after the other)"
        if any(r.get("ratio_to_ctranslate2_range") for r in rows)
        else ""  # results written before the per-round ratios
    )
    lines = [
        "",
        "attnserve against its peers: ratio to the best CTranslate2 thread split of the same "
        f"precision{brackets}, ratio to HF generate with KV cache, "
        "fraction of the fp32 matmul peak "
        "(achieved FLOP/s, encoder included; for int8 a FLOP-equivalent share, as int8 kernels "
        "are not bound by the fp32 peak):",
        "",
    ]
    lines += _batch_header("attnserve", batches)
    threads = result["settings"]["threads"]
    variants = [
        (f"{precision}{kv_label}{split_label}", f"attnserve-{precision}{kv}{split_name}")
        for precision, kv, kv_label in (
            ("fp32", "", ""),
            ("fp32", "-matmul", ", matmul attention"),
            ("fp16", "", ""),
            ("int8", "", ""),
            ("int8", "-fused", ", fused attention"),
            ("int8", "-kv8", ", int8 KV cache"),
        )
        for split_name, split_label in (
            ("", ""),
            (f"-{threads}x1", f", {threads} instances × 1 thread"),
            ("-cudagraph", ", CUDA graphs"),
        )
    ]
    for label, name in variants:
        if not any(r["engine"] == name for r in rows):
            continue
        cells = [_peer_cell(_row(rows, name, batch)) for batch in batches]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _peer_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    return (
        f"{_fmt(row['ratio_to_ctranslate2'], 2, '×')}{_range(row, 'ratio_to_ctranslate2')} CT2, "
        f"{_fmt(row['ratio_to_hf'], 2, '×')} HF, "
        f"{_fmt(_percent(row['fraction_of_peak']), 1, '%')} peak"
    )


def _range(row: dict[str, Any], key: str) -> str:
    """ " (low–high)": the ratio's range over the interleaved rounds, when recorded."""
    span = row.get(f"{key}_range")
    return f" ({span[0]:.2f}–{span[1]:.2f})" if span else ""


def _engine_notes(result: dict[str, Any]) -> list[str]:
    """The best CTranslate2 split per batch, and the skipped engines with their reasons."""
    best = result["summary"]["by_batch"]
    ct2_notes = []
    for batch in result["settings"]["batches"]:
        entry = best.get(str(batch), {})
        splits = [
            f"{p} {entry[f'best_ctranslate2_{p}']['engine'].split(f'ctranslate2-{p}-', 1)[1]}"
            for p in ("fp32", "fp16", "int8")
            if f"best_ctranslate2_{p}" in entry
        ]
        if splits:
            ct2_notes.append(f"batch {batch}: {', '.join(splits)}")
    lines = []
    if ct2_notes:
        notes = "; ".join(ct2_notes)
        forced = "; -avx512: with CT2_FORCE_CPU_ISA=AVX512" if "avx512" in notes else ""
        lines += ["", f"Best CTranslate2 split (inter × intra{forced}): {notes}."]
    if result["skipped"]:
        skipped = "; ".join(f"{s['engine']} ({s['reason']})" for s in result["skipped"])
        lines += ["", f"Skipped: {skipped}."]
    return lines


# --- the serve benchmark ------------------------------------------------------------------------


def serve_section(result: dict[str, Any], source: str) -> list[str]:
    """The serve benchmark's markdown: goals, offline references, closed and open loop."""
    s = result["settings"]
    lines = [
        f"### Serving over gRPC{_tiny_note(result)}",
        "",
        f"Server `attnserve serve` in its own process on loopback, load generator (grpc.aio) in "
        f"another; {s['duration_s']:g} s per load point; translations decode exactly "
        f"{s['new_tokens']} tokens. Source: `{source}`.",
        "",
        machine_line(result),
        "",
    ]
    lines += _goal_table(result["goals"])
    lines += _offline_note(result["offline"])
    lines += _closed_loop_table(result)
    lines += _open_loop_table(result["points"])
    lines += _triton_note(result.get("triton"))
    lines += _perf_analyzer_table(result.get("perf_analyzer"))
    for plot in result.get("plots", []):
        lines += ["", f"![{plot}]({plot})"]
    return lines


def _goal_table(goals: list[dict[str, Any]]) -> list[str]:
    lines = ["| goal | measured | target | result |", "|---|---|---|---|"]
    for goal in goals:
        verdict = {True: "pass", False: "**FAIL**", None: "not measured"}[goal["passed"]]
        unit = goal.get("unit", "")
        by = f" ({goal['engine']})" if goal.get("engine") else ""  # engine goals: which config
        lines.append(
            f"| {goal['name']}: {goal['goal']} | {_fmt(goal['measured'], 3)} {unit}{by} | "
            f"{_fmt(goal.get('target'), 3)} {unit} | {verdict} |"
        )
    return lines


def _offline_note(offline: dict[str, Any]) -> list[str]:
    notes = []
    if "translator" in offline:
        t = offline["translator"]["tokens_per_s"]
        notes.append(
            "translator offline (fixed-length greedy, same ORT settings): "
            + ", ".join(f"batch {b}: {v:,.0f} tok/s" for b, v in t.items())
        )
    if "vit" in offline:
        v = offline["vit"]["images_per_s"]
        notes.append(
            "ViT onnxruntime alone: "
            + ", ".join(f"batch {b}: {x:,.0f} img/s" for b, x in v.items())
        )
    if not notes:
        return []
    return ["", "Offline references measured in the same run: " + "; ".join(notes) + "."]


def _closed_loop_table(result: dict[str, Any]) -> list[str]:
    """The fixed-workload closed-loop points at the summary concurrencies (and min / max)."""
    concurrency = result["settings"]["concurrency"]
    wanted = set(SUMMARY_CONCURRENCY) | {min(concurrency), max(concurrency)}
    lines = [
        "",
        "Closed loop (throughput; latency p50 / p99; TTFT p50 — streams: first token as the "
        "client sees it, unary: the server's own timing; TPOT p50; errors):",
        "",
        "| model | method | setup | clients | throughput | latency p50 / p99 ms | TTFT p50 ms "
        "| TPOT p50 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["points"]:
        if p["loop"] != "closed" or p.get("workload", "fixed") != "fixed":
            continue
        if p["concurrency"] not in wanted:
            continue
        rate = (
            f"{p['tokens_per_s']:,.0f} tok/s ({p['throughput_rps']:,.1f} req/s)"
            if p.get("tokens_per_s")
            else f"{p['throughput_rps']:,.1f} req/s"
        )
        lines.append(
            f"| {p['model']} | {p['method']} | {p['variant']} | {p['concurrency']} | {rate} | "
            f"{_fmt(p['latency_ms']['p50'], 1)} / {_fmt(p['latency_ms']['p99'], 1)} | "
            f"{_fmt((p.get('ttft_ms') or {}).get('p50'), 1)} | "
            f"{_fmt((p.get('tpot_ms') or {}).get('p50'), 2)} | {p['errors']} |"
        )
    return lines


def _open_loop_table(points: list[dict[str, Any]]) -> list[str]:
    open_points = [p for p in points if p["loop"] == "open"]
    if not open_points:
        return []
    lines = [
        "",
        "Open loop (Poisson arrivals):",
        "",
        "| model | method | setup | offered req/s | achieved req/s "
        "| latency p50 / p90 / p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in open_points:
        lines.append(
            f"| {p['model']} | {p['method']} | {p['variant']} | {_fmt(p['rate'], 1)} | "
            f"{p['throughput_rps']:,.1f} | {_fmt(p['latency_ms']['p50'], 1)} / "
            f"{_fmt(p['latency_ms']['p90'], 1)} / {_fmt(p['latency_ms']['p99'], 1)} | "
            f"{p['errors']} |"
        )
    return lines


def _triton_note(triton: dict[str, Any] | None) -> list[str]:
    """What the Triton peer was (its rows are ``vit | kserve_infer | triton``), or why not."""
    if not triton or triton["status"] == "not run":
        return []
    if triton["status"] != "measured":
        return ["", f"Triton peer: {triton['status']} ({triton.get('reason')})."]
    server = triton["server"]
    return [
        "",
        f"Triton peer, same run: {server.get('name', 'triton')} {server.get('version', '?')} "
        f"({server.get('runs', '')}; dynamic batcher: max batch {server.get('max_batch_size')}, "
        f"queue delay {server.get('max_queue_delay_us')} µs, {server.get('intra_op_threads')} "
        "intra-op threads) serving the same ViT ONNX model; rows `vit | kserve_infer | "
        "triton` above, attnserve's `vit | kserve_infer | batching` (one RGB image per KServe "
        "ModelInfer request, the same load generator).",
    ]


def _perf_analyzer_table(perf: dict[str, Any] | None) -> list[str]:
    """perf_analyzer's runs (server, model, flags, figures), or why it did not run."""
    if not perf:
        return []
    if perf["status"] != "measured":
        return ["", f"perf_analyzer {perf['version']}: {perf['status']} ({perf.get('reason')})."]
    lines = [
        "",
        f"perf_analyzer {perf['version']} (gRPC, closed loop; mean of its last 3 windows):",
        "",
        "| server | model | flags | clients | throughput | latency p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in perf["runs"]:
        latency = run.get("latency_ms") or {}
        flags = " ".join(run["flags"]) or "(none)"
        lines.append(
            f"| {run['server']} | {run['model']} | `{flags}` | {run['concurrency']} | "
            f"{_fmt(run.get('throughput_rps'), 1)} req/s | {_fmt(latency.get('p50'), 1)} / "
            f"{_fmt(latency.get('p99'), 1)} | {run['errors']} |"
        )
    return lines


def render(results: Path, include_tiny: bool = False) -> str:
    """The markdown of the latest engine and serve results in ``results``.

    Raises:
        BenchError: when the folder holds no results.
        ResultSchemaError: when the latest result does not validate.
    """
    sections: list[str] = ["## Benchmark results", ""]
    found = False
    for kind, renderer in (("engine", engine_section), ("serve", serve_section)):
        path = latest(results, kind, include_tiny)
        if path is None:
            continue
        found = True
        sections += renderer(load(path), path.name)
        sections.append("")
    if not found:
        raise BenchError(
            f"{results} holds no engine-*.json or serve-*.json results; run `attnserve bench "
            "engine` / `attnserve bench serve` first"
        )
    sections.append("_Generated by `attnserve bench report` from the JSON results in this folder._")
    return "\n".join(sections) + "\n"


def write_report(results: Path, out: Path, include_tiny: bool = False) -> Path:
    """Render and write the markdown; returns ``out``."""
    text = render(results, include_tiny)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


README_BEGIN = "<!-- attnserve bench report: begin (generated; edit the JSON, not this) -->"
README_END = "<!-- attnserve bench report: end -->"


def readme_markers(section: str | None = None) -> tuple[str, str]:
    """The README's begin and end markers of the tables of ``section`` (None: the main ones;
    e.g. ``gpu`` for those of benchmarks/results/gpu)."""
    if section is None:
        return README_BEGIN, README_END
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", section):
        raise BenchError(f"--section {section!r}: use lowercase letters, digits, '-' and '_'")
    label = f"attnserve bench report ({section})"
    return f"<!-- {label}: begin (generated; edit the JSON, not this) -->", f"<!-- {label}: end -->"


def update_readme(
    results: Path, readme: Path, include_tiny: bool = False, section: str | None = None
) -> Path:
    """Replace the text between the README's bench-report markers (``section``'s, see
    ``readme_markers``) with the latest tables of ``results``.

    Plot links are rewritten relative to the README. The section's own heading is dropped: the
    README keeps its heading above the markers.

    Raises:
        BenchError: the README lacks the markers, or there are no results.
    """
    begin, end = readme_markers(section)
    text = readme.read_text()
    if begin not in text or end not in text:
        raise BenchError(
            f"{readme} has no bench-report markers; put these two lines where the tables go:\n"
            f"{begin}\n{end}"
        )
    prefix = os.path.relpath(results.resolve(), readme.resolve().parent)
    body = render(results, include_tiny).split("\n", 2)[2]  # without "## Benchmark results"
    body = re.sub(r"!\[([^\]]*)\]\(([^)/]+)\)", lambda m: f"![{m[1]}]({prefix}/{m[2]})", body)
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{body}{end}{tail}")
    return readme
