"""Decode blocks: K greedy steps in one run of the ``decoder_block`` graph decode exactly what K
single greedy steps decode (picks, their logits, the caches they leave), at fixed addresses too,
and the engine's tokens with blocks equal its tokens without them: sequences ending within a
block (EOS, their token limit), EOS held back by ``min_new_tokens``, joins between blocks."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from contract.graphs import (
    DECODER_BLOCK,
    DECODER_BLOCK_FILE,
    DECODER_INPLACE,
    DECODER_INPLACE_FILE,
)
from contract.repository import read_model_config, resolve_version
from export.decoder_block import decoder_block_model
from serving.engine.inflight import InFlightEngine
from serving.engine.requests import FinishEvent, GenerationRequest, TokenEvent
from serving.generation.options import DecodingOptions
from serving.repository import make_backend
from serving.served.generator import inplace_cache, local_engine
from tests.serving.test_greedy_step import admitted, picking
from tests.serving.test_inplace_cache import decode_all

STEPS = 4
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def block_entry(shipped_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped translator with a decode block graph of ``STEPS`` steps."""
    entry = tmp_path_factory.mktemp("block") / "translator"
    shutil.copytree(shipped_repository / "translator", entry)
    version = resolve_version(entry)
    block = decoder_block_model(onnx.load(str(version / DECODER_INPLACE_FILE)), STEPS)
    onnx.save(block, str(version / DECODER_BLOCK_FILE))
    return entry


SOURCES = [[5, 17, 42, 8, 11], [99, 23], [61, 7, 30, 12, 3, 9], [40, 41, 42]]


@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "fixed"])
def test_a_block_picks_what_its_steps_one_by_one_pick(block_entry: Path, fixed: bool) -> None:
    """Two caches with the same rows (taken in a shuffled order): one runs two blocks, the other
    the same eight steps through ``step_greedy``, each fed its own last pick. The picks, their
    logits and the caches' keys and values are the same, bit for bit; EOS is banned where
    ``eos_after`` says, as ``no_eos`` bans it for a step."""
    config, runner, blocks = picking(block_entry, fixed, device_greedy=True)
    _, _, steps = picking(block_entry, fixed, device_greedy=True)
    assert blocks.block_steps == STEPS and blocks.decoder.block is not None
    assert (blocks.decoder.block.captured is not None) == fixed
    rows = admitted(runner, blocks, SOURCES)
    assert np.array_equal(rows, admitted(runner, steps, SOURCES))
    order = rows[[2, 0, 3, 1]]  # not the leading rows in order: inputs scattered, outputs gathered
    min_new = np.array([6, 0, 2, 9])
    start = np.full(len(order), config.decoder.decoder_start_id, dtype=np.int64)
    ids, step_ids = start.copy(), start.copy()
    for first in range(0, 2 * STEPS, STEPS):
        positions = np.full(len(order), first, dtype=np.int64)
        tokens, best = blocks.step_block(order, ids, positions, np.maximum(min_new - first, 0))
        for column in range(STEPS):
            at = positions + column
            step = steps.step_greedy(order, step_ids, at, at < min_new)
            assert np.array_equal(tokens[:, column], step.tokens)
            assert np.array_equal(best[:, column], step.best)
            step_ids = step.tokens.copy()
        ids = tokens[:, -1].copy()
    for name, buffer in blocks.decoder.past.items():
        theirs = steps.decoder.past[name]
        assert buffer.width == theirs.width
        assert np.array_equal(buffer.host()[rows], theirs.host()[rows]), name


def block_jobs() -> list[GenerationRequest]:
    """Greedy requests that end at every offset within a block: token limits 1-11, the
    shipped model's own EOS, and EOS held back for a while by ``min_new_tokens``."""
    rng = np.random.default_rng(5)
    jobs = []
    for i in range(16):
        most = 1 + i % 11 if i % 4 else 20
        # the model ends these after 2-8 tokens: 6 bans its EOS within a block for some
        options = DecodingOptions(max_new_tokens=most, min_new_tokens=min(6, most) * (i % 5 == 0))
        jobs.append(GenerationRequest(options=options, source_ids=rng.integers(4, 60, 2 + i % 6)))
    return jobs


