"""Several in-flight engines of one model (``batching.instances``), seen as one engine.

Triton's ``instance_group`` and CTranslate2's ``inter_threads``: each instance has its own KV
cache and decode thread (and its own ONNX Runtime sessions, unless each has one thread: then
they share one set, ``serving.repository.make_backends``), so N instances of 1 thread decode N
batches at once instead of one batch split over N threads. Where a step's kernels are too
small to keep several threads busy (int8 weights, decode batches of 8-32 rows on a few cores)
that is faster; where the matmuls parallelise well (fp32) it is not, and a lone request gets one
instance's threads only. Each request goes to the instance with the fewest rows in use and waiting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from serving.engine.inflight import InFlightEngine
from serving.engine.requests import Event, EventChannel, GenerationRequest, Listener


class EnginePool:
    """``GenerationEngine`` over several ``InFlightEngine`` instances of one model.

    Args:
        engines: the instances (same model and limits; each with its own KV cache).
    """

    def __init__(self, engines: Sequence[InFlightEngine]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = list(engines)

    @property
    def running(self) -> bool:
        return all(engine.running for engine in self.engines)

    @property
    def max_rows(self) -> int:
        """Rows one request may use: one instance's (a request runs in one instance)."""
        return self.engines[0].max_rows

    @property
    def active_rows(self) -> int:
        return sum(engine.active_rows for engine in self.engines)

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every instance at once (each finishes its work within ``timeout``)."""
        with ThreadPoolExecutor(len(self.engines)) as executor:
            list(executor.map(lambda engine: engine.stop(timeout), self.engines))

    def pick(self) -> InFlightEngine:
        """The instance with the fewest rows in use and waiting (the first among equals)."""
        return min(self.engines, key=lambda engine: engine.active_rows + engine.waiting_rows)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        async for event in self.pick().generate(request):
            yield event

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        async for chunk in self.pick().generate_chunks(request):
            yield chunk

    def submit(self, request: GenerationRequest, listener: Listener | None = None) -> EventChannel:
        """``InFlightEngine.submit`` on the instance ``pick`` chooses."""
        return self.pick().submit(request, listener)
