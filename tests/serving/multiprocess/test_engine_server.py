"""The engine process's socket, in one process: a frontend connection that closes (a frontend
that died) has its requests cancelled in the engine: generations free their rows for the others,
queued classifications leave the batcher's queue."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from contract.model_config import DynamicBatching
from contract.repository import read_model_config, resolve_version
from serving.batching import DynamicBatcher
from serving.engine.requests import GenerationRequest
from serving.generation.options import DecodingOptions
from serving.multiprocess.engine_server import EngineServer
from serving.multiprocess.remote import EngineClient, RemoteBatcher, RemoteEngine
from serving.repository import ModelRepository
from serving.served import ServedClassifier


def slow_steps(cache: Any, seconds: float = 0.02) -> None:
    """Each decoder step of ``cache`` takes ``seconds`` more: the tiny translator's position
    table ends a generation after a few dozen steps, which must not happen before the test has
    closed the connection."""
    for name in ("step", "step_greedy"):
        original = getattr(cache, name)

        def slowed(*args: Any, original: Any = original, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return original(*args, **kwargs)

        setattr(cache, name, slowed)


async def classifier_server(
    repository: Path, tmp_path: Path, run_batch: Any, max_batch_size: int
) -> tuple[DynamicBatcher, EngineServer]:
    """An engine server whose ``vit`` batches with ``run_batch`` (started, bound)."""
    entry = repository / "vit"
    settings = DynamicBatching(
        max_batch_size=max_batch_size, max_queue_delay_us=0, timeout_ms=30_000
    )
    batcher = DynamicBatcher("vit", run_batch, settings)
    model = ServedClassifier(
        read_model_config(entry), resolve_version(entry), None, batcher=batcher
    )
    await batcher.start()
    server = EngineServer(ModelRepository([model]), str(tmp_path / "engine.sock"))
    await server.bind()
    return batcher, server


def test_a_closed_frontend_connection_cancels_its_requests(
    tiny_repository: Path, tmp_path: Path
) -> None:
    async def main() -> tuple[list[GenerationRequest], int, bool]:
        repository = ModelRepository.load(tiny_repository, names=("translator",))
        slow_steps(repository.get("translator").engine.cache)  # type: ignore[union-attr]
        await repository.start()
        server = EngineServer(repository, str(tmp_path / "engine.sock"))
        await server.bind()
        client = EngineClient(server.path)
        await client.start()
        engine = RemoteEngine(client, "translator", 1, 8)
        options = DecodingOptions(max_new_tokens=4000, min_new_tokens=4000)
        streams = [
            engine.generate_chunks(
                GenerationRequest(options=options, source_ids=np.array([9, 10, 2]))
            )
            for _ in range(3)
        ]
        for stream in streams:
            await anext(stream)  # each is decoding in the engine
        requests = list(server._generations.values())
        client._connection.close()  # the frontend is gone without a word
        for _ in range(200):
            if not server._generations and not server._batched:
                break
            await asyncio.sleep(0.05)
        left = len(server._generations) + len(server._batched)
        await server.close()
        await client.close()
        await repository.stop(5)
        return requests, left, client.alive

    requests, left, alive = asyncio.run(main())
    assert len(requests) == 3, "a generation ended before the connection closed"
    assert all(r.is_cancelled() for r in requests)
    assert left == 0  # every generation ended in the engine
    assert not alive  # the frontend side saw its connection go


def test_a_closed_frontend_connection_withdraws_its_queued_classifications(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Classifications wait in the batcher through a ticket, not a task: one runs (its batch
    blocks), two wait; the frontend's connection closes; the waiting ones leave the queue and
    never run, and the engine server holds nothing for the frontend."""
    release, seen = threading.Event(), []

    def run_batch(items: list[np.ndarray]) -> list[np.ndarray]:
        seen.append(len(items))
        release.wait(10)
        return [np.zeros(10, np.float32) for _ in items]

    async def main() -> tuple[int, int, int]:
        batcher, server = await classifier_server(tiny_repository, tmp_path, run_batch, 1)
        client = EngineClient(server.path)
        await client.start()
        remote = RemoteBatcher(client, "vit", 1)
        pixels = np.zeros((3, 32, 32), np.float32)
        calls = [asyncio.ensure_future(remote.submit(pixels)) for _ in range(3)]
        for _ in range(200):
            if batcher.queue_depth == 2 and seen:
                break
            await asyncio.sleep(0.01)
        queued = batcher.queue_depth
        client._connection.close()  # the frontend is gone without a word
        for _ in range(200):
            if not server._batched and batcher.queue_depth == 0:
                break
            await asyncio.sleep(0.01)
        left = len(server._batched) + batcher.queue_depth
        release.set()
        await asyncio.gather(*calls, return_exceptions=True)
        await batcher.stop()
        await server.close()
        await client.close()
        return queued, left, len(seen)

    queued, left, batches = asyncio.run(main())
    assert queued == 2  # one running, two waiting in the queue
    assert left == 0  # withdrawn: out of the queue and forgotten by the engine server
    assert batches == 1  # the withdrawn ones never ran


def test_a_steps_tokens_and_events_reach_a_frontend_in_one_message(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Streams decoding together: their tokens come from the engine process in ``events``
    messages, each holding several streams' tokens, the last step's with the streams' finishes;
    every stream's tokens equal its finish's."""
    kinds: list[tuple[int, int]] = []  # (tokens, items) per message

    async def main() -> list[list]:
        repository = ModelRepository.load(tiny_repository, names=("translator",))
        await repository.start()
        server = EngineServer(repository, str(tmp_path / "engine.sock"))
        await server.bind()
        client = EngineClient(server.path)
        await client.start()
        route = client._route

        def recording(header: dict, arrays: list) -> None:
            tokens = len(arrays[-1]) if header.get("tokens") else 0
            kinds.append((tokens, len(header["items"])))
            route(header, arrays)

        client._route = recording  # type: ignore[method-assign]
        engine = RemoteEngine(client, "translator", 1, 8)
        options = DecodingOptions(max_new_tokens=12, min_new_tokens=12)

        async def events(seed: int) -> list:
            request = GenerationRequest(options=options, source_ids=np.array([9, 10 + seed, 2]))
            return [event async for event in engine.generate(request)]

        out = await asyncio.gather(*(events(seed) for seed in range(4)))
        await server.close()
        await client.close()
        await repository.stop(5)
        return out

    streams = asyncio.run(main())
    for *tokens, finish in streams:
        assert [t.token_id for t in tokens] == finish.tokens and len(finish.tokens) == 12
        assert [t.index for t in tokens] == list(range(12))
    per_message = [tokens for tokens, _ in kinds]
    assert sum(per_message) == 4 * 12
    assert max(per_message) > 1  # a step's tokens of several streams in one message
    assert sum(items for _, items in kinds) == 4  # the finishes
    assert any(tokens and items for tokens, items in kinds)  # a last step's tokens and finishes
