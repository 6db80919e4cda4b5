"""Priority order of a waiting queue (Triton's priority levels): 1 is served first.

A queue holds its requests highest priority first, first come first served within a level, so
the batcher and the admission policy keep taking from the front. With priorities off every
request has level 0 and an insertion is an append.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, TypeVar


class Prioritised(Protocol):
    @property
    def priority(self) -> int:
        """Queue level: lower is served first (0 = priorities off)."""
        ...


P = TypeVar("P", bound=Prioritised)


def insert_by_priority(queue: deque[P], item: P) -> None:
    """Put ``item`` behind every queued item of its level or a higher one (a lower number) and
    ahead of every item of a lower one; O(1) while levels arrive in order."""
    index = len(queue)
    while index and queue[index - 1].priority > item.priority:
        index -= 1
    if index == len(queue):
        queue.append(item)
    else:
        queue.insert(index, item)
