"""The serving processes' garbage-collector policy (``serving.gc_policy``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serving.server_config import ServerConfig

PROBE = """
import gc, json, sys
from serving.gc_policy import settle
before = gc.get_threshold()
cycle = []
cycle.append(cycle)  # start-up garbage: collected before the freeze, not frozen
del cycle
settle(int(sys.argv[1]))
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "garbage": len(gc.garbage)}))
"""


def probe(threshold: int) -> dict:
    """``settle(threshold)`` in a fresh interpreter (it changes the whole process)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(threshold)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_settle_freezes_the_start_up_heap_and_raises_the_young_threshold() -> None:
    state = probe(50_000)
    assert state["after"] == [50_000, *state["before"][1:]]
    assert state["frozen"] > 1000  # the interpreter's and serving's modules, at least
    assert state["garbage"] == 0


def test_zero_keeps_pythons_collector() -> None:
    state = probe(0)
    assert state["after"] == state["before"] and state["frozen"] == 0


def test_a_negative_threshold_is_refused() -> None:
    assert ServerConfig().gc_gen0_threshold == 50_000
    with pytest.raises(ValueError, match="gc_gen0_threshold must be >= 0"):
        ServerConfig(gc_gen0_threshold=-1)
