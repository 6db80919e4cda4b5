"""A real Prometheus scrapes a real attnserve server under load; PromQL gives the p99 latency,
and every query of the shipped Grafana dashboard evaluates.

Needs Debian's `prometheus` binary (`make test` installs it when run as root); skips without it.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.client import AttnServeClient
from serving.metrics import REQUEST_DURATION, REQUESTS
from tests.deploy.deploy_files import dashboard
from tests.serving.server_thread import ServerThread

LOAD_SECONDS = 5.0
P99 = f"histogram_quantile(0.99, sum by (le) (rate({REQUEST_DURATION}_bucket[30s])))"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def query(base: str, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query (Prometheus HTTP API)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(what: str, check: Any, timeout: float, log: Path) -> Any:
    """Poll ``check()`` until it returns something truthy; fail with Prometheus' log tail."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except OSError as err:  # not listening yet
            last_error = err
        time.sleep(0.5)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    pytest.fail(f"{what} within {timeout:g} s (last error: {last_error}); prometheus log:\n{tail}")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Starts prometheus scraping the given metrics port every second; always terminated."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    processes: list[subprocess.Popen[bytes]] = []

    def start(metrics_port: int) -> tuple[str, Path]:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: attnserve\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
        )
        listen = f"127.0.0.1:{free_port()}"
        log = tmp_path / "prometheus.log"
        command = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={listen}",
        ]
        with log.open("wb") as out:
            processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
        return f"http://{listen}", log

    try:
        yield start
    finally:
        for process in processes:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def load(server: ServerThread, seconds: float) -> int:
    """Real client calls from two threads for ``seconds``; returns how many were answered."""
    done: list[int] = []

    def worker(index: int) -> None:
        count = 0
        with AttnServeClient(server.address, timeout=30) as client:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if index == 0:
                    client.translate(["three hundred and twelve"], to="de", max_new_tokens=8)
                else:
                    client.list_models()
                count += 1
        done.append(count)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return sum(done)


def test_prometheus_computes_p99_latency_from_a_loaded_server(
    tiny_repository: Path, prometheus: Any
) -> None:
    with ServerThread(tiny_repository) as server:
        assert server.running is not None and server.running.metrics_port
        base, log = prometheus(server.running.metrics_port)
        wait_for("prometheus ready", lambda: _ready(base), 60, log)
        up = 'up{job="attnserve"} == 1'
        wait_for("the attnserve target up", lambda: query(base, up), 30, log)

        answered = load(server, LOAD_SECONDS)
        assert answered > 10

        def p99() -> float | None:
            result = query(base, P99)
            value = float(result[0]["value"][1]) if result else math.nan
            return value if math.isfinite(value) and value > 0 else None

        latency = wait_for(f"a finite positive {P99}", p99, 30, log)
        assert latency < 30.0  # the top bucket: a p99 here means real observations

        def all_requests_scraped() -> bool:
            result = query(base, f'sum({REQUESTS}{{code="OK"}})')
            return bool(result) and float(result[0]["value"][1]) >= answered

        wait_for(
            f"{REQUESTS} to count the {answered} answered calls", all_requests_scraped, 10, log
        )
        check_dashboard_queries(base)


def check_dashboard_queries(base: str) -> None:
    """Every query of the shipped Grafana dashboard is valid PromQL for this Prometheus, and the
    per-request panels (the series ModelStatistics reads) have the translator's figures."""
    by_title: dict[str, list[dict[str, Any]]] = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$model", ".*").replace("$__rate_interval", "30s")
            by_title.setdefault(panel["title"], []).extend(query(base, expr))

    def translator(title: str, stage: str | None = None) -> list[float]:
        rows = by_title[title]
        return [
            float(r["value"][1])
            for r in rows
            if r["metric"]["model"] == "translator" and r["metric"].get("stage", stage) == stage
        ]

    mean = translator("Mean latency, succeeded / failed")  # no call failed: the OK series only
    assert len(mean) == 1 and 0 < mean[0] < 30
    per_request = translator("Compute time per request by stage", "generation")
    assert len(per_request) == 1 and 0 < per_request[0] < mean[0]
    # its Score passes (stage scoring, none here) are their own series
    assert translator("Compute time per request by stage", "scoring") in ([], [0.0])
    (since,) = translator("Since the last inference request")
    assert 0 <= since < 120


def _ready(base: str) -> bool:
    with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
        return response.status == 200
