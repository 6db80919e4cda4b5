"""The engine process's socket, in one process: a frontend connection that closes (a frontend
that died) has its requests cancelled in the engine, whose rows go free for the others."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.requests import GenerationRequest
from serving.generation.options import DecodingOptions
from serving.multiprocess.engine_server import EngineServer
from serving.multiprocess.remote import EngineClient, RemoteEngine
from serving.repository import ModelRepository


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
        engine = RemoteEngine(client, "translator", 8)
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
            if not server._generations and not server._tasks:
                break
            await asyncio.sleep(0.05)
        left = len(server._generations) + len(server._tasks)
        await server.close()
        await client.close()
        await repository.stop(5)
        return requests, left, client.alive

    requests, left, alive = asyncio.run(main())
    assert len(requests) == 3, "a generation ended before the connection closed"
    assert all(r.is_cancelled() for r in requests)
    assert left == 0  # every generation ended in the engine
    assert not alive  # the frontend side saw its connection go
