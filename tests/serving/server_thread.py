"""Run a real attnserve server on a loopback port in a background thread (for tests)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from serving.server import RunningServer, create_server
from serving.server_config import ServerConfig


class ServerThread:
    """Starts ``create_server`` in its own event loop; ``stop`` drains and joins."""

    def __init__(self, repository: Path, **config: Any) -> None:
        settings = {"port": 0, "metrics_port": 0, **config}
        self.config = ServerConfig(repository=str(repository), **settings)
        self.loop = asyncio.new_event_loop()
        self.running: RunningServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.running = self.loop.run_until_complete(create_server(self.config))
        except BaseException as err:  # surfaced to the test thread in __enter__
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    @property
    def address(self) -> str:
        assert self.running is not None
        return f"127.0.0.1:{self.running.port}"

    @property
    def http_url(self) -> str:
        """The HTTP/REST base URL (the server needs ``http_port``)."""
        assert self.running is not None and self.running.http_port is not None
        return f"http://127.0.0.1:{self.running.http_port}"

    @property
    def metrics_url(self) -> str:
        assert self.running is not None
        return f"http://127.0.0.1:{self.running.metrics_port}/metrics"

    def call(self, coroutine: Any, timeout: float = 60) -> Any:
        """Run a coroutine in the server's loop (e.g. a drain) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self, grace: float = 0.5) -> None:
        if self.running is not None and self.loop.is_running():
            self.call(self.running.stop(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
