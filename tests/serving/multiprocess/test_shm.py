"""Shared memory for the frontends' tensors: the ring never hands out space still in use and
gives back what it holds; the engine reads exactly what was written; a bad offset or hello is
refused; and served answers are the same through the arena as through the socket."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.repository import read_model_config
from serving.engine.requests import FinishEvent, GenerationRequest
from serving.generation.options import DecodingOptions
from serving.metrics import FRONTEND_LARGE_ARRAYS, ServingMetrics
from serving.multiprocess.engine_server import EngineServer
from serving.multiprocess.protocol import ProtocolError, decode, encode
from serving.multiprocess.remote import EngineClient, RemoteBatcher, RemoteEngine
from serving.multiprocess.shm import (
    ALIGN,
    HELLO,
    ArenaError,
    ArenaReader,
    TensorArena,
    receive_hello,
    send_hello,
)
from serving.repository import ModelRepository
from tests.serving.multiprocess.test_engine_server import classifier_server

# a script for the ring: put arrays of these many bytes, or let the engine read up to a message
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 3000)),
        st.tuples(st.just("ack"), st.integers(0, 3)),
    ),
    max_size=60,
)


def reader_of(arena: TensorArena) -> ArenaReader:
    return ArenaReader(os.dup(arena.fd), arena.size)  # what the engine maps


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, size=st.integers(ALIGN, 8192))
def test_the_ring_never_overwrites_an_unread_array(steps: list[tuple[str, int]], size: int) -> None:
    """Live arrays never overlap, lie inside the arena on a cache line, and read back intact
    until released; an emptied ring takes any array that fits the arena; every array is
    placed or refused, and nothing is held once all are released."""
    arena = TensorArena(size)
    reader = reader_of(arena)
    live: dict[int, tuple[int, np.ndarray]] = {}  # seq -> (offset, what was written)
    seq = acked = 0
    try:
        for kind, n in steps:
            if kind == "ack":
                acked = min(seq, acked + n)
                arena.release(acked)
                live = {s: v for s, v in live.items() if s > acked}
                continue
            seq += 1
            array = np.random.default_rng(seq).integers(0, 255, n, dtype=np.uint8)
            offset = arena.put(array, seq)
            if offset is None:
                assert live or n > arena.size  # an empty ring takes what fits
                continue
            assert offset % ALIGN == 0 and offset + n <= arena.size
            live[seq] = (offset, array)
            spans = sorted((o, o + a.nbytes) for o, a in live.values())
            assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
            for offset, written in live.values():
                read = reader.array(offset, np.dtype(np.uint8), written.shape)
                np.testing.assert_array_equal(read, written)
            assert arena.used >= sum(a.nbytes for _, a in live.values())
        arena.release(seq)
        assert arena.used == 0
        assert arena.placed + arena.missed == seq
    finally:
        reader.close()
        arena.close()


def test_arrays_round_trip_through_an_arena_and_the_socket_alike() -> None:
    arena = TensorArena(1 << 20)
    reader = reader_of(arena)
    try:
        big = np.arange(3 * 32 * 32, dtype=np.float32).reshape(3, 32, 32)
        small = np.array([5, 6, 7], dtype=np.int64)
        frames = encode(
            {"t": "x"}, [small, big], lambda a: arena.put(a, 1) if a.nbytes > 64 else None
        )
        assert len(frames) == 2  # the header and the small array's frame; the image is shared
        header, (got_small, got_big) = decode(frames, reader)
        np.testing.assert_array_equal(got_small, small)
        np.testing.assert_array_equal(got_big, big)
        assert got_big.flags.owndata  # a copy: the frontend may reuse the space
        with pytest.raises(ProtocolError, match="no arena"):
            decode(frames)  # shared memory named, but the sender has none
        header["arrays"][1]["shm"] = arena.size  # past the end
        with pytest.raises(ProtocolError):
            decode([encode_header(header), frames[1]], reader)
        header["arrays"][1]["shm"] = 8  # not on an array boundary
        with pytest.raises(ProtocolError):
            decode([encode_header(header), frames[1]], reader)
        header["arrays"][1]["shm"] = "0"
        with pytest.raises(ProtocolError):
            decode([encode_header(header), frames[1]], reader)
    finally:
        reader.close()
        arena.close()


def encode_header(header: dict) -> bytes:
    import msgpack

    return msgpack.packb(header)


def test_a_reader_refuses_arrays_outside_its_arena() -> None:
    arena = TensorArena(4096)
    reader = reader_of(arena)
    try:
        with pytest.raises(ArenaError):
            reader.array(4096 - 64, np.dtype(np.float32), (17,))  # 68 bytes from 4032
        with pytest.raises(ArenaError):
            reader.array(-64, np.dtype(np.uint8), (1,))
        assert reader.array(4096 - 64, np.dtype(np.float32), (16,)).shape == (16,)
    finally:
        reader.close()
        arena.close()
    reader.close()  # a second close (a connection lost while its handshake failed) is harmless
    arena.close()


def test_a_hello_hands_the_arena_over_and_leaves_what_follows_in_the_socket() -> None:
    async def main() -> tuple[bytes, bytes]:
        arena = TensorArena(1 << 16)
        arena.put(np.frombuffer(b"written by the frontend", np.uint8), 1)
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        try:
            send_hello(theirs, arena)
            theirs.sendall(b"next message")
            reader = await receive_hello(ours)
            assert reader is not None and reader.size == arena.size
            seen = reader.array(0, np.dtype(np.uint8), (23,)).tobytes()
            reader.close()
            rest = await asyncio.get_running_loop().sock_recv(ours, 100)
            return seen, rest
        finally:
            ours.close()
            theirs.close()
            arena.close()

    assert asyncio.run(main()) == (b"written by the frontend", b"next message")


@pytest.mark.parametrize(
    "opening",
    [b"GET / HTTP/1.1\r\n", HELLO.pack(b"attnshm1", 4096), b"short"],
    ids=["not-a-hello", "size-without-descriptor", "closed-early"],
)
def test_a_connection_without_a_proper_hello_is_refused(opening: bytes) -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.sendall(opening)
        theirs.close()
        try:
            await receive_hello(ours)
        finally:
            ours.close()

    with pytest.raises((ArenaError, OSError)):
        asyncio.run(main())


def test_served_answers_are_the_same_through_the_arena_and_the_socket(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Three frontends' connections to one real engine (tiny ViT and captioner): no arena, a
    roomy one, and one too small for the requests in flight (some images then go through the
    socket). Probabilities and captions agree; the arena is empty once the answers are in."""
    vit = read_model_config(tiny_repository / "vit")
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((3, 32, 32), dtype=np.float32) for _ in range(48)]
    pictures = [rng.standard_normal((3, 48, 48), dtype=np.float32) for _ in range(6)]
    options = DecodingOptions(max_new_tokens=6)

    Use = tuple[int, int] | None  # the arena's (placed, missed) arrays

    async def main() -> list[tuple[list[np.ndarray], list[list[int]], Use]]:
        repository = ModelRepository.load(tiny_repository, names=(vit.name, "captioner"))
        await repository.start()
        server = EngineServer(repository, str(tmp_path / "engine.sock"))
        await server.bind()
        results = []
        for arena_bytes in (0, 1 << 20, 40_000):  # 40 kB: three 12 kB images at a time
            metrics = ServingMetrics()
            client = EngineClient(
                server.path, arena_bytes=arena_bytes, arena_min_bytes=8192, metrics=metrics
            )
            await client.start()
            batcher = RemoteBatcher(client, vit.name, 1)
            engine = RemoteEngine(client, "captioner", 1, 8)

            async def caption(pixels: np.ndarray, engine: RemoteEngine = engine) -> list[int]:
                request = GenerationRequest(options=options, pixels=pixels)
                events = [e async for e in engine.generate(request)]
                assert isinstance(events[-1], FinishEvent)
                return events[-1].tokens

            probabilities = await asyncio.gather(*(batcher.submit(i) for i in images))
            captions = await asyncio.gather(*(caption(p) for p in pictures))
            arena = client.arena
            assert arena is None or arena.used == 0  # every answer in: every array read
            use = None if arena is None else (arena.placed, arena.missed)
            counted = tuple(
                metrics.registry.get_sample_value(FRONTEND_LARGE_ARRAYS, {"path": path})
                for path in ("shared_memory", "socket")
            )
            assert counted == (use or (0, 54))  # without an arena every image took the socket
            results.append((probabilities, captions, use))
            await client.close()
        await server.close()
        await repository.stop(5)
        return results

    (
        (plain, plain_captions, _),
        (roomy, roomy_captions, roomy_use),
        (tight, tight_captions, tight_use),
    ) = asyncio.run(main())
    for got in (roomy, tight):
        np.testing.assert_allclose(np.stack(got), np.stack(plain), rtol=0, atol=1e-6)
    assert roomy_captions == plain_captions == tight_captions
    assert roomy_use == (54, 0)  # every image through the arena
    placed, missed = tight_use
    assert placed + missed == 54 and placed > 0 and missed > 0  # full: the socket took the rest


