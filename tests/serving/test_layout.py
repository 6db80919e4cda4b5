"""The decode loop's batch layout is kept up to date as sequences join and leave (appended, cut
out) instead of being rebuilt over every running sequence: it must always equal the layout built
from the running sequences as they are, and the token times it lets the loop skip reading must
give the same metrics as reading them."""

# ruff: noqa: F811 (the fixtures imported from test_engine are parameters here)
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serving.engine.requests import GenerationRequest
from serving.engine.row_state import RowState
from serving.engine.step_layout import StepLayout
from serving.generation.options import DecodingOptions
from serving.metrics import ServingMetrics
from tests.serving.test_dead_requests import Clock, drive
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    make_engine,
    runner_and_config,
    source,
    translator_backend,
)


class _Sink:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


SINKS = [_Sink(f"sink {i}") for i in range(12)]

# one joiner: rows (beams), greedy, its sink (None: unrouted) and min_new_tokens
joiner = st.tuples(
    st.integers(1, 3),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from(SINKS)),
    st.integers(0, 2),
)
operation = st.one_of(
    st.tuples(st.just("join"), st.lists(joiner, min_size=1, max_size=4)),
    st.tuples(st.just("leave"), st.lists(st.booleans(), min_size=1, max_size=12)),
    st.tuples(st.just("step"), st.none()),
)


class _Model:
    """Running sequences as the engine keeps them, with the layout built from scratch."""

    def __init__(self) -> None:
        self.state = RowState(64, 8)
        self.sequences: list[Any] = []
        self.stepped: list[bool] = []  # each took a token at the layout's last step
        self.next_row = 0

    def join(self, joiners: list[tuple[int, bool, Any, int]]) -> list[Any]:
        joined = []
        keys = []
        for count, greedy, sink, _ in joiners:
            rows = np.arange(self.next_row, self.next_row + count)
            self.next_row += count
            route = None if sink is None else (sink, 1000 + self.next_row)
            keys.append(-1 if route is None else route[1])
            seq = SimpleNamespace(
                rows=rows, greedy=greedy, request=SimpleNamespace(token_route=route)
            )
            joined.append(seq)
        slots = self.state.take(
            [c for c, *_ in joiners],
            0,
            [m for *_, m in joiners],
            [3 * len(s.rows) for s in joined],
            [5 + len(s.rows) for s in joined],
            keys,
        )
        for seq, seq_slots in zip(joined, slots, strict=True):
            seq.slots, seq.slot = seq_slots, int(seq_slots[0])
        self.sequences += joined
        self.stepped += [False] * len(joined)
        return joined

    def leave(self, kept: np.ndarray) -> None:
        for seq, keep in zip(self.sequences, kept, strict=True):
            if not keep:
                self.state.give_back(seq.slots)
        self.sequences = [s for s, k in zip(self.sequences, kept, strict=True) if k]
        self.stepped = [s for s, k in zip(self.stepped, kept, strict=True) if k]

    def expected(self) -> dict[str, Any]:
        seqs = self.sequences
        firsts = [int(s.slots[0]) for s in seqs]
        sinks: dict[Any, list[int]] = {}
        for index, seq in enumerate(seqs):
            if seq.request.token_route is not None:
                sinks.setdefault(seq.request.token_route[0], []).append(index)
        return {
            "rows": [int(r) for s in seqs for r in s.rows],
            "slots": [int(r) for s in seqs for r in s.slots],
            "counts": [len(s.rows) for s in seqs],
            "offsets": list(np.cumsum([0] + [len(s.rows) for s in seqs]).tolist()),
            "single": all(len(s.rows) == 1 for s in seqs),
            "first": firsts,
            "greedy": all(s.greedy for s in seqs),
            "min_new": self.state.min_new[firsts].tolist(),
            "any_min_new": bool(self.state.min_new[firsts].any()),
            "forced_eos_at": self.state.forced_eos_at[firsts].tolist(),
            "limit": self.state.limit[firsts].tolist(),
            "unrouted": [i for i, s in enumerate(seqs) if s.request.token_route is None],
            "sinks": {
                sink: (indices, [seqs[i].request.token_route[1] for i in indices])
                for sink, indices in sinks.items()
            },
            "fresh": self.stepped.index(False) if False in self.stepped else len(self.stepped),
        }


