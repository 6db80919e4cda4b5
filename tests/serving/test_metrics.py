"""ServingMetrics: names, registries of their own, the /metrics HTTP endpoint; error codes."""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serving import errors
from serving.metrics import (
    BATCH_SIZE_BUCKETS,
    LATENCY_BUCKETS,
    METRIC_NAMES,
    ServingMetrics,
    observe_many,
)


def touch_every_metric(metrics: ServingMetrics, model: str = "m") -> None:
    """One observation per metric so every family has samples."""
    metrics.requests.labels(model=model, version="1", method="Classify", code="OK").inc()
    metrics.request_latency.labels(model=model, version="1", method="Classify").observe(0.003)
    metrics.queue_time.labels(model=model, version="1").observe(0.001)
    metrics.compute_time.labels(model=model, version="1", stage="encoder").observe(0.002)
    metrics.batch_size.labels(model=model, version="1", stage="encoder").observe(4)
    metrics.request_compute.labels(model=model, version="1", stage="encoder").inc(0.08)
    metrics.request_seconds.labels(model=model, version="1", method="Classify", code="OK").inc(0.1)
    metrics.last_request.labels(model=model, version="1").set(1.8e9)
    metrics.time_to_first_token.labels(model=model, version="1").observe(0.05)
    metrics.time_per_output_token.labels(model=model, version="1").observe(0.01)
    metrics.generated_tokens.labels(model=model, version="1").inc(7)
    metrics.active_sequences.labels(model=model, version="1").set(3)
    metrics.kv_cache_usage.labels(model=model, version="1").set(0.25)
    metrics.kv_cache_tokens.labels(model=model, version="1").set(128)
    metrics.queue_depth.labels(model=model, version="1").set(0)
    metrics.response_cache.labels(model=model, version="1", result="hit").inc()
    metrics.response_cache_seconds.labels(model=model, version="1", result="hit").inc(0.0001)
    metrics.response_cache_bytes.set(1024)
    metrics.response_cache_entries.set(2)


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_metric_names_are_prefixed_unique_and_in_base_units() -> None:
    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES) == 19
    assert all(name.startswith("attnserve_") for name in METRIC_NAMES)
    assert not any(name.endswith(("_ms", "_milliseconds")) for name in METRIC_NAMES)
    assert LATENCY_BUCKETS[0] <= 0.0005 and LATENCY_BUCKETS[-1] >= 30
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    assert BATCH_SIZE_BUCKETS == (1, 2, 4, 8, 16, 32, 64, 128)


def test_every_declared_name_is_exported() -> None:
    metrics = ServingMetrics()
    touch_every_metric(metrics)
    text = metrics.render().decode()
    exported = sample_names(text)
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
        assert name in exported or f"{name}_count" in exported, name
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["attnserve_request_duration_seconds"] == "histogram"
    assert families["attnserve_requests"] == "counter"  # the parser strips _total
    assert families["attnserve_kv_cache_usage_ratio"] == "gauge"


def test_labels_and_batch_size_buckets() -> None:
    metrics = ServingMetrics()
    touch_every_metric(metrics)
    samples = [
        s
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name == "attnserve_batch_size_bucket"
    ]
    assert {s.labels["le"] for s in samples} >= {"1.0", "4.0", "128.0", "+Inf"}
    assert all(s.labels["model"] == "m" and s.labels["stage"] == "encoder" for s in samples)
    requests = [
        s
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name == "attnserve_requests_total"
    ]
    assert requests[0].labels == {"model": "m", "version": "1", "method": "Classify", "code": "OK"}


def histogram_samples(metrics: ServingMetrics, name: str) -> dict[tuple, float]:
    return {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name.startswith(name) and not s.name.endswith("_created")
    }


@given(
    observations=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(-1.0, 100.0)),
            st.integers(0, 300),
        ),
        max_size=6,
    )
)
def test_observe_many_is_that_many_observations(observations: list[tuple[float, int]]) -> None:
    """Buckets (values on a bound included, and past the last one) and count exactly as
    ``count`` calls of ``observe``; the sum up to rounding."""
    one_by_one, at_once = ServingMetrics(), ServingMetrics()
    single = one_by_one.time_per_output_token.labels(model="m", version="1")
    many = at_once.time_per_output_token.labels(model="m", version="1")
    for amount, count in observations:
        for _ in range(count):
            single.observe(amount)
        observe_many(many, amount, count)
    name = "attnserve_time_per_output_token_seconds"
    expected, got = histogram_samples(one_by_one, name), histogram_samples(at_once, name)
    total = (f"{name}_sum", None)
    assert got.pop(total) == pytest.approx(expected.pop(total), rel=1e-9, abs=1e-9)
    assert got == expected


def test_two_instances_in_one_process_do_not_collide() -> None:
    first, second = ServingMetrics(), ServingMetrics()
    first.generated_tokens.labels(model="a", version="1").inc(5)
    assert b'model="a"' in first.render()
    assert b'model="a"' not in second.render()


def test_http_server_on_port_zero_serves_this_registry() -> None:
    metrics = ServingMetrics()
    touch_every_metric(metrics, model="vit")
    server, port = metrics.start_http_server(0)
    try:
        assert port > 0 and port == server.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            body = response.read().decode()
        assert 'attnserve_active_sequences{model="vit",version="1"} 3.0' in body
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound, grpc.StatusCode.NOT_FOUND),
        (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
        (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.Cancelled, grpc.StatusCode.CANCELLED),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
        (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
        (errors.Internal, grpc.StatusCode.INTERNAL),
    ],
)
def test_errors_map_to_status_codes_for_the_code_label(
    error: type[errors.ServingError], code: grpc.StatusCode
) -> None:
    instance = error("what to fix")
    assert isinstance(instance, errors.ServingError)
    assert instance.code is code and errors.status_code(instance) is code
    assert str(instance) == "what to fix"


def test_other_exceptions_count_as_internal() -> None:
    assert errors.status_code(ValueError("x")).name == "INTERNAL"
