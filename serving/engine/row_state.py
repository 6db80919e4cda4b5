"""The decode loop's per-row state as numpy arrays: what a step reads and writes for every row at
once, instead of a Python object per row.

A running sequence holds one state slot per row of the batch it uses (a row each, or a beam
per row), taken at admission and given back when it leaves. The slots are the engine's own, not
the cache's rows: the padded cache names its rows with ever-growing ids, and the in-place cache's
rows move when beams are reordered (the state of a beam row is set anew each step).
"""

from __future__ import annotations

import numpy as np

from serving.engine.slots import RowSlots, per_request

# the columns of ``RowState.fixed``, in order
FIXED = ("min_new", "forced_eos_at", "limit", "route")


class RowState:
    """Per slot: tokens generated (EOS included), the next input id, the limits the token choice
    needs, when the last token came, the token route's key, and the tokens so far.

    Args:
        slots: rows of the decode batch (``batching.decode_rows``).
        max_tokens: the most tokens a sequence generates (the position table's length bounds it).
    """

    def __init__(self, slots: int, max_tokens: int) -> None:
        self.slots = RowSlots(slots)
        self.generated = np.zeros(slots, np.int64)
        self.next_id = np.zeros(slots, np.int64)
        # what a sequence's admission fixes, one row per column (read together: ``fixed``)
        self.fixed = np.zeros((len(FIXED), slots), np.int64)
        self.min_new = self.fixed[0]  # EOS not chosen before this many tokens
        self.forced_eos_at = self.fixed[1]  # ``generated`` forcing EOS; -1: never
        self.limit = self.fixed[2]  # finished ("length") at this many tokens
        self.route = self.fixed[3]  # the request's ``token_route`` key; -1: none
        self.forced_eos_at[:] = self.route[:] = -1
        self.last_time = np.full(slots, np.nan)  # clock time of the last token; NaN: none yet
        self.tokens = np.zeros((slots, max(1, max_tokens)), np.int64)
        # each token's log-probability (EOS's after the tokens), for ``return_log_probs``
        self.log_probs = np.zeros((slots, max(1, max_tokens)), np.float64)

    def take(
        self,
        counts: list[int],
        start_id: int,
        min_new: list[int],
        forced_eos_at: list[int],
        limit: list[int],
        route: list[int],
    ) -> list[np.ndarray]:
        """Slots for joining sequences (``counts[i]`` rows each, with the ``i``-th value of each
        list), set for their first step; one array of slots per sequence."""
        total = sum(counts)
        slots = np.asarray(self.slots.take(total), dtype=np.int64)
        self.generated[slots] = 0
        self.next_id[slots] = start_id
        self.last_time[slots] = np.nan
        fixed = np.array([min_new, forced_eos_at, limit, route], dtype=np.int64)
        self.fixed[:, slots] = fixed if total == len(counts) else np.repeat(fixed, counts, axis=1)
        return per_request(slots, counts)

    def give_back(self, slots: np.ndarray) -> None:
        self.slots.give_back(slots.tolist())

    def tokens_of(self, slot: int, count: int) -> list[int]:
        """The first ``count`` tokens of the sequence at ``slot``."""
        return self.tokens[slot, :count].tolist()