@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "fixed"])
@pytest.mark.parametrize("together", [1, 4, 16])
def test_the_engine_decodes_the_same_tokens_in_blocks(
    block_entry: Path, fixed: bool, together: int
) -> None:
    """Requests joining one by one (each decodes alone between joins), four at a time, or all
    at once: every finish (tokens and reason) is the one of the engine without blocks, and
    blocks ran."""
    config, runner, cache = picking(block_entry, fixed, device_greedy=True)
    engines: list = []
    ours = decode_all(config, runner, cache, block_jobs(), together, engines, block=True)
    _, runner_b, single = picking(block_entry, fixed, device_greedy=True)
    theirs = decode_all(config, runner_b, single, block_jobs(), together)
    assert [(e.tokens, e.reason) for e in ours] == [(e.tokens, e.reason) for e in theirs]
    assert {e.reason for e in ours} == {"stop", "length"}
    assert engines[0].blocks > 0 and engines[0].steps >= engines[0].blocks * 2
    assert engines[0].blocks_cut == 0  # EOS held back in the graph, not by the host
    assert cache.rows == 0  # every row given back


def test_streams_get_every_token_once_in_order(block_entry: Path) -> None:
    """Tokens booked step by step from a block reach a stream in order, each once, and are the
    tokens its finish carries (three streams at once, one ending early)."""
    config, runner, cache = picking(block_entry, device_greedy=True)
    batching = dataclasses.replace(config.batching, max_active_sequences=8)
    engine = InFlightEngine("m", runner, config.decoder, 20, batching, cache=cache, block=True)
    requests = [
        GenerationRequest(options=DecodingOptions(max_new_tokens=n), source_ids=[7, 8 + n, 9])
        for n in (20, 5, 13)
    ]

    async def stream(request: GenerationRequest) -> list:
        return [event async for event in engine.generate(request)]

    async def go() -> list[list]:
        engine.start()
        try:
            return list(await asyncio.gather(*(stream(r) for r in requests)))
        finally:
            engine.stop()

    for events in asyncio.run(go()):
        *tokens, finish = events
        assert isinstance(finish, FinishEvent)
        assert all(isinstance(e, TokenEvent) for e in tokens)
        assert [e.index for e in tokens] == list(range(len(tokens)))
        assert [e.token_id for e in tokens] == finish.tokens
    assert engine.blocks > 0


def test_a_nan_pick_stops_the_block_and_the_step_runs_alone(block_entry: Path) -> None:
    """A block whose pick is NaN at its second step (its logits held one): the engine keeps the
    first step's tokens, runs the second again as a single step (whose sampler decides), and
    decodes on."""
    config, runner, cache = picking(block_entry, device_greedy=True)
    run_block = cache.step_block
    poisoned: list[int] = []

    def nan_once(rows, ids, positions, eos_after):
        tokens, best = run_block(rows, ids, positions, eos_after)
        if not poisoned:
            poisoned.append(int(positions[0]))
            best = best.copy()
            best[0, 1] = np.nan
        return tokens, best

    cache.step_block = nan_once  # type: ignore[method-assign]
    engines: list = []
    twelve = DecodingOptions(max_new_tokens=12, min_new_tokens=12)
    job = [GenerationRequest(options=twelve, source_ids=[7, 8, 9])]
    (ours,) = decode_all(config, runner, cache, job, 1, engines, block=True)
    _, runner_b, single = picking(block_entry, device_greedy=True)
    (theirs,) = decode_all(config, runner_b, single, job, 1)
    assert ours.tokens == theirs.tokens and ours.reason == theirs.reason
    assert poisoned and engines[0].blocks >= 2 and engines[0].blocks_cut == 1


