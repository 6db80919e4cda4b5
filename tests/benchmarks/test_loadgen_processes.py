"""The load generator's clients in several processes, against a real server on loopback."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from benchmarks.loadgen import Client, Workload, measure
from benchmarks.loadgen_processes import ClientProcesses, shares
from benchmarks.serve_workloads import sample_image
from tests.serving.server_thread import ServerThread


@pytest.fixture(scope="module")
def server(tiny_repository: Path):
    with ServerThread(tiny_repository, metrics_port=-1) as running:
        yield running


@pytest.fixture(scope="module")
def processes():
    with ClientProcesses(2) as pool:
        yield pool


def test_shares_split_the_load_evenly_over_at_most_that_many_parts() -> None:
    assert shares(5, 2) == [3, 2]
    assert shares(1, 4) == [1]  # fewer clients than processes: the rest stay idle
    assert shares(256, 8) == [32] * 8
    for total in range(1, 40):
        for parts in range(1, 9):
            split = shares(total, parts)
            assert sum(split) == total and len(split) == min(total, parts)
            assert max(split) - min(split) <= 1


def _point(server: ServerThread, processes: ClientProcesses, **load: float) -> dict:
    async def run() -> dict:
        client = Client(server.address, Workload("classify", "vit", image=sample_image()), 2)
        try:
            return await measure(client, processes=processes, duration=1.0, warmup=0.2, **load)
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_closed_loop_point_runs_its_clients_in_both_processes(server, processes) -> None:
    point = _point(server, processes, concurrency=3)
    assert point["errors"] == 0 and point["requests"] > 3
    assert point["client_processes"] == 2
    assert point["client_cpu_s"] > 0  # the children's CPU time is counted as the client's
    assert 0.9 <= point["duration_s"] < 3.0  # one window: the processes started together


def test_one_client_uses_one_process(server, processes) -> None:
    point = _point(server, processes, concurrency=1)
    assert point["errors"] == 0 and point["client_processes"] == 1


def test_an_open_loop_point_splits_the_rate(server, processes) -> None:
    point = _point(server, processes, rate=40.0)
    assert point["errors"] == 0 and point["client_processes"] == 2
    assert 15 <= point["requests"] <= 70  # two Poisson streams of 20/s over one second


def test_a_failing_process_stops_the_pool_with_its_error(server) -> None:
    pool = ClientProcesses(2)
    workload = Workload("classify", "vit", image=sample_image())
    with pytest.raises(RuntimeError, match="connections must be >= 1"):
        asyncio.run(pool.run(server.address, workload, 0, concurrency=2, duration=0.2))
    assert pool.alive == 0
    with pytest.raises(RuntimeError, match="stopped"):
        asyncio.run(pool.run(server.address, workload, 1, concurrency=2, duration=0.2))


def test_the_processes_are_children_that_exit_on_close() -> None:
    pool = ClientProcesses(2)
    assert len(set(pool.pids)) == 2 and os.getpid() not in pool.pids and pool.alive == 2
    pool.close()
    assert pool.alive == 0
