"""The serving processes' garbage-collector policy (``serving.gc_policy``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from serving.gc_policy import release
from serving.server_config import ServerConfig

PROBE = """
import gc, json, sys, weakref
from serving.gc_policy import settle
class Node: pass
before = gc.get_threshold()
gc.disable()  # nothing collects the cycle but settle itself
cycle = Node()
cycle.self = cycle  # start-up garbage: collected before the freeze, not frozen
alive = weakref.ref(cycle)
del cycle
settle(sys.argv[1] == "freeze", int(sys.argv[2]))
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "garbage_left": alive() is not None}))
"""


def probe(freeze: bool, threshold: int) -> dict:
    """``settle(freeze, threshold)`` in a fresh interpreter (it changes the whole process)."""
    command = [sys.executable, "-c", PROBE, "freeze" if freeze else "no", str(threshold)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_settle_freezes_the_start_up_heap_and_keeps_pythons_thresholds() -> None:
    state = probe(True, 0)
    assert state["after"] == state["before"]
    assert state["frozen"] > 1000  # the interpreter's and serving's modules, at least
    assert not state["garbage_left"]  # collected first, so not frozen with the rest


def test_a_young_threshold_and_no_freeze() -> None:
    state = probe(False, 50_000)
    assert state["after"] == [50_000, *state["before"][1:]] and state["frozen"] == 0
    assert state["garbage_left"]  # no collection ran


def test_the_server_freezes_by_default_and_refuses_a_negative_threshold() -> None:
    assert ServerConfig().gc_freeze and ServerConfig().gc_gen0_threshold == 0
    with pytest.raises(ValueError, match="gc_gen0_threshold must be >= 0"):
        ServerConfig(gc_gen0_threshold=-1)


RELEASE = """
import gc, json, weakref
from serving.gc_policy import release, settle
class Node: pass
model = Node()
model.self = model  # a served model with a reference cycle (a batcher holding its model)
settle(True)
frozen = gc.get_freeze_count()
replaced = weakref.ref(model)
del model  # replaced by a reload: only the cycle holds it now, in the frozen heap
gc.collect()
kept_by_freeze = replaced() is not None
successor = Node()
successor.self = successor
release()
print(json.dumps({"kept_by_freeze": kept_by_freeze, "freed": replaced() is None,
                  "frozen_before": frozen, "frozen_after": gc.get_freeze_count()}))
"""


def test_release_frees_a_frozen_model_and_freezes_what_is_left() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True
    )
    state = json.loads(done.stdout)
    assert state["kept_by_freeze"]  # what release is for: no collection looks there
    assert state["freed"]
    assert state["frozen_after"] > 1000 and state["frozen_before"] > 1000  # the rest frozen again


def test_release_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding libc through ``ctypes.util.find_library`` ran ``ldconfig``: a fork of the whole
    engine process at every model unload (seen as a second ``attnserve-eng`` in the soak)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("release() started a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    release()
