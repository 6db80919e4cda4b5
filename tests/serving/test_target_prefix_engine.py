"""Target prefixes in the in-flight engine, on every decode path: a greedy request whose prefix is
the first tokens of its own output (decoded without one) decodes exactly that output again, with
the same finish reason, whatever the cache (growing, in place), decode blocks, steps started
ahead, and requests with and without prefixes joining at once. A sampled and a beam request
start with their prefix; the prefix's tokens are streamed in order like the others."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engine.inflight import InFlightEngine
from serving.engine.requests import FinishEvent, GenerationRequest, TokenEvent
from serving.generation.options import DecodingOptions
from tests.serving.test_decode_block import block_entry  # noqa: F401 (fixture)
from tests.serving.test_greedy_step import picking
from tests.serving.test_inplace_cache import decode_all, load

JOBS = 16


def _jobs() -> list[tuple[np.ndarray, DecodingOptions]]:
    """Greedy requests of many limits; every third holds EOS back to its last token
    (``min_new_tokens``)."""
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(JOBS):
        most = 4 + i % 13
        options = DecodingOptions(max_new_tokens=most, min_new_tokens=most * (i % 3 == 0))
        jobs.append((rng.integers(8, 150, 2 + i % 6).astype(np.int64), options))
    return jobs


def _plain() -> list[GenerationRequest]:
    return [GenerationRequest(options=o, source_ids=ids) for ids, o in _jobs()]


def _prefixed(reference: list[FinishEvent]) -> list[GenerationRequest]:
    """Each job again, its prefix the first half (at least one) of its reference tokens, its
    limits shortened by as many: every other job keeps no prefix, so both kinds share steps."""
    requests = []
    for index, ((ids, options), finish) in enumerate(zip(_jobs(), reference, strict=True)):
        take = max(1, len(finish.tokens) // 2) if index % 2 == 0 else 0
        take = min(take, len(finish.tokens), options.max_new_tokens - 1)  # type: ignore[operator]
        shorter = dataclasses.replace(
            options,
            max_new_tokens=options.max_new_tokens - take,  # type: ignore[operator]
            min_new_tokens=max(0, options.min_new_tokens - take),
        )
        prefix = tuple(finish.tokens[:take])
        requests.append(GenerationRequest(options=shorter, source_ids=ids, prefix=prefix))
    return requests


def _same(ours: list[FinishEvent], theirs: list[FinishEvent]) -> None:
    assert [(e.tokens, e.reason) for e in ours] == [(e.tokens, e.reason) for e in theirs]


@pytest.mark.parametrize("together", [1, 8])
@pytest.mark.parametrize("kind", ["growing", "inplace"])
def test_a_prefix_of_its_own_output_decodes_that_output(
    tiny_repository: Path, kind: str, together: int
) -> None:
    config, runner, cache = load(tiny_repository / "translator")
    cache = cache if kind == "inplace" else None
    reference = decode_all(config, runner, cache, _plain(), together)
    assert any(len(e.tokens) > 2 for e in reference)
    _, runner, cache = load(tiny_repository / "translator")
    cache = cache if kind == "inplace" else None
    _same(decode_all(config, runner, cache, _prefixed(reference), together), reference)


def test_with_decode_blocks_and_steps_started_ahead(block_entry: Path) -> None:  # noqa: F811
    """A prefixed sequence takes single steps until its prefix is fed, then joins the greedy
    paths: decode blocks (which then run) and steps started ahead."""
    config, runner, cache = picking(block_entry, device_greedy=True)
    reference = decode_all(config, runner, cache, _plain(), 8)
    for options in ({"block": True}, {"overlap": True}):
        engines: list[Any] = []
        config, runner, cache = picking(block_entry, device_greedy=True)
        prefixed = _prefixed(reference)
        _same(decode_all(config, runner, cache, prefixed, 8, engines, **options), reference)
        if "block" in options:
            assert engines[0].blocks > 0
        assert cache.rows == 0  # every row given back


def test_sampling_and_beams_start_with_the_prefix_and_stream_it(tiny_repository: Path) -> None:
    config, runner, cache = load(tiny_repository / "translator")
    prefix = (31, 47, 5)
    ids = np.array([9, 40, 77, 12], dtype=np.int64)
    sampled = [
        DecodingOptions(max_new_tokens=6, temperature=1.5, seed=seed, return_log_probs=True)
        for seed in range(4)
    ]
    requests = [GenerationRequest(options=o, source_ids=ids, prefix=prefix) for o in sampled]
    beams = DecodingOptions(max_new_tokens=6, beam_size=3, num_alternatives=2)
    requests.append(GenerationRequest(options=beams, source_ids=ids, prefix=prefix))
    finishes = decode_all(config, runner, cache, requests, 5)
    for finish in finishes:
        assert tuple(finish.tokens[:3]) == prefix and len(finish.tokens) <= 3 + 6
        assert all(tuple(tokens[:3]) == prefix for tokens, _, _ in finish.alternatives)
    for finish in finishes[:4]:
        assert finish.log_probs is not None and finish.log_probs[:3] == [0.0, 0.0, 0.0]
        assert finish.score == pytest.approx(sum(finish.log_probs) + _eos(finish))
    assert len({tuple(f.tokens) for f in finishes[:4]}) > 1  # the draws differ after the prefix


def _eos(finish: FinishEvent) -> float:
    """What the score adds for EOS: the score less the tokens' sum (0 without EOS)."""
    assert finish.log_probs is not None and finish.score is not None
    return finish.score - sum(finish.log_probs) if finish.reason == "stop" else 0.0


def test_a_stream_gets_the_prefix_first(tiny_repository: Path) -> None:
    config, runner, cache = load(tiny_repository / "translator")
    batching = dataclasses.replace(config.batching, max_active_sequences=8)
    engine = InFlightEngine("m", runner, config.decoder, 20, batching, cache=cache)
    prefix = (31, 47, 5, 60)
    request = GenerationRequest(
        options=DecodingOptions(max_new_tokens=5), source_ids=np.array([9, 40]), prefix=prefix
    )

    async def go() -> list:
        engine.start()
        try:
            return [event async for event in engine.generate(request)]
        finally:
            engine.stop()

    *tokens, finish = asyncio.run(go())
    assert isinstance(finish, FinishEvent)
    assert all(isinstance(e, TokenEvent) for e in tokens)
    assert [e.index for e in tokens] == list(range(len(tokens)))
    assert [e.token_id for e in tokens] == finish.tokens
    assert tuple(finish.tokens[:4]) == prefix and len(finish.tokens) <= 4 + 5
