"""``python -m benchmarks.transport_floor --tiny``: a real engine process (EngineServer and a
DynamicBatcher whose batch function does no work) driven through the frontend's EngineClient;
every request answered, the figures consistent with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("msgpack")

from benchmarks.transport_floor import main


def test_the_floor_answers_every_request_and_times_the_engine(tmp_path: Path) -> None:
    """Each concurrency through the socket and through the shared memory arena, for each image
    size given."""
    argv = ["--tiny", "--concurrency", "1", "8", "--image-sizes", "32", "64"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("transport-floor-*-tiny.json")
    result = json.loads(path.read_text())
    assert result["kind"] == "transport-floor" and result["machine"]["logical_cpus"] >= 1
    points = result["points"]
    assert [(p["image_size"], p["concurrency"], p["transport"]) for p in points] == [
        (size, concurrency, transport)
        for size in (32, 64)
        for concurrency in (1, 8)
        for transport in ("socket", "shm")
    ]
    for point in points:
        assert point["image_bytes"] == 3 * point["image_size"] ** 2 * 4
        assert point["requests"] > 10 and point["requests_per_s"] > 0
        if point["transport"] == "shm":  # every image (warm-up ones too) through the arena
            assert point["arena_images"] >= point["requests"]
        else:
            assert point["arena_images"] == 0
        assert 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["engine_cpu_us_per_request"] > 0
        bound = 1e6 / point["engine_cpu_us_per_request"]
        assert point["engine_bound_requests_per_s"] == pytest.approx(bound, rel=0.01)
