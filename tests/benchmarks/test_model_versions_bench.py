"""``python -m benchmarks.model_versions``: real servers of 1 and 2 versions of each model, each
version answering the requests that name it, their memory and threads recorded, and reloads
(all versions rebuilt; a version added) timed; the repository copy is put back after each."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.model_versions import main


def test_servers_of_one_and_two_versions_are_measured(
    tiny_repository: Path, tmp_path: Path
) -> None:
    args = ["--repository", str(tiny_repository), "--out", str(tmp_path), "--versions", "1,2"]
    settings = ["--duration", "0.5", "--warmup", "0", "--rounds", "1", "--concurrency", "1"]
    assert main([*args, *settings]) == 0
    (path,) = tmp_path.glob("model-versions-*.json")
    result = json.loads(path.read_text())
    assert [s["versions"] for s in result["servers"]] == [1, 2]
    for server in result["servers"]:
        assert server["rss_bytes"] > 10 << 20 and server["threads"] > 1 and server["ready_s"] > 0
        assert set(server["reloads"]) == {"vit", "translator"}
        for times in server["reloads"].values():  # each load answered (timed, not compared)
            assert times["rebuild_all_s"] > 0 and times["add_version_s"] > 0
    assert [(p["versions"], p["workload"]) for p in result["points"]] == [
        (1, "vit@newest"),
        (1, "translator@newest"),
        (2, "vit@newest"),
        (2, "vit@1"),
        (2, "translator@newest"),
        (2, "translator@1"),
    ]
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in result["points"])
    one, two = result["servers"]
    assert two["threads"] > one["threads"]  # each version has its own engine and batcher
