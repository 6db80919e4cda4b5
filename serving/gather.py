"""Awaiting the parts of one request together: all of them, or none once one fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Await all concurrently, results in order; on the first failure (or the caller's
    cancellation) the rest are cancelled and the error raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