ARRIVALS = [0, 1, 2, 3, 6, 7, 8]  # the engine's step count at which each request arrives


def drive_joins(block_entry: Path, interval: int, block: bool) -> tuple[list, int, list]:
    """A long request, then short ones arriving at the steps ``ARRIVALS`` names (one submitted
    before the first iteration that starts at or after its step); the engine's loop driven
    iteration by iteration with ``join_interval_steps`` = ``interval``. Returns (the step at
    which requests joined, the blocks run before) for each join, the blocks run in all and
    every request's finish."""
    config, runner, cache = picking(block_entry, device_greedy=True)
    batching = dataclasses.replace(
        config.batching, max_active_sequences=8, join_interval_steps=interval
    )
    engine = InFlightEngine("m", runner, config.decoder, 20, batching, cache=cache, block=block)
    finishes: dict[int, FinishEvent] = {}

    def submit(key: int) -> None:
        most = 18 if key == 0 else 6
        options = DecodingOptions(max_new_tokens=most, min_new_tokens=most)
        request = GenerationRequest(options=options, source_ids=[7 + key, 8, 9 + 2 * key])

        def listen(chunk: list, key: int = key) -> None:
            for event in chunk:
                if isinstance(event, FinishEvent):
                    finishes[key] = event

        engine.submit(request, listen)

    async def go() -> list:
        joins: list[tuple[int, int]] = []
        submitted = 0
        for _ in range(60):
            while submitted < len(ARRIVALS) and ARRIVALS[submitted] <= engine.steps:
                submit(submitted)
                submitted += 1
            waiting, steps, blocks = len(engine.queue), engine.steps, engine.blocks
            engine._iterate()
            engine._outbox.flush()
            if len(engine.queue) < waiting:
                joins.append((steps, blocks))
            await asyncio.sleep(0)  # the events reach their listeners
            if len(finishes) == len(ARRIVALS):
                break
        await asyncio.sleep(0)
        return joins

    joins = asyncio.run(go())
    return joins, engine.blocks, [finishes[key] for key in sorted(finishes)]


def test_blocks_run_while_waiting_requests_wait_for_their_join_interval(
    block_entry: Path,
) -> None:
    """With ``join_interval_steps`` above the block's steps, waiting requests do not stop
    blocks that end before their join is due: they join at the same steps as without blocks
    (none held back), blocks run in between, and every request decodes the same tokens. With
    an interval of 1 (the default) a waiting request stops a block."""
    joins, blocks, ours = drive_joins(block_entry, STEPS + 1, block=True)
    single_joins, no_blocks, theirs = drive_joins(block_entry, STEPS + 1, block=False)
    # a block between two joins each time, and the joins at the steps they take without blocks
    assert joins == [(0, 0), (STEPS + 1, 1), (2 * (STEPS + 1), 2)]
    assert single_joins == [(0, 0), (STEPS + 1, 0), (2 * (STEPS + 1), 0)] and no_blocks == 0
    assert blocks > 2
    assert len(ours) == len(ARRIVALS) and [(e.tokens, e.reason) for e in ours] == [
        (e.tokens, e.reason) for e in theirs
    ]
    # every step: the first four join one by one, a block runs once none waits (steps 4-7),
    # the next three wait for its end
    every_step = drive_joins(block_entry, 1, block=True)[0]
    assert every_step == [(0, 0), (1, 0), (2, 0), (3, 0), (8, 1)]


