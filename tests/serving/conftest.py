"""Fixtures of the serving tests that serve the tiny Hugging Face models: the real server over
the session's ``hf_repository`` (``hf_server``, one per module), a client of it, and
``offline_hub`` (transformers never reaches the hub: every load is from a local directory);
and Triton's perf_analyzer (``perf_analyzer``: skips, saying why, where it is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.perf_analyzer import PerfAnalyzer, find_perf_analyzer
from serving.client import AttnServeClient
from tests.serving.server_thread import ServerThread


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def hf_server(hf_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(hf_repository, metrics_port=-1) as running:
        yield running


@pytest.fixture(scope="module")
def hf_client(hf_server: ServerThread) -> Iterator[AttnServeClient]:
    with AttnServeClient(hf_server.address) as running:
        yield running


@pytest.fixture(scope="module")
def perf_analyzer() -> PerfAnalyzer:
    """The installed perf_analyzer (`make perf-analyzer`); skips with the reason without it."""
    found = find_perf_analyzer()
    if isinstance(found, str):
        pytest.skip(found)
    return found
