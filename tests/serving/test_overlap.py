"""Steps started ahead (``InFlightEngine.overlap``): a greedy step's successor starts on a thread
of its own before the step's bookkeeping. The same tokens as without; cancellations and failures
while such a step runs; the in-place cache's rules while it is busy. On the CPU the engine does
not overlap by default; these tests turn it on (the real graphs, in ONNX Runtime)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from contract.graphs import graph_files
from contract.repository import resolve_version
from serving.backends.base import BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.engine.inflight import InFlightEngine
from serving.engine.requests import ErrorEvent, Event, FinishEvent, GenerationRequest, TokenEvent
from serving.errors import Cancelled, Internal
from serving.generation.options import DecodingOptions
from serving.seq2seq import Seq2SeqRunner
from serving.served.generator import local_engine
from tests.serving.test_engine import (  # noqa: F401 (fixtures)
    inplace_cache,
    source,
    translator_backend,
)

ROWS = 6
# greedy requests of many lengths (joins and leaves at most steps), a sampled and a beam request
# among them (the batch then leaves the all-greedy path and comes back to it)
OPTIONS = [
    DecodingOptions(max_new_tokens=1 + (7 * k) % 20, min_new_tokens=(3 * k) % 5) for k in range(18)
]
OPTIONS[5] = DecodingOptions(max_new_tokens=11, temperature=0.7, top_k=20, seed=3)
OPTIONS[9] = DecodingOptions(max_new_tokens=8, beam_size=2)


def _engine(translator_backend, overlap: bool) -> InFlightEngine:  # noqa: F811
    backend, config = translator_backend
    settings = dataclasses.replace(config.batching, max_active_sequences=ROWS)
    return InFlightEngine(
        "translator",
        Seq2SeqRunner(backend, config.decoder),
        config.decoder,
        20,
        settings,
        cache=inplace_cache(backend, config, ROWS),
        overlap=overlap,
    )


def _request(key: int, options: DecodingOptions | None = None) -> GenerationRequest:
    options = options or OPTIONS[key % len(OPTIONS)]
    return GenerationRequest(options=options, source_ids=source(key))


LONG = DecodingOptions(max_new_tokens=20)


async def _run(
    engine: InFlightEngine, requests: list[GenerationRequest], spread: bool = True
) -> list[list[Event]]:
    async def one(index: int, request: GenerationRequest) -> list[Event]:
        await asyncio.sleep(0.002 * (index % 5) * spread)  # joins spread over the first steps
        return [event async for event in engine.generate(request)]

    return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))


def _outcome(events: list[Event]) -> Any:
    last = events[-1]
    if isinstance(last, ErrorEvent):
        return type(last.error)
    assert isinstance(last, FinishEvent)
    streamed = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert streamed == last.tokens  # every token streamed, in order, before the finish
    return (tuple(last.tokens), last.reason)


def _served(engine: InFlightEngine, requests: list[GenerationRequest]) -> list[Any]:
    engine.start()
    try:
        return [_outcome(events) for events in asyncio.run(_run(engine, requests))]
    finally:
        engine.stop()


def _reference(translator_backend, keys: range, options=None) -> list[Any]:  # noqa: F811
    requests = [_request(k, options) for k in keys]
    return _served(_engine(translator_backend, overlap=False), requests)


def test_steps_started_ahead_give_the_same_tokens(translator_backend) -> None:  # noqa: F811
    keys = range(40)  # more requests than rows: rows are freed and taken again
    engine = _engine(translator_backend, overlap=True)
    got = _served(engine, [_request(k) for k in keys])
    assert engine.steps_ahead > 20  # most steps started ahead
    assert got == _reference(translator_backend, keys)
    assert engine.active_rows == 0 and not engine.cache.busy  # type: ignore[attr-defined]
    assert engine.cache.rows == 0 and engine.cache.tokens == 0


def test_cancels_while_a_step_runs_ahead(translator_backend) -> None:  # noqa: F811
    """A request cancelled while the step started ahead for it runs: it ends Cancelled, the
    others' tokens are those of a run without it, and every row is free at the end."""
    engine = _engine(translator_backend, overlap=True)
    decoder = engine.cache.decoder  # type: ignore[attr-defined]
    requests = [_request(k, LONG) for k in range(8)]
    victims = [requests[1], requests[6]]  # one running, one waiting for a row at step 3
    real_step, calls = decoder.step, []

    def step(*inputs: Any) -> np.ndarray:
        if threading.current_thread().name.startswith("step-"):
            calls.append(1)
            if len(calls) == 3:
                for victim in victims:
                    victim.cancel()
        return real_step(*inputs)

    decoder.step = step
    got = _served(engine, requests)
    assert got[1] is Cancelled and got[6] is Cancelled
    expected = _reference(translator_backend, range(8), LONG)
    assert [g for i, g in enumerate(got) if i not in (1, 6)] == [
        e for i, e in enumerate(expected) if i not in (1, 6)
    ]
    assert engine.active_rows == 0 and engine.cache.rows == 0
    assert not engine.cache.busy  # type: ignore[attr-defined]