@pytest.mark.parametrize("name", ["float", "kv8"])
def test_int8_entries_decode_the_same_tokens_in_blocks(
    int8_repository: Path, tmp_path: Path, name: str
) -> None:
    """The int8 exports (their nodes partly unnamed, from the quantiser and the attention
    rewrites), with a float and an int8 KV cache (its scales four more buffers per layer)."""
    entry = tmp_path / name
    shutil.copytree(int8_repository / name, entry)
    version = resolve_version(entry)
    block = decoder_block_model(onnx.load(str(version / DECODER_INPLACE_FILE)), STEPS)
    onnx.save(block, str(version / DECODER_BLOCK_FILE))
    config, runner, cache = picking(entry, device_greedy=True)
    assert cache.block_steps == STEPS
    engines: list = []
    ours = decode_all(config, runner, cache, block_jobs(), 4, engines, block=True)
    _, runner_b, single = picking(entry, device_greedy=True)
    theirs = decode_all(config, runner_b, single, block_jobs(), 4)
    assert [(e.tokens, e.reason) for e in ours] == [(e.tokens, e.reason) for e in theirs]
    assert engines[0].blocks > 0


def test_a_block_that_will_not_load_leaves_the_in_place_decoder_running(
    block_entry: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = tmp_path / "translator"
    shutil.copytree(block_entry, entry)
    (resolve_version(entry) / DECODER_BLOCK_FILE).write_bytes(b"not a graph")
    config = read_model_config(entry)
    on = dataclasses.replace(
        config, batching=dataclasses.replace(config.batching, decode_block=True)
    )
    backend = make_backend(on, resolve_version(entry))
    assert DECODER_BLOCK not in backend.graphs() and DECODER_INPLACE in backend.graphs()
    assert "cannot load the decode block" in caplog.text
    cache = inplace_cache(backend, on)
    assert cache is not None and cache.block_steps == 0


def with_block_setting(config, setting: bool | None, providers: tuple[str, ...] | None = None):
    """``config`` with ``batching.decode_block`` set to ``setting`` (and its providers)."""
    runtime = config.onnxruntime
    if providers is not None:
        runtime = dataclasses.replace(runtime, execution_providers=providers)
    batching = dataclasses.replace(config.batching, decode_block=setting)
    return dataclasses.replace(config, batching=batching, onnxruntime=runtime)


def test_the_server_decodes_in_blocks_by_default_on_the_cpu_only(block_entry: Path) -> None:
    """Unset (auto): the block is loaded and run where the sessions are on the CPU, not where
    CUDA comes first; false: never (a session of its own: not even loaded); true: anywhere."""
    config = read_model_config(block_entry)
    assert config.batching.decode_block is None
    version = resolve_version(block_entry)
    cuda = ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert config.decodes_in_blocks and not with_block_setting(config, None, cuda).decodes_in_blocks
    assert with_block_setting(config, True, cuda).decodes_in_blocks
    for setting, loaded in ((None, True), (False, False), (True, True)):
        chosen = with_block_setting(config, setting)
        backend = make_backend(chosen, version)
        assert (DECODER_BLOCK in backend.graphs()) == loaded
        cache = inplace_cache(backend, chosen)
        assert cache is not None and cache.block_steps == (STEPS if loaded else 0)
        engine = local_engine(chosen, backend, None)
        assert (engine._block is not None) == loaded


@pytest.mark.skipif(not HAS_CUDA, reason="a block on a device needs onnxruntime-gpu and a GPU")
@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "cuda-graphs"])
def test_on_cuda_blocks_decode_the_tokens_of_single_steps(block_entry: Path, fixed: bool) -> None:
    cuda = ("CUDAExecutionProvider",)
    config, runner, cache = picking(block_entry, fixed, device_greedy=None, providers=cuda)
    assert cache.decoder.device.kind == "cuda" and cache.block_steps == STEPS
    engines: list = []
    ours = decode_all(config, runner, cache, block_jobs(), 4, engines, block=True)
    _, runner_b, single = picking(block_entry, fixed, device_greedy=None, providers=cuda)
    theirs = decode_all(config, runner_b, single, block_jobs(), 4)
    assert [(e.tokens, e.reason) for e in ours] == [(e.tokens, e.reason) for e in theirs]
    assert engines[0].blocks > 0