def test_the_arena_size_is_a_server_option() -> None:
    from serving.server_config import ServerConfig

    assert ServerConfig().frontend_shm_mb == 32
    assert ServerConfig(frontend_shm_mb=0).frontend_shm_mb == 0  # off
    with pytest.raises(ValueError, match="frontend_shm_mb"):
        ServerConfig(frontend_shm_mb=-1)


def test_the_engine_frees_the_arena_before_it_answers(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Classifications held in a batch that does not return: their images' space is free as
    soon as the engine has read them (an ``ack`` of its own), not when the answers come."""
    release = threading.Event()

    def run_batch(items: list[np.ndarray]) -> list[np.ndarray]:
        release.wait(10)
        return [np.full(10, float(item.mean()), np.float32) for item in items]

    async def main() -> tuple[int, bool, list[float]]:
        batcher, server = await classifier_server(tiny_repository, tmp_path, run_batch, 4)
        client = EngineClient(server.path, arena_bytes=1 << 20, arena_min_bytes=16384)
        await client.start()
        assert client.arena is not None
        remote = RemoteBatcher(client, "vit", 1)
        images = [np.full((3, 64, 64), i, np.float32) for i in range(3)]  # 49 KB each
        calls = [asyncio.ensure_future(remote.submit(image)) for image in images]
        await asyncio.sleep(0)  # the requests leave
        held = client.arena.used
        for _ in range(200):
            if client.arena.used == 0:
                break
            await asyncio.sleep(0.01)
        freed_unanswered = client.arena.used == 0 and not any(c.done() for c in calls)
        release.set()
        answers = [float(a[0]) for a in await asyncio.gather(*calls)]
        await client.close()
        await server.close()
        await batcher.stop()
        return held, freed_unanswered, answers

    held, freed_unanswered, answers = asyncio.run(main())
    assert held >= 3 * 3 * 64 * 64 * 4  # the three images were in the arena
    assert freed_unanswered
    assert answers == [0.0, 1.0, 2.0]  # each answer from its own image


def test_without_memfd_the_frontend_sends_through_the_socket(
    tiny_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system without ``memfd_create``: the frontend warns, connects without an arena, and
    its images take the socket (counted so)."""
    monkeypatch.delattr(os, "memfd_create")

    def run_batch(items: list[np.ndarray]) -> list[np.ndarray]:
        return [np.full(10, float(item.mean()), np.float32) for item in items]

    async def main() -> tuple[bool, float, float | None]:
        batcher, server = await classifier_server(tiny_repository, tmp_path, run_batch, 4)
        metrics = ServingMetrics()
        client = EngineClient(
            server.path, arena_bytes=1 << 20, arena_min_bytes=16384, metrics=metrics
        )
        await client.start()
        answer = await RemoteBatcher(client, "vit", 1).submit(np.full((3, 64, 64), 5, np.float32))
        counted = metrics.registry.get_sample_value(FRONTEND_LARGE_ARRAYS, {"path": "socket"})
        await client.close()
        await server.close()
        await batcher.stop()
        return client.arena is None, float(answer[0]), counted

    assert asyncio.run(main()) == (True, 5.0, 1.0)
