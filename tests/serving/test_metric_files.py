"""A multi-process server's /metrics while processes create their metric files: a file that is
empty (created, not yet sized, or left so by a killed process) must not fail the scrape.

The files are written by prometheus-client's own writer (``MmapedDict``), as the server's
processes write them."""

from __future__ import annotations

import logging
import struct
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from serving.metrics import multiprocess_registry, start_metrics_http_server
from tests.reliability.harness import sample, scrape

NAME = "attnserve_requests"


def write_counter(directory: Path, pid: int, value: float, created_empty_for: float = 0.0) -> None:
    """The counter file of process ``pid`` holding ``value``; ``created_empty_for`` seconds at 0
    bytes first, as a process that has opened its file and not yet sized it."""
    path = directory / f"counter_{pid}.db"
    if created_empty_for:
        path.touch()
        time.sleep(created_empty_for)
    values = MmapedDict(str(path))
    key = mmap_key(NAME, NAME + "_total", ["model"], ["vit"], "Requests.")
    values.write_value(key, value, 0.0)
    values.close()


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/metrics"


def test_an_empty_file_left_by_a_killed_process_is_left_out_not_a_failed_scrape(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_counter(tmp_path, 101, 3.0)
    write_counter(tmp_path, 102, 4.0)
    (tmp_path / "counter_103.db").touch()  # killed between creating and sizing its file
    plain = CollectorRegistry()
    MultiProcessCollector(plain, path=str(tmp_path))
    with pytest.raises(struct.error):  # what /metrics answered 500 for
        list(plain.collect())

    server, port = start_metrics_http_server(multiprocess_registry(str(tmp_path)), 0)
    try:
        with caplog.at_level(logging.WARNING, "serving.multiprocess.metric_files"):
            scrapes = [scrape(url(port)), scrape(url(port))]
    finally:
        server.stop()
    for families in scrapes:
        assert sample(families, NAME + "_total", model="vit") == 7.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per file, not per scrape
    assert "counter_103.db" in warnings[0] and "delete it" in warnings[0]


def test_scrapes_while_processes_create_their_files_all_succeed(tmp_path: Path) -> None:
    """Thirty processes' files created 5 ms apart, each empty for 2 ms first, while
    /metrics is scraped without pause: every scrape answers, and the last one counts them all."""
    processes = 30
    writer = threading.Thread(
        target=lambda: [
            (write_counter(tmp_path, 1000 + i, 1.0, created_empty_for=0.002), time.sleep(0.005))
            for i in range(processes)
        ]
    )
    server, port = start_metrics_http_server(multiprocess_registry(str(tmp_path)), 0)
    seen: list[float] = []
    try:
        writer.start()
        while writer.is_alive():
            seen.append(sample(scrape(url(port)), NAME + "_total", model="vit"))
        writer.join()
        final = sample(scrape(url(port)), NAME + "_total", model="vit")
    finally:
        server.stop()
    assert final == processes
    assert len(seen) >= 5 and seen == sorted(seen)
