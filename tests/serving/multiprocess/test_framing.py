"""Framed messages over a byte stream: whatever the split of the stream into reads, the reader
gives back exactly the messages written; a corrupt stream is refused, and over a real Unix
socket messages arrive in order and a closed peer is reported."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.multiprocess.framing import (
    MAX_FRAMES,
    FrameReader,
    FramingError,
    MessageConnection,
    pack,
)

MESSAGES = st.lists(st.lists(st.binary(max_size=300), max_size=5), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(messages=MESSAGES, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_any_split_of_the_stream_gives_back_the_messages(
    messages: list[list[bytes]], cuts: list[int]
) -> None:
    stream = b"".join(bytes(part) for m in messages for part in pack(m))
    reader, got = FrameReader(), []
    start = 0
    for cut in [*sorted(c for c in cuts if c <= len(stream)), len(stream)]:
        got += [[bytes(f) for f in message] for message in reader.feed(stream[start:cut])]
        start = cut
    assert got == messages


def test_an_incomplete_message_waits_for_the_rest() -> None:
    stream = b"".join(pack([b"header", b"x" * 1000]))
    reader = FrameReader()
    assert list(reader.feed(stream[:-1])) == []
    assert [[bytes(f) for f in m] for m in reader.feed(stream[-1:])] == [[b"header", b"x" * 1000]]


def test_a_corrupt_frame_count_is_refused() -> None:
    with pytest.raises(FramingError, match="frames"):
        list(FrameReader().feed(struct.pack("<I", MAX_FRAMES + 1) + b"\0" * 64))


def test_messages_cross_a_unix_socket_in_order_and_a_close_is_reported(tmp_path: Path) -> None:
    async def main() -> tuple[list[list[bytes]], bool]:
        received: list[list[bytes]] = []
        lost = asyncio.Event()
        loop = asyncio.get_running_loop()
        server_side: list[MessageConnection] = []

        def accept() -> MessageConnection:
            connection = MessageConnection(
                lambda frames: received.append([bytes(f) for f in frames]), lost.set
            )
            server_side.append(connection)
            return connection

        server = await loop.create_unix_server(accept, str(tmp_path / "s.sock"))
        client = MessageConnection(lambda frames: None, lambda: None)
        await loop.create_unix_connection(lambda: client, str(tmp_path / "s.sock"))
        big = bytes(range(256)) * 4096  # 1 MiB: many reads on the other side
        for i in range(50):
            assert client.send([f"message {i}".encode(), big if i % 10 == 0 else b""])
        client.close()
        await asyncio.wait_for(lost.wait(), 10)
        assert not client.open and not client.send([b"after close"])
        server.close()
        return received, lost.is_set()

    received, lost = asyncio.run(main())
    assert lost
    assert [m[0] for m in received] == [f"message {i}".encode() for i in range(50)]
    assert all(len(m[1]) == (1 << 20 if i % 10 == 0 else 0) for i, m in enumerate(received))


def test_an_engine_client_writes_one_loop_turn_s_messages_at_once_in_order(tmp_path: Path) -> None:
    """``EngineClient.send`` queues; the messages of one event-loop turn leave in one write
    (``send_many``) and arrive in the order they were sent."""
    from serving.multiprocess.protocol import decode
    from serving.multiprocess.remote import EngineClient

    async def main() -> tuple[list[int], list[int]]:
        ids: list[int] = []
        loop = asyncio.get_running_loop()

        def accept() -> MessageConnection:
            return _AfterHello(lambda f: ids.append(decode(f)[0]["id"]), lambda: None)

        server = await loop.create_unix_server(accept, str(tmp_path / "e.sock"))
        client = EngineClient(str(tmp_path / "e.sock"))
        await client.start()
        assert client._connection is not None
        writes: list[int] = []
        send_many = client._connection.send_many

        def counted(messages):  # type: ignore[no-untyped-def]
            writes.append(len(messages))
            return send_many(messages)

        client._connection.send_many = counted  # type: ignore[method-assign]
        for turn in range(3):
            for i in range(4):
                client.send({"t": "cancel", "id": 4 * turn + i})
            await asyncio.sleep(0)  # the end of a loop turn: the outbox is written
        for _ in range(200):
            if len(ids) == 12:
                break
            await asyncio.sleep(0.01)
        await client.close()
        server.close()
        return ids, writes

    ids, writes = asyncio.run(main())
    assert ids == list(range(12))
    assert writes == [4, 4, 4]


class _AfterHello(MessageConnection):
    """A connection that skips a frontend's hello (``shm.send_hello``: no arena, no descriptor)
    and reads messages after it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._hello = b""

    def data_received(self, data: bytes) -> None:
        from serving.multiprocess.shm import HELLO, MAGIC

        if len(self._hello) < HELLO.size:
            need = HELLO.size - len(self._hello)
            self._hello, data = self._hello + data[:need], data[need:]
            if len(self._hello) == HELLO.size:
                assert HELLO.unpack(self._hello) == (MAGIC, 0)
        if data:
            super().data_received(data)