def test_a_failing_step_ahead_fails_its_batch_only(translator_backend) -> None:  # noqa: F811
    """The second step run ahead with all four requests decoding (submitted together) fails:
    all four get the error (counting steps from the first request's join instead, a fast CI run
    failed a step before the others had joined), and the engine serves the next requests."""
    engine = _engine(translator_backend, overlap=True)
    decoder = engine.cache.decoder  # type: ignore[attr-defined]
    real_step, calls = decoder.step, []

    def step(*inputs: Any) -> np.ndarray:
        if threading.current_thread().name.startswith("step-") and engine.active_rows == 4:
            calls.append(1)
            if len(calls) == 2:
                raise BackendError("decoder_inplace graph failed: injected")
        return real_step(*inputs)

    decoder.step = step
    engine.start()
    try:
        first = asyncio.run(_run(engine, [_request(k, LONG) for k in (0, 2, 3, 4)], spread=False))
        later = asyncio.run(_run(engine, [_request(k, LONG) for k in (0, 2)]))
    finally:
        engine.stop()
    assert [_outcome(events) for events in first] == [Internal] * 4
    assert "injected" in str(first[0][-1].error)  # type: ignore[union-attr]
    expected = _reference(translator_backend, range(0, 3, 2), LONG)
    assert [_outcome(events) for events in later] == expected
    assert engine.active_rows == 0 and not engine.cache.busy  # type: ignore[attr-defined]


def test_the_cache_while_a_step_runs(translator_backend) -> None:  # noqa: F811
    """While a started step runs the cache admits nothing; rows released meanwhile keep the
    widths the step was bound with until it is over, then the widths fit the rows left."""
    backend, config = translator_backend
    runner = Seq2SeqRunner(backend, config.decoder)
    cache = inplace_cache(backend, config, ROWS)
    ids = np.zeros((2, 20), dtype=np.int64)
    ids[0], ids[1, :2] = np.arange(8, 28), [8, 9]  # sources of 20 and 2 tokens
    encoded = runner.encode({"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)})
    long_row, short_row = cache.admit(encoded, [1, 1])
    rows = np.concatenate([long_row, short_row])
    for position in range(5):  # both rows 5 tokens: the past cache widens to 8
        cache.step_greedy(rows, np.full(2, 20, np.int64), np.full(2, position, np.int64))
    assert (cache.decoder.past_width, cache.decoder.source_width) == (8, 32)
    with ThreadPoolExecutor(1) as executor:
        result = cache.start_greedy(short_row, np.array([21]), np.array([5]), None, executor)
        assert cache.busy
        with pytest.raises(RuntimeError, match="still running"):
            cache.admit(encoded, [1, 1])
        cache.release(long_row)  # the step still reads the wide layout
        assert (cache.decoder.past_width, cache.decoder.source_width) == (8, 32)
        step = result()
    assert not cache.busy and step.tokens.shape == (1,)
    assert cache.decoder.source_width == 8  # the short source alone is left: the narrowest
    assert cache.lengths[short_row].tolist() == [6]


def test_the_model_config_turns_it_on(translator_backend, tiny_repository, caplog) -> None:  # noqa: F811
    """``batching.overlap_steps`` reaches the served engine; without the in-place cache's graphs
    it is left off with a warning that says why."""
    backend, config = translator_backend
    on = dataclasses.replace(
        config, batching=dataclasses.replace(config.batching, overlap_steps=True)
    )
    assert local_engine(on, backend, None).overlap
    assert not local_engine(config, backend, None).overlap  # off by default
    version = resolve_version(tiny_repository / "translator")
    growing = OnnxRuntimeBackend(version, graph_files("seq2seq"))  # no in-place graphs
    with caplog.at_level(logging.WARNING):
        engine = local_engine(on, growing, None)
    assert not engine.overlap and "overlap_steps needs the in-place KV cache" in caplog.text
    with pytest.raises(ValueError, match="overlap needs"):
        InFlightEngine(
            "t",
            Seq2SeqRunner(growing, config.decoder),
            config.decoder,
            20,
            config.batching,
            overlap=True,
        )
