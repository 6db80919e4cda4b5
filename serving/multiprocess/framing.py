"""Messages of several frames over one Unix stream socket, on the asyncio event loop.

Frontends and the engine process exchange multi-frame messages (``protocol.encode``: a msgpack
header, then each array's bytes). On the wire a message is its frame count (uint32), each
frame's length (uint64), then the frames, all little-endian. The event loop reads and writes the
socket itself: a message wakes only the process it is for (ZeroMQ, used before, moves every
message through an I/O thread on each side, two more thread wake-ups per message).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterator, Sequence

Frames = list[memoryview]

_COUNT = struct.Struct("<I")
MAX_FRAMES = 1 << 16  # a message's frames; more means the stream is corrupt


class FramingError(Exception):
    """The byte stream does not hold messages in this framing."""


def pack(frames: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """The byte strings of a message of ``frames``, in order."""
    lengths = [memoryview(frame).nbytes for frame in frames]
    head = _COUNT.pack(len(frames)) + struct.pack(f"<{len(frames)}Q", *lengths)
    return [head, *frames]


class FrameReader:
    """Cuts a byte stream, fed in pieces of any size, into messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> Iterator[Frames]:
        """Append ``data``; yield every message now complete (frames are views of its bytes).

        Raises:
            FramingError: a message announces more than ``MAX_FRAMES`` frames.
        """
        self._buffer += data
        while (message := self._cut()) is not None:
            yield message

    def _cut(self) -> Frames | None:
        buffer = self._buffer
        if len(buffer) < _COUNT.size:
            return None
        (count,) = _COUNT.unpack_from(buffer)
        if count > MAX_FRAMES:
            raise FramingError(f"a message of {count} frames")
        head = _COUNT.size + 8 * count
        if len(buffer) < head:
            return None
        lengths = struct.unpack_from(f"<{count}Q", buffer, _COUNT.size)
        end = head + sum(lengths)
        if len(buffer) < end:
            return None
        message = memoryview(bytes(buffer[head:end]))
        del buffer[:end]
        frames, start = [], 0
        for length in lengths:
            frames.append(message[start : start + length])
            start += length
        return frames


class MessageConnection(asyncio.Protocol):
    """One end of a stream socket carrying framed messages.

    Args:
        on_message: called with each message's frames, on the event loop.
        on_lost: called once when the connection closes (or its stream is corrupt).
    """

    def __init__(self, on_message: Callable[[Frames], None], on_lost: Callable[[], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            for frames in self._reader.feed(data):
                self._on_message(frames)
        except FramingError:
            self.close()  # the peer is not speaking this framing: drop it

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._on_lost()

    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def send(self, frames: Sequence[bytes | memoryview]) -> bool:
        """Queue a message; False when the connection is closed (the message is dropped)."""
        return self.send_many([frames])

    def send_many(self, messages: Sequence[Sequence[bytes | memoryview]]) -> bool:
        """Queue several messages in one write; False when the connection is closed."""
        if not self.open:
            return False
        assert self._transport is not None
        self._transport.writelines([piece for frames in messages for piece in pack(frames)])
        return True

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