def _actual(layout: StepLayout, count: int) -> dict[str, Any]:
    layout = layout.current()
    return {
        "rows": layout.rows.tolist(),
        "slots": layout.slots.tolist(),
        "counts": layout.counts,
        "offsets": list(layout.offsets),
        "single": layout.single,
        "first": layout.first.tolist(),
        "greedy": layout.greedy,
        "min_new": layout.min_new.tolist(),
        "any_min_new": layout.any_min_new,
        "forced_eos_at": layout.forced_eos_at.tolist(),
        "limit": layout.limit.tolist(),
        "unrouted": layout.unrouted,
        "sinks": {
            sink: (list(range(count)) if indices is None else indices.tolist(), keys.tolist())
            for sink, indices, keys in layout.sinks
        },
        "fresh": layout.fresh if layout.stepped_at is not None else 0,
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=14))
def test_layout_kept_equals_layout_built(operations) -> None:
    model = _Model()
    layout = StepLayout(model.state)
    for kind, argument in operations:
        if kind == "join" and model.next_row + 12 <= 64:
            layout.extend(model.join(argument))
        elif kind == "leave" and model.sequences:
            kept = np.resize(np.asarray(argument, dtype=bool), len(model.sequences))
            model.leave(kept)
            layout.keep(kept)
        elif kind == "step":  # as the all-greedy step records it: every sequence took a token
            layout.stepped_at, layout.fresh = 1.0, len(model.sequences)
            model.stepped = [True] * len(model.sequences)
        if kind != "step" and layout.stepped_at is None:
            model.stepped = [False] * len(model.sequences)
        assert _actual(layout, len(model.sequences)) == model.expected()
        # the sinks no sequence uses are forgotten (bounded, whatever comes and goes)
        assert len(layout._sinks) <= len(layout.sinks) + 9


def test_sinks_no_sequence_uses_are_forgotten() -> None:
    """Frontends come and go: the layout forgets their sinks once more than 8 are unused, and
    routes the remaining sequences as before."""
    model = _Model()
    layout = StepLayout(model.state)
    for sink in SINKS:  # each sink's one request joins, and the one before it leaves
        layout.extend(model.join([(1, True, sink, 0)]))
        kept = np.ones(len(model.sequences), dtype=bool)
        kept[:-1] = False
        model.leave(kept)
        layout.keep(kept)
        assert _actual(layout, len(model.sequences)) == model.expected()
        assert len(layout._sinks) <= 1 + 8
    layout.extend(model.join([(1, True, SINKS[0], 0), (2, False, None, 1)]))
    assert _actual(layout, len(model.sequences)) == model.expected()


def _value(metrics: ServingMetrics, name: str) -> float:
    text = metrics.render().decode()
    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("model") == "translator"
    )


def test_token_times_exact_through_joins_leaves_and_a_sampled_request(runner_and_config) -> None:
    """The clock moves 1.0 per iteration: every time per output token is exactly 1.0 and each
    time to first token is the time of the iteration the request joined in, while requests join
    and leave at different steps and a sampled request turns the batch from all-greedy (token
    times taken from the layout's last step) to per-sequence steps and back."""
    plan = {  # iteration -> requests submitted before it: (tokens, sampled)
        0: [(6, False), (9, False), (12, False), (4, False), (7, False)],
        2: [(5, False)],
        3: [(4, True)],
        5: [(8, False), (3, False)],
        9: [(6, False)],
    }

    async def go() -> tuple[float, ...]:
        clock = Clock()
        metrics = ServingMetrics()
        engine = make_engine(runner_and_config, max_active_sequences=8, max_batch_size=8)
        engine.clock = engine.queue.clock = clock
        engine.metrics = metrics
        finished: list[int] = []
        for iteration in range(30):
            clock.now = float(iteration)
            for key, (tokens, sampled) in enumerate(plan.get(iteration, [])):
                options = DecodingOptions(
                    max_new_tokens=tokens,
                    min_new_tokens=tokens,
                    temperature=0.7 if sampled else 0.0,
                    seed=3,
                )
                request = GenerationRequest(
                    options=options, source_ids=source(iteration + key), arrival=0.0
                )
                engine.submit(
                    request, lambda chunk: finished.extend(1 for e in chunk if hasattr(e, "reason"))
                )
            await drive(engine, 1)
        assert not engine.sequences
        return (
            _value(metrics, "attnserve_time_to_first_token_seconds_count"),
            _value(metrics, "attnserve_time_to_first_token_seconds_sum"),
            _value(metrics, "attnserve_time_per_output_token_seconds_count"),
            _value(metrics, "attnserve_time_per_output_token_seconds_sum"),
            float(len(finished)),
        )

    requests = [(i, t) for i, batch in plan.items() for t, _ in batch]
    tokens = sum(t for _, t in requests)
    first_sum = float(sum(i for i, _ in requests))
    gaps = float(tokens - len(requests))
    assert asyncio.run(go()) == (len(requests), first_sum, gaps, gaps, len(requests))
