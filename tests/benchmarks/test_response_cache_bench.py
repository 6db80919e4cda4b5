"""``python -m benchmarks.response_cache``: real servers without and with the response cache,
driven in turn; with it every repeated request but the first few is a hit (the server's own
statistics say so), without it none; and the cache's per-request costs are measured."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.response_cache import main


def test_a_pair_of_runs_is_measured_with_and_without_the_cache(
    tiny_repository: Path, tmp_path: Path
) -> None:
    args = ["--repository", str(tiny_repository), "--out", str(tmp_path)]
    settings = ["--duration", "0.5", "--warmup", "0", "--pairs", "1", "--concurrency", "2"]
    assert main([*args, *settings]) == 0
    (path,) = tmp_path.glob("response-cache-*.json")
    result = json.loads(path.read_text())
    points = result["points"]
    assert [(p["cached"], p["workload"]) for p in points] == [
        (False, "vit"),
        (False, "translator"),
        (True, "vit"),
        (True, "translator"),
    ]
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in points)
    [pair] = result["pairs"]
    for point in points:
        counts = pair["cache" if point["cached"] else "off"][point["workload"]]
        if point["cached"]:  # the first requests in flight miss, every later one hits
            assert counts["hits"] + counts["misses"] == point["requests"]
            assert 1 <= counts["misses"] <= 2 and counts["inferences"] == counts["misses"]
        else:
            assert counts["hits"] == counts["misses"] == 0
            assert counts["inferences"] == point["requests"]
    assert [(r["workload"], r["concurrency"]) for r in pair["ratios"]] == [
        ("vit", 2),
        ("translator", 2),
    ]
    for costs in result["per_request"].values():
        assert 0 < costs["key_us"] <= costs["hit_us"] and costs["miss_us"] > 0
        assert costs["response_bytes"] > 0
