"""Shared memory for the tensors a frontend sends the engine process.

A frontend's large input arrays (images: a 224 × 224 RGB float32 image is 602 KB) do not cross
the engine's Unix socket byte by byte (a copy into the socket, one out of it, and the engine's
reassembly of a message from 256 KB reads): the frontend writes them into its ``TensorArena``,
an anonymous shared memory file (``memfd_create``) whose descriptor it hands the engine process
once over that socket (``SCM_RIGHTS``), and the message names the array's offset instead of
carrying it. The engine copies the array out when it reads the message (``ArenaReader``) and
every message it sends that frontend says how many of the frontend's messages it has read so
far (``ack``), which frees their arrays' space. Space is used as a ring, in the order messages
are sent; an array that does not fit (the arena is full of unread messages) travels in the
socket as before. The file has no name: nothing is left behind when a process dies.
"""

from __future__ import annotations

import asyncio
import math
import mmap
import os
import socket
import struct
from collections import deque

import numpy as np

ALIGN = 64  # each array starts on a cache line
# smaller arrays travel in the socket: token ids, and the shipped ViT's 32 x 32 image (12 KB:
# alike either way); from 48 x 48 (27 KB) up the arena costs the engine process less CPU
# (``python -m benchmarks.transport_floor --image-sizes``, README: Processes)
ARENA_MIN_BYTES = 16384
HELLO = struct.Struct("<8sQ")  # magic, arena bytes (0: no arena); the descriptor rides along
MAGIC = b"attnshm1"


class ArenaError(ValueError):
    """An offset or length outside the arena (a bug or a foreign peer)."""


class TensorArena:
    """The frontend's side: ``size`` bytes of shared memory, allocated as a ring.

    ``put`` copies an array in for message number ``seq`` (messages are numbered from 1 in the
    order they are sent) and returns its offset, or None when there is no room;
    ``release(seq)`` frees the space of every message up to ``seq``.
    """

    def __init__(self, size: int) -> None:
        size -= size % ALIGN
        if size < ALIGN:
            raise ValueError(f"an arena needs at least {ALIGN} bytes, got {size}")
        self.size = size
        if not hasattr(os, "memfd_create"):
            raise OSError("this system has no memfd_create (Linux has)")
        self.fd = os.memfd_create("attnserve-tensors", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)  # pages are allocated as the ring reaches them
        except OSError:
            os.close(self.fd)
            raise
        self._buffer = np.frombuffer(self._map, dtype=np.uint8)
        self._live: deque[tuple[int, int, int]] = deque()  # (seq, start, end), oldest first
        self._head = 0  # where the next array goes
        self.placed = self.missed = 0  # arrays put in / refused for want of room

    @property
    def used(self) -> int:
        """Bytes held by arrays not yet released (the gap a wrap leaves at the end included)."""
        if not self._live:
            return 0
        tail = self._live[0][1]
        return self._head - tail if self._head > tail else self.size - tail + self._head

    def put(self, array: np.ndarray, seq: int) -> int | None:
        """Copy ``array`` (C-contiguous) in for message ``seq``; its offset, or None (no room)."""
        nbytes = array.nbytes
        start = self._place(nbytes) if nbytes else None
        if start is None:
            self.missed += 1
            return None
        end = start + nbytes
        self._buffer[start:end] = np.frombuffer(array.data, dtype=np.uint8)
        self._head = -(-end // ALIGN) * ALIGN
        self._live.append((seq, start, self._head))
        self.placed += 1
        return start

    def _place(self, nbytes: int) -> int | None:
        """Where ``nbytes`` fit after the newest array without reaching the oldest one."""
        if not self._live:
            self._head = 0
            return 0 if nbytes <= self.size else None
        tail = self._live[0][1]
        if self._head > tail:  # free: [head, size) and [0, tail)
            if self._head + nbytes <= self.size:
                return self._head
            return 0 if nbytes < tail else None
        return self._head if self._head + nbytes < tail else None  # free: [head, tail)

    def release(self, seq: int) -> None:
        """The engine has read every message up to ``seq``: their arrays' space is free."""
        live = self._live
        while live and live[0][0] <= seq:
            live.popleft()

    def close(self) -> None:
        """Unmap and close the file (the engine's mapping keeps its pages until it closes)."""
        if not self._map.closed:
            del self._buffer
            self._map.close()
            os.close(self.fd)


class ArenaReader:
    """The engine's side of one frontend's arena: arrays copied out by offset."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        try:
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the memory
        self._buffer = np.frombuffer(self._map, dtype=np.uint8)

    def array(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of the array at ``offset`` (its own memory: the frontend reuses the space).

        Raises:
            ArenaError: the array does not lie inside the arena.
        """
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
        if offset < 0 or offset % ALIGN or offset + nbytes > self.size:
            raise ArenaError(f"{nbytes} bytes at offset {offset} of a {self.size}-byte arena")
        return self._buffer[offset : offset + nbytes].view(dtype).reshape(shape).copy()

    def close(self) -> None:
        if not self._map.closed:
            del self._buffer
            self._map.close()


def send_hello(sock: socket.socket, arena: TensorArena | None) -> None:
    """A connection's first bytes, from the frontend: its arena's size and descriptor (or 0 and
    none). Sent before the event loop takes the socket over (16 bytes go out at once)."""
    hello = HELLO.pack(MAGIC, 0 if arena is None else arena.size)
    sent = socket.send_fds(sock, [hello], [] if arena is None else [arena.fd])
    if sent != HELLO.size:
        raise OSError(f"the hello went out in part ({sent} of {HELLO.size} bytes)")


async def receive_hello(sock: socket.socket) -> ArenaReader | None:
    """The engine's side of ``send_hello`` on a just-accepted non-blocking socket: the
    frontend's arena (None: it has none). Reads exactly the hello, so what follows stays in the
    socket for the event loop's transport.

    Raises:
        ArenaError: the peer does not open with a hello.
        OSError: the peer closed first, or the arena cannot be mapped.
    """
    data, fds = b"", list[int]()
    loop = asyncio.get_running_loop()

    def ready(future: asyncio.Future[None]) -> None:
        if not future.done():
            future.set_result(None)

    try:
        while len(data) < HELLO.size:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), ready, readable)
            try:
                await readable
            finally:
                loop.remove_reader(sock.fileno())
            try:
                chunk, more, _, _ = socket.recv_fds(sock, HELLO.size - len(data), 1)
            except BlockingIOError:
                continue
            if not chunk:
                raise OSError("the frontend closed the connection before its hello")
            data, fds = data + chunk, fds + more
        magic, size = HELLO.unpack(data)
        if magic != MAGIC or (size > 0) != (len(fds) == 1):
            raise ArenaError(f"not a frontend's hello: {data!r} with {len(fds)} descriptor(s)")
        if size == 0:
            return None
        fd = fds.pop()
        return ArenaReader(fd, size)
    finally:
        for fd in fds:
            os.close(fd)
