"""Score calls on /metrics: counted as inference requests (method "Score"), their passes under
stage "scoring", and not in the model's queue depth (the in-flight engine's gauge)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.client import AttnServeClient, ClientError
from tests.serving.server_thread import ServerThread

pytestmark = pytest.mark.usefixtures("offline_hub")


def samples(server: ServerThread) -> dict[tuple[str, frozenset], float]:
    """The server's samples as /metrics writes them (``hf_server`` runs no metrics port)."""
    assert server.running is not None
    text = generate_latest(server.running.metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(seen: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return seen.get((name, frozenset(labels.items())), 0.0)


def test_score_calls_and_passes_are_counted(
    hf_server: ServerThread, hf_client: AttnServeClient
) -> None:
    model = {"model": "marian", "version": "1"}
    ok = {**model, "method": "Score", "code": "OK"}
    refused = {**model, "method": "Score", "code": "INVALID_ARGUMENT"}
    before = samples(hf_server)
    for _ in range(3):
        hf_client.score(["one", "two"], ["eins", "zwei"], to="de", model="marian")
    with pytest.raises(ClientError):
        hf_client.score(["one"], ["eins", "zwei"], to="de", model="marian")
    after = samples(hf_server)
    assert (
        value(after, "attnserve_requests_total", **ok)
        - value(before, "attnserve_requests_total", **ok)
        == 3
    )
    assert (
        value(after, "attnserve_requests_total", **refused)
        - value(before, "attnserve_requests_total", **refused)
        == 1
    )
    passes = {**model, "stage": "scoring"}
    batched = value(after, "attnserve_batch_size_sum", **passes) - value(
        before, "attnserve_batch_size_sum", **passes
    )
    assert batched == 6  # every pair in some pass, once
    assert value(after, "attnserve_batch_size_count", **passes) > value(
        before, "attnserve_batch_size_count", **passes
    )
    assert value(after, "attnserve_queue_depth", **model) == 0
