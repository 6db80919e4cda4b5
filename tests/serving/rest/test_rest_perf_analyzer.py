"""Triton's perf_analyzer, unmodified, over HTTP/REST (``-i http``: binary tensor data) against a
real attnserve server: each model runs with 0 errors and reads the server's own figures from the
HTTP statistics route, as it does over gRPC. Skips, saying why, where perf_analyzer cannot be
installed (`make perf-analyzer`)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.perf_analyzer import PerfAnalyzer
from tests.serving.kserve.test_perf_analyzer import _check
from tests.serving.server_thread import ServerThread


def _address(server: ServerThread) -> str:
    return server.http_url.removeprefix("http://")


def test_vit_with_generated_data(perf_analyzer: PerfAnalyzer, server: ServerThread) -> None:
    for concurrency in (1, 4):
        record = perf_analyzer.run(
            _address(server), "vit", concurrency, window_ms=400, protocol="http"
        )
        _check(record)
        assert record["protocol"] == "http"


def test_vit_through_system_shared_memory(
    perf_analyzer: PerfAnalyzer, server: ServerThread
) -> None:
    """Regions registered over HTTP (``/v2/systemsharedmemory/region/NAME/register``), tensors
    passed through them."""
    record = perf_analyzer.run(
        _address(server), "vit", 2, window_ms=400, shared_memory="system", protocol="http"
    )
    _check(record)


def test_generators(perf_analyzer: PerfAnalyzer, server: ServerThread, tmp_path: Path) -> None:
    data = tmp_path / "translator.json"
    data.write_text(
        json.dumps({"data": [{"text": ["three hundred and twelve"], "target_language": ["de"]}]})
    )
    translator = perf_analyzer.run(
        _address(server), "translator", 2, window_ms=400, input_data=data, protocol="http"
    )
    _check(translator)
    # perf_analyzer takes --request-parameter over gRPC only: the captioner's own limit holds
    captioner = perf_analyzer.run(_address(server), "captioner", 2, window_ms=400, protocol="http")
    _check(captioner)
