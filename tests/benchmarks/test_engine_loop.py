"""``python -m benchmarks.engine_loop --tiny``: the real in-flight engine over the translator's
in-place cache, its decoder step answering at once; every stream decodes its 64 tokens and the
figures agree with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.engine_loop import NEW_TOKENS, main


def test_the_engine_loop_decodes_every_stream_and_times_its_steps(
    tiny_repository: Path, tmp_path: Path
) -> None:
    args = ["--tiny", "--streams", "1", "8", "--repository", str(tiny_repository)]
    # Python's collector stays as pytest has it (the server's policy freezes the process)
    assert main([*args, "--no-gc-freeze", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("engine-loop-*-tiny.json")
    result = json.loads(path.read_text())
    assert result["kind"] == "engine-loop" and result["machine"]["logical_cpus"] >= 1
    one, eight = result["points"]
    assert (one["streams"], eight["streams"]) == (1, 8)
    for point in (one, eight):
        # every request decodes the same length: 64 tokens, or what the model's positions allow
        per_request, rest = divmod(point["tokens"], point["requests"])
        assert rest == 0 and 1 < per_request <= NEW_TOKENS
        assert point["rows_per_step"] <= point["streams"]
        assert 0 <= point["encoder_share"] < 1
        per_row = point["ms_per_step"] * 1e3 / point["rows_per_step"]
        assert point["us_per_row_step"] == pytest.approx(per_row, rel=0.02)
    assert result["gc_freeze"] is False and result["gc_gen0_threshold"] == 0
    assert all(p["gc_collections"] >= 0 and p["gc_seconds"] >= 0 for p in result["points"])
    assert one["rows_per_step"] == 1.0
    assert eight["rows_per_step"] > 1.0  # the streams share steps


def test_the_emulated_device_counts_its_steps_and_the_host_time_between_them() -> None:
    """``--device-step-ms``: each step sleeps its time; the figures over a point come from the
    totals' deltas, the host's gap being the time from one step's end to the next one's start
    (bounds only: a sleep takes at least what it asks)."""
    import time

    from benchmarks.engine_loop import device_figures, device_of

    assert device_of(None) is None and device_figures(None, (0.0, 0, 0.0), 1.0) == {}
    device = device_of(1.0)
    assert device is not None
    device.wait()  # before the point: not counted
    before = device.totals()
    assert device_figures(device, before, 1.0) == {}  # no step in the point yet
    time.sleep(0.004)
    device.wait()
    time.sleep(0.004)
    device.wait()
    figures = device_figures(device, before, wall=1.0)
    assert figures["device_step_ms"] == 1.0
    assert figures["device_busy_share"] == 0.002  # 2 steps of 1 ms in 1 s
    assert figures["device_wait_ms"] >= 1.0
    assert figures["host_gap_ms"] >= 4.0  # two gaps of at least 4 ms over two steps
