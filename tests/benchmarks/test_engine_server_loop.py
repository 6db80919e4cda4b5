"""``python -m benchmarks.engine_server_loop --tiny``: the instant engine behind a real engine
server, driven by two client processes over its Unix socket; every stream decodes whole requests
and the figures agree with each other."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.engine_server_loop import main


def test_client_processes_decode_every_stream_through_the_engine_socket(
    tiny_repository: Path, tmp_path: Path
) -> None:
    args = ["--tiny", "--streams", "5", "--frontends", "2", "--spread"]
    args += ["--repository", str(tiny_repository)]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("engine-server-loop-*-tiny.json")
    result = json.loads(path.read_text())
    assert result["kind"] == "engine-server-loop" and result["frontends"] == 2
    assert result["spread"] is True  # requests of 32-96 tokens: the streams fall out of step
    (point,) = result["points"]
    assert point["streams"] == 5 and point["frontends"] == 2  # 3 + 2 streams
    assert point["tokens"] > 0 and point["requests"] > 0
    # the two processes' streams share steps; the engine's steps and the clients' tokens are
    # counted over windows a little apart (this process's event loop wakes late under load)
    assert 1 < point["rows_per_step"] <= 5 * 1.05
    assert point["tokens_per_s"] == round(point["tokens"] / point["seconds"], 1)
    assert 0 < point["engine_process_cpu_share"] < 2  # one interpreter (and its GIL)
    cpu = point["engine_process_cpu_share"] * point["seconds"]
    assert (
        abs(point["engine_process_us_per_token"] - cpu / point["tokens"] * 1e6)
        < 0.05 * (point["engine_process_us_per_token"])
    )
    assert point["client_us_per_token"] > 0


def test_with_decode_blocks_the_streams_decode_in_blocks(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """``--decode-block 4`` with an emulated device: the engine runs its emulated block graph
    (one device wait of four steps), most steps in blocks, and the device's figures count four
    steps per block."""
    args = ["--tiny", "--streams", "4", "--frontends", "1", "--decode-block", "4"]
    args += ["--device-step-ms", "0.5", "--repository", str(tiny_repository)]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("engine-server-loop-*-tiny.json")
    result = json.loads(path.read_text())
    assert result["decode_block"] == 4
    (point,) = result["points"]
    steps = round(point["steps_per_s"] * point["seconds"])
    assert point["blocks"] > 0 and 4 * point["blocks"] <= steps + 4
    assert 4 * point["blocks"] > steps / 2  # joins aside, the steps run in blocks
    assert point["device_step_ms"] == 0.5 and point["device_wait_ms"] >= 0.5
