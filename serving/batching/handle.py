"""What a served model needs from a batcher: the in-process ``DynamicBatcher`` or a frontend
process's handle on the engine process's (``serving.multiprocess.remote.RemoteBatcher``)."""

from __future__ import annotations

from typing import Protocol, TypeVar

ItemT = TypeVar("ItemT", contravariant=True)
ResultT = TypeVar("ResultT", covariant=True)


class Batcher(Protocol[ItemT, ResultT]):
    """Batches of one-shot work: an item in, its result out (a classifier's image and class
    probabilities; a generator's scored pair and its log-probabilities)."""

    @property
    def running(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True) -> None: ...

    async def submit(
        self,
        item: ItemT,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        times: list[float] | None = None,
    ) -> ResultT: ...
