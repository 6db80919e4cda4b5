"""Priority order of a waiting queue (Triton's priority levels): 1 is served first.

A queue holds its requests highest priority first, first come first served within a level, so
the batcher and the admission policy keep taking from the front. With priorities off every
request has level 0 and an insertion is an append. A level with a queue policy of its own
(``priority_queue_policy``) has its own limit on waiting requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Protocol, TypeVar

from contract.model_config import QueuePolicy, level_policy


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


def level_limit(
    level: int, max_queue_size: int, policies: tuple[QueuePolicy, ...]
) -> tuple[int, str]:
    """The limit on waiting requests that applies at ``level`` (0 = none) and the config field
    that sets it: the level's own queue policy, else the model's ``max_queue_size``."""
    policy = level_policy(level, policies)
    if policy is None:
        return max_queue_size, "batching.max_queue_size"
    return policy.max_queue_size, f"batching.priority_queue_policy level {level}: max_queue_size"


def queue_is_full(
    queue: Collection[Prioritised],
    level: int,
    max_queue_size: int,
    policies: tuple[QueuePolicy, ...] = (),
) -> bool:
    """Whether a request of ``level`` must be refused: a level with a policy of its own counts
    its own waiting requests; the other levels count theirs together against
    ``max_queue_size`` (everything waiting when no level has a policy). A limit of 0 is none."""
    limit, _ = level_limit(level, max_queue_size, policies)
    if not limit:
        return False
    if not policies:
        return len(queue) >= limit
    own = {policy.level for policy in policies}
    if level in own:
        return sum(1 for item in queue if item.priority == level) >= limit
    return sum(1 for item in queue if item.priority not in own) >= limit
