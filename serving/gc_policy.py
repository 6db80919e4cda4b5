"""Python's cyclic garbage collector in a serving process: never rescan the start-up heap.

A decode step at 256 rows makes some thousands of container objects (token events, arrays, the
outbox's lists). CPython runs a young collection every 700 net allocations and, every 100 of
those, a full one, which scans every tracked object of the process: the models' sessions,
tokenizers, the gRPC stack. Measured with ``gc.callbacks`` around
``python -m benchmarks.engine_loop --streams 256 --duration 6`` (2-core AMD EPYC VM,
2026-11-26): 454-621 collections took 0.28-0.33 s of the 6 s, the longest a 31-41 ms pause in
which no stream moves.

So once the models are loaded (``settle``): one full collection and ``gc.freeze()``, which moves
everything alive then to a generation no collection scans again. The same run then spent
0.20 s in the collector, the longest pause 11-13 ms. ``gc_freeze: false`` in server.yaml keeps
Python's collector as it is.

``gc_gen0_threshold`` raises the young threshold too (0 keeps Python's 700). At 50,000 the
engine loop ran no collection at all, but the served translator on the same VM (32 streams,
five alternated ``bench serve`` runs each) used 475-518 against 458-498 us of server CPU per
token, within the VM's noise but not better, so it is not the default.

A model that model control replaces or unloads may belong to that frozen heap, where no
collection looks: its reference cycles (a classifier's batcher holds its model) would keep its
sessions alive for good. ``release`` (after such a model has stopped) unfreezes, collects and
freezes again, then asks glibc to hand freed heap pages back to the system (``malloc_trim``).
Measured on the tiny models (2-core AMD EPYC VM, 2026-11-28): without it, the ViT replaced by
a reload stayed alive; a 45 s soak with a reload every 2 s grew the server's RSS by 10.7%.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
from typing import Any

log = logging.getLogger(__name__)


def settle(freeze: bool, gen0_threshold: int = 0) -> None:
    """With ``freeze``: collect, then freeze what survives; with ``gen0_threshold`` > 0: the
    young generation's threshold. Call once per process, after its models are loaded."""
    if freeze:
        gc.collect()
        gc.freeze()
    if gen0_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(gen0_threshold, middle, old)
    log.info(
        "garbage collector: %d start-up objects frozen, thresholds %s",
        gc.get_freeze_count(),
        gc.get_threshold(),
    )


def release() -> None:
    """Free what a stopped model held: where this process froze its heap (``settle``), the
    frozen heap is collected and frozen again (the models still served stay in it), else a full
    collection; then freed heap pages go back to the system (glibc only)."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    else:
        gc.collect()
    _malloc_trim()


def _malloc_trim() -> None:
    trim = _trim_function()
    if trim is not None:
        trim(0)


@functools.cache
def _trim_function() -> Any:
    """glibc's ``malloc_trim`` from the symbols this process has loaded (None: not glibc).
    Not ``ctypes.util.find_library``: that runs ``ldconfig`` in a child process, a fork of the
    whole server at every model unload."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
