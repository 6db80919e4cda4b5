"""A served generator's scores: its ``Score`` pairs through the scoring batcher, with times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving import tracing
from serving.batching.handle import Batcher
from serving.gather import gather_or_cancel
from serving.scoring import ScoreItem, from_result


@dataclass
class Scored:
    """One scored pair: its target's token log-probabilities, then EOS's."""

    input_tokens: int  # the source's tokens, or the image encoder's positions
    log_probs: np.ndarray  # float32 (T + 1,): the target's tokens', then EOS's
    queue_seconds: float  # from its arrival at the batcher to its pass's start
    compute_seconds: float  # its pass (shared with the pass's other pairs)

    @property
    def score(self) -> float:
        """The target's log-probability: the sum, EOS's included (natural log)."""
        return float(self.log_probs.astype(np.float64).sum())


async def score_all(
    batcher: Batcher[ScoreItem, np.ndarray],
    items: Sequence[ScoreItem],
    timeout_s: float | None,
    priority: int,
) -> list[Scored]:
    """Every pair through ``batcher`` at once (they may share passes with other calls' pairs);
    if one fails, or the call is cancelled, the others are withdrawn. A traced request's span
    runs from the first pair's arrival to the last pass's end."""
    trace = tracing.current.get()

    async def one(item: ScoreItem) -> Scored:
        times: list[float] = []
        result = await batcher.submit(item, timeout_s=timeout_s, priority=priority, times=times)
        positions, log_probs = from_result(result)
        if len(times) < 3:  # a batcher that does not report its times
            return Scored(positions, log_probs, 0.0, 0.0)
        if trace is not None:
            trace.span(*times[:3])
        return Scored(positions, log_probs, times[1] - times[0], times[2] - times[1])

    return await gather_or_cancel(one(item) for item in items)
