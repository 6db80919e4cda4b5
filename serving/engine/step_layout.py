"""What the in-flight engine's decode step reads about the running sequences.

``ActiveSequence`` is one running request (its rows, sampler or beam search); ``StepLayout`` where
the running sequences' rows lie in a step's batch, kept in numpy as sequences join and leave;
``StepAhead`` a greedy step started before the last step's bookkeeping
(``batching.overlap_steps``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from contract.model_config import DecoderSpec
from serving.engine.decode_cache import GreedyStep
from serving.engine.requests import GenerationRequest, TokenSink
from serving.engine.row_state import FIXED, RowState
from serving.generation.beam import BeamSearch
from serving.generation.history_rules import HistoryRules
from serving.generation.sampling import RowSampler
from serving.generation.top_tokens import TopTokens


class ActiveSequence:
    """A running request: its rows in the batch and its decoding state."""

    def __init__(self, request: GenerationRequest, spec: DecoderSpec, max_new: int, now: float):
        self.request = request
        self.options = request.options
        self.max_new = max_new  # tokens to choose after the target prefix
        self.forced = len(request.prefix)  # the prefix's tokens: fed one a step, not chosen
        # the position table bounds the prefix and the chosen tokens together
        self.limit = min(self.forced + max_new, spec.max_positions - 1)
        self.min_new = self.forced + self.options.min_new_tokens  # EOS not chosen before
        self.admitted = now
        self.beam: BeamSearch | None = None
        self.sampler: RowSampler | None = None
        # greedy (temperature 0, not beams, no history rules or log-probs): chosen with
        # the step's other greedy rows in one pass (once past its prefix: ``greedy_after``)
        self.greedy = False
        self.greedy_after = False
        self.forced_eos_at = -1
        self.tops: list[TopTokens] = []  # ``top_log_probs``: each position's, chosen in order
        # the request's bad words and the model's own (``DecoderSpec.bad_words``)
        bad_words = request.bad_words + spec.bad_words
        rules = HistoryRules.of(self.options, spec.decoder_start_id, bad_words)
        if self.options.beam_size > 1:
            self.beam = BeamSearch(
                beam_size=self.options.beam_size,
                eos_id=spec.eos_id,
                max_new_tokens=max_new,
                min_new_tokens=self.options.min_new_tokens,
                length_penalty=self.options.length_penalty,
                num_alternatives=self.options.num_alternatives,
                suppress_ids=spec.suppress_ids,
                forced_eos=spec.forced_eos,
                rules=rules,
                prefix=request.prefix,
                top=self.options.top_log_probs,
            )
        else:
            last = self.limit - 1  # the sequence's last position
            self.sampler = RowSampler(
                self.options,
                eos_id=spec.eos_id,
                suppress_ids=spec.suppress_ids,
                forced_eos_at=last if spec.forced_eos else None,
                rules=rules,
                prefix=request.prefix,
            )
            plain = rules is None and not self.options.return_log_probs
            self.greedy_after = self.options.temperature == 0 and plain
            self.greedy = self.greedy_after and not self.forced
            self.forced_eos_at = last if spec.forced_eos else -1
        self.rows = np.zeros(0, dtype=np.int64)  # its rows of the cache, set on admission
        # its slots of the engine's RowState (a row each), set on admission; ``slot`` the first
        self.slots = np.zeros(0, dtype=np.int64)
        self.slot = 0
        self.parents = np.zeros(0, dtype=np.int64)  # beam search: the rows the beams continue


class StepAhead:
    """A greedy step started before the last step's bookkeeping (``InFlightEngine.overlap``):
    its rows are those of the sequences running then, of which ``alive`` still run."""

    def __init__(self, result: Callable[[], GreedyStep], count: int) -> None:
        self.result, self.started = result, time.perf_counter()
        self.alive: np.ndarray | None = None  # positions in the step's rows; None: all of them
        self.count = count

    def keep(self, kept: np.ndarray) -> None:
        """The sequences at ``kept`` (a mask over those running) go on; the rest left."""
        alive = np.arange(self.count) if self.alive is None else self.alive
        self.alive = alive[kept]

    def wait(self) -> tuple[GreedyStep, float]:
        """The step's result for the sequences still running, and its seconds from start."""
        step = self.result()
        seconds = time.perf_counter() - self.started
        if self.alive is None:
            return step, seconds
        alive = self.alive
        logits = step.logits
        return GreedyStep(step.tokens[alive], step.best[alive], lambda: logits()[alive]), seconds


# the layout's per-sequence columns: ``RowState.fixed``'s, then its rows, its sink, greedy
ROWS_COLUMN = len(FIXED)
COLUMNS = ROWS_COLUMN + 3


