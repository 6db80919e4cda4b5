"""Triton's perf_analyzer, unmodified, against a real attnserve server: every model runs with no
flags beyond what Triton itself needs for it (``--streaming`` for the decoupled generators, input
data for text), and finishes with 0 errors. Skips, saying why, where perf_analyzer cannot be
installed (`make perf-analyzer` installs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.perf_analyzer import REQUIREMENTS, PerfAnalyzer, parse_csv
from tests.serving.server_thread import ServerThread


def _check(record: dict) -> None:
    """0 errors, and the server's own figures read from ModelStatistics (ServerMetadata lists
    the "statistics" extension): a request's queue and compute time within its latency."""
    assert record["errors"] == 0, record["error"]
    assert record["throughput_rps"] > 0 and record["latency_ms"]["p50"] > 0
    server = record["server_ms"]
    assert server["compute_infer"] > 0 and server["queue"] >= 0
    # a loose bound (the server's and the client's windows differ a little): it catches units
    assert server["queue"] + server["compute_infer"] < 2 * record["latency_ms"]["mean"]
    assert server["compute_input"] == server["compute_output"] == 0  # inside compute_infer


def test_vit_with_generated_data_and_no_flags(
    perf_analyzer: PerfAnalyzer, server: ServerThread
) -> None:
    """The declared input (RGB pixels, UINT8) takes perf_analyzer's random bytes as images."""
    for concurrency in (1, 4):
        record = perf_analyzer.run(server.address, "vit", concurrency, window_ms=400)
        _check(record)
        assert record["flags"] == []


def test_vit_through_system_shared_memory(
    perf_analyzer: PerfAnalyzer, server: ServerThread
) -> None:
    """``--shared-memory system``: perf_analyzer registers a region per input and output, sends
    none of their bytes in the messages and checks nothing failed."""
    record = perf_analyzer.run(server.address, "vit", 2, window_ms=400, shared_memory="system")
    _check(record)
    assert record["flags"] == ["--shared-memory", "system"]


def test_captioner_streams(perf_analyzer: PerfAnalyzer, server: ServerThread) -> None:
    record = perf_analyzer.run(
        server.address,
        "captioner",
        2,
        window_ms=400,
        streaming=True,
        parameters={"max_new_tokens": ("4", "int")},
    )
    _check(record)


def test_translator_streams_text_from_input_data(
    perf_analyzer: PerfAnalyzer, server: ServerThread, tmp_path: Path
) -> None:
    """Text needs data (Triton's models too): the text and its target language, one per item."""
    data = tmp_path / "translator.json"
    data.write_text(
        json.dumps({"data": [{"text": ["three hundred and twelve"], "target_language": ["de"]}]})
    )
    for streaming in (True, False):  # ModelStreamInfer and unary ModelInfer
        record = perf_analyzer.run(
            server.address, "translator", 2, window_ms=400, streaming=streaming, input_data=data
        )
        _check(record)


def test_a_failing_request_is_reported_with_the_servers_message(
    perf_analyzer: PerfAnalyzer, server: ServerThread
) -> None:
    """Random strings are no target language: perf_analyzer stops, the record says why."""
    record = perf_analyzer.run(server.address, "translator", 1, window_ms=400, streaming=True)
    assert record["errors"] == 1 and "target_language" in record["error"]


def test_the_makefile_installs_the_pinned_release() -> None:
    """`make perf-analyzer` installs exactly what the benchmark and these tests look for."""
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    assert " ".join(REQUIREMENTS) in makefile.replace("\\\n", " ").replace("\t", "")
    assert "libb64-0d" in makefile


def test_parse_csv_reads_figures_in_ms() -> None:
    text = (
        "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,"
        "p95 latency,p99 latency,Avg latency,request/response,response wait\n"
        "2,978.146,3,1,1986,2467,2603,2993,2042,4,2027\n"
    )
    assert parse_csv(text) == {
        "throughput_rps": 978.146,
        "latency_ms": {"p50": 1.986, "p90": 2.467, "p99": 2.993, "mean": 2.042},
    }
    with_server = (
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
        "p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait\n"
        "2,231.764,7,2348,2552,0,3707,0,3,8489,10137,10615,12118,8620,10,8580\n"
    )
    assert parse_csv(with_server)["server_ms"] == {
        "queue": 2.552,
        "compute_input": 0.0,
        "compute_infer": 3.707,
        "compute_output": 0.0,
    }
    with pytest.raises(ValueError, match="no figures"):
        parse_csv("")
