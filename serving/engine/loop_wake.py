"""Handing a callback to an asyncio loop on another thread, keeping the GIL while waking it.

``loop.call_soon_threadsafe`` queues the callback, then wakes the loop by writing one byte to its
self-pipe with ``socket.send``, which lets go of the GIL for the system call. The loop's thread,
woken by that very byte, then often takes the GIL first and runs its callbacks (the tokens'
delivery, their gRPC or socket writes) while the engine thread, back from a one-byte write,
waits for the GIL: in the emulated-GPU engine process (``benchmarks.engine_server_loop``) a third
of the engine thread's time between two decode steps went there. ``call_soon_threadsafe`` below
queues the callback the same way and writes the same byte through ``ctypes.PyDLL``, which keeps
the GIL: the engine thread goes on to its next step and lets the GIL go when the step does (an
ONNX Runtime run), and the loop's callbacks run during the step instead of before it.

``Outbox.flush`` wakes the engine process's loop this way (its callbacks only forward token
columns to the frontends' sockets); a caller's loop in the engine's own process, whose callbacks
are gRPC writes, is woken as asyncio does. Loops without a self-pipe socket (not asyncio's
selector loops) are woken their own way.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from typing import Any


def _gil_holding_send() -> Any:
    """libc's ``send`` called with the GIL held (``ctypes.PyDLL``), or None where there is none."""
    try:
        send = ctypes.PyDLL(None).send
    except (OSError, AttributeError, TypeError):
        return None
    send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    send.restype = ctypes.c_ssize_t
    return send


_SEND = _gil_holding_send()
_BYTE = b"\0"


def call_soon_threadsafe(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any
) -> None:
    """``loop.call_soon_threadsafe(callback, *args)``, the loop woken without releasing the GIL.

    Raises RuntimeError when the loop is closed, as asyncio does.
    """
    queue = getattr(loop, "_call_soon", None)
    csock = getattr(loop, "_csock", None)
    if _SEND is None or queue is None or csock is None:
        loop.call_soon_threadsafe(callback, *args)
        return
    if loop.is_closed():
        raise RuntimeError("Event loop is closed")
    queue(callback, args, None)  # what call_soon_threadsafe queues (a deque append: atomic)
    fd = csock.fileno()
    if fd >= 0:  # -1: closed meanwhile. A full pipe (EAGAIN) has a wake pending already.
        _SEND(fd, _BYTE, 1, 0)