class StepLayout:
    """Where the running sequences' rows lie in a step's batch, and what of their state a step
    reads but never changes. Kept in step with ``InFlightEngine.sequences`` as they change:
    joiners are appended (``extend``), leavers cut out (``keep``), in numpy; nothing is rebuilt
    over every running sequence (with requests joining and leaving at nearly every step, a
    rebuild cost a quarter of a 128-row step's bookkeeping)."""

    def __init__(self, state: RowState) -> None:
        self._state = state
        # per row, in step order: its cache row and its state slot
        self._per_row = np.zeros((2, 0), dtype=np.int64)
        # per sequence: its token limits (``RowState.fixed``: min_new, forced EOS, limit, route
        # key), then its rows, its sink (an index into ``_sinks``; -1: none, an event per
        # token) and whether it is greedy (1)
        self._per_sequence = np.zeros((COLUMNS, 0), dtype=np.int64)
        self._sinks: list[TokenSink] = []
        self._sink_index: dict[TokenSink, int] = {}
        # the clock time of the last step, when the first ``fresh`` sequences took a token then
        # and the others (joined since) none yet; None: the tokens' times are to be read
        self.stepped_at: float | None = None
        self.fresh = 0
        self._derive()
        self._stale = False  # sequences joined or left since ``_derive``

    def extend(self, joined: list[ActiveSequence]) -> None:
        """Append the sequences that joined (at the end of ``sequences``)."""
        count = len(joined)
        first = np.fromiter((seq.slot for seq in joined), np.int64, count)
        new = np.empty((COLUMNS, count), dtype=np.int64)
        new[: len(FIXED)] = self._state.fixed[:, first]
        new[ROWS_COLUMN:] = np.array(
            [
                [len(seq.rows) for seq in joined],
                [self._sink(seq.request.token_route) for seq in joined],
                [int(seq.greedy) for seq in joined],
            ],
            dtype=np.int64,
        )
        rows = np.array(
            [
                np.concatenate([seq.rows for seq in joined]),
                np.concatenate([seq.slots for seq in joined]),
            ]
        )
        self._per_row = np.concatenate((self._per_row, rows), axis=1)
        self._per_sequence = np.concatenate((self._per_sequence, new), axis=1)
        self._stale = True

    def keep(self, kept: np.ndarray) -> None:
        """Cut out the sequences that left: ``kept`` is a bool per sequence, in order."""
        per_sequence = self._per_sequence
        single = self._per_row.shape[1] == per_sequence.shape[1]
        rows_kept = kept if single else np.repeat(kept, per_sequence[ROWS_COLUMN])
        self._per_row = self._per_row[:, rows_kept]
        self._per_sequence = self._per_sequence[:, kept]
        self.fresh = int(np.count_nonzero(kept[: self.fresh]))
        self._stale = True

    def make_greedy(self, index: int) -> None:
        """The sequence at ``index`` (in ``sequences``) is greedy from now on (its target prefix
        has been fed)."""
        self._per_sequence[COLUMNS - 1, index] = 1
        self._stale = True

    def current(self) -> StepLayout:
        """This layout, what the step reads brought up to date with the joins and leaves since
        it last ran (once per step, however many there were)."""
        if self._stale:
            self._derive()
            self._stale = False
        return self

    def _sink(self, route: tuple[TokenSink, int] | None) -> int:
        if route is None:
            return -1
        index = self._sink_index.get(route[0])
        if index is None:
            index = self._sink_index[route[0]] = len(self._sinks)
            self._sinks.append(route[0])
        return index

    def _derive(self) -> None:
        """What the step reads, from the per-row and per-sequence arrays (views of them)."""
        self.rows, self.slots = self._per_row  # the rows in step order, and their state slots
        self.min_new, self.forced_eos_at, self.limit, self._keys = self._per_sequence[: len(FIXED)]
        self._counts, self._sink_of, greedy = self._per_sequence[ROWS_COLUMN:]
        self.single = len(self.rows) == len(self._counts)  # a row each: no beams
        self._offsets: list[int] | None = None
        # each sequence's first slot (its generated count, limits, route, tokens)
        self.first = self.slots if self.single else self.slots[self._starts()]
        self.greedy = bool(greedy.all())
        self.any_min_new = bool(self.min_new.any())
        # where the tokens go: per sink, the indices (in ``sequences``) of its requests (None:
        # all, in order) and their routes' keys; the requests without a route get an event per
        # token
        sink_of = self._sink_of
        order = np.argsort(sink_of, kind="stable")  # the unrouted (-1) first, then by sink
        per_sink = np.bincount(sink_of + 1, minlength=len(self._sinks) + 1)
        unrouted = int(per_sink[0])
        self.unrouted = order[:unrouted].tolist()
        if len(self._sinks) > np.count_nonzero(per_sink[1:]) + 8:  # forget the unused sinks
            used = np.flatnonzero(per_sink[1:])
            renumber = np.full(len(self._sinks) + 1, -1, dtype=np.int64)
            renumber[used + 1] = np.arange(len(used))
            self._sink_of[:] = renumber[sink_of + 1]  # in the per-sequence table
            self._sinks = [self._sinks[index] for index in used.tolist()]
            self._sink_index = {sink: index for index, sink in enumerate(self._sinks)}
            per_sink = np.concatenate(([unrouted], per_sink[1:][used]))
        self.sinks: list[tuple[TokenSink, np.ndarray | None, np.ndarray]] = []
        end = unrouted
        for index, rows in enumerate(per_sink[1:].tolist()):
            if not rows:
                continue
            if rows == len(sink_of):  # every request, in order: the step's own arrays
                self.sinks.append((self._sinks[index], None, self._keys))
                break
            picked = order[end : end + rows]
            end += rows
            self.sinks.append((self._sinks[index], picked, self._keys[picked]))

    def _starts(self) -> np.ndarray:
        return np.cumsum(self._counts) - self._counts

    @property
    def counts(self) -> list[int]:
        """Each sequence's rows."""
        return self._counts.tolist()

    @property
    def offsets(self) -> list[int]:
        """Each sequence's first row in the step, then the step's rows."""
        if self._offsets is None:
            self._offsets = [*self._starts().tolist(), len(self.rows)]
        return self._offsets
