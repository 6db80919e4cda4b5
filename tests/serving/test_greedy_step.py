"""Greedy steps through the ``greedy_pick`` graph: the argmax of the same step's logits, rows in
any order, at fixed addresses too, and the engine's tokens unchanged. On the CPU the server
takes the argmax on the host; these tests make the decoder pick as it does on a device."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from contract.graphs import (
    GREEDY_PICK,
    INPLACE_GRAPH_FILES,
    OPTIONAL_INPLACE_GRAPH_FILES,
    graph_files,
)
from contract.repository import read_model_config, resolve_version
from serving.backends.base import BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.onnxruntime_io import InPlaceDecoder
from serving.engine.decode_cache import GreedyStep
from serving.engine.inplace_cache import InPlaceKVCache
from serving.engine.requests import GenerationRequest
from serving.engine.slots import power_of_two_buckets
from serving.generation.options import DecodingOptions
from serving.repository import make_backend
from serving.seq2seq import Seq2SeqRunner
from serving.served.generator import inplace_cache
from tests.serving.test_inplace_cache import decode_all

ROWS = 8


HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def picking(
    entry: Path,
    fixed: bool = False,
    device_greedy: bool | None = True,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    rows: int = ROWS,
):
    """The translator's runner and an in-place cache that picks greedy tokens with the graph
    (``fixed``: at fixed addresses and batch buckets, as under CUDA graphs), with the entry's
    decode block graph where it has one."""
    config = read_model_config(entry)
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES, **OPTIONAL_INPLACE_GRAPH_FILES}
    version = resolve_version(entry)
    files = {graph: file for graph, file in files.items() if (version / file).is_file()}
    options = dataclasses.replace(
        config.onnxruntime, execution_providers=providers, cuda_graph=fixed
    )
    backend = OnnxRuntimeBackend(version, files, options)
    sessions = {graph: backend.session(graph) for graph in files if graph in backend.graphs()}
    decoder = InPlaceDecoder(
        sessions,
        config.decoder,
        rows,
        20,
        config.limits.max_source_length,
        fixed_bindings=fixed,
        device_greedy=device_greedy,
    )
    cache = InPlaceKVCache(
        decoder, config.decoder.pad_id, power_of_two_buckets(rows) if fixed else ()
    )
    cache.pick_min_logits = 0  # every greedy step picks with the graph
    return config, Seq2SeqRunner(backend, config.decoder), cache


def admitted(runner, cache, sources: list[list[int]]) -> np.ndarray:
    """Rows of ``sources`` admitted into ``cache`` (encoded by the real encoder)."""
    width = max(map(len, sources))
    ids = np.zeros((len(sources), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(sources):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    encoded = runner.encode({"input_ids": ids, "attention_mask": mask})
    return np.concatenate(cache.admit(encoded, [1] * len(sources)))


SOURCES = [[5, 17, 42, 8], [99, 23], [61, 7, 30, 12, 3], [40, 41, 42]]


@pytest.mark.parametrize("on_device", [True, False], ids=["graph", "host"])
@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "fixed"])
def test_a_greedy_step_is_the_argmax_of_the_same_steps_logits(
    tiny_repository: Path, fixed: bool, on_device: bool
) -> None:
    """Two caches decode the same rows in a shuffled order, one through ``step``, one through
    ``step_greedy`` (the ``greedy_pick`` graph, or the host's argmax over the step's batch as
    on a CPU); the pick is numpy's argmax and maximum of the same logits."""
    config, runner, greedy_cache = picking(tiny_repository / "translator", fixed, on_device)
    _, _, logits_cache = picking(tiny_repository / "translator", fixed)
    assert greedy_cache.decoder.greedy == on_device
    rows = admitted(runner, greedy_cache, SOURCES)
    assert np.array_equal(rows, admitted(runner, logits_cache, SOURCES))
    order = rows[[2, 0, 3, 1]]  # not the leading rows in order: the outputs are gathered
    no_eos = np.array([True, False, True, False])
    spec = config.decoder
    tokens = np.full(len(order), spec.decoder_start_id, dtype=np.int64)
    for position in range(4):
        positions = np.full(len(order), position, dtype=np.int64)
        step = greedy_cache.step_greedy(order, tokens, positions, no_eos)
        logits = logits_cache.step(order, tokens, positions).copy()
        assert np.array_equal(step.logits(), logits)  # fetched on request, the same values
        allowed = logits.copy()
        allowed[:, list(spec.suppress_ids)] = -np.inf
        allowed[no_eos, spec.eos_id] = -np.inf
        assert np.array_equal(step.tokens, allowed.argmax(-1))
        assert np.array_equal(step.best, allowed.max(-1))
        tokens = step.tokens.copy()
    assert np.array_equal(greedy_cache.lengths, logits_cache.lengths)


@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "fixed"])
def test_the_hosts_pick_over_the_batch_keeps_each_rows_eos_ban(
    tiny_repository: Path, fixed: bool
) -> None:
    """On the host the pick runs over the step's whole batch (idle rows too, with buckets) and
    the rows' picks are gathered after: each row's EOS ban must follow it. EOS is made every
    row's best token; rows in a shuffled order, half of them banned from it."""
    config, runner, cache = picking(tiny_repository / "translator", fixed, device_greedy=False)
    eos = config.decoder.eos_id
    step = cache.decoder.step

    def eos_wins(*inputs: np.ndarray) -> np.ndarray:
        logits = step(*inputs)
        logits[:, eos] = logits.max() + 1.0
        return logits

    cache.decoder.step = eos_wins
    rows = admitted(runner, cache, SOURCES)
    order = rows[[2, 0, 3, 1]]
    no_eos = np.array([True, False, True, False])
    tokens = np.full(len(order), config.decoder.decoder_start_id, dtype=np.int64)
    picked = cache.step_greedy(order, tokens, np.zeros(len(order), dtype=np.int64), no_eos)
    logits = picked.logits()
    assert np.array_equal(logits.argmax(-1), [eos] * 4)  # the rows' own logits, gathered
    allowed = logits.copy()
    allowed[:, list(config.decoder.suppress_ids)] = -np.inf
    allowed[no_eos, eos] = -np.inf
    assert np.array_equal(picked.tokens, allowed.argmax(-1))
    assert (picked.tokens == eos).tolist() == [False, True, False, True]


def test_small_steps_and_models_without_the_graph_take_the_argmax_on_the_host(
    tiny_repository: Path,
) -> None:
    config, runner, cache = picking(tiny_repository / "translator")
    rows = admitted(runner, cache, SOURCES)
    start = np.full(len(rows), config.decoder.decoder_start_id, dtype=np.int64)
    picks = []
    cache.decoder.step_greedy = lambda *args: picks.append(args)  # must not be called
    cache.pick_min_logits = 10**9
    step = cache.step_greedy(rows, start, np.zeros(len(rows), dtype=np.int64))
    assert np.array_equal(step.tokens, step.logits().argmax(-1)) and not picks

    _, _, without = picking(tiny_repository / "translator", device_greedy=False)
    assert without.decoder.picker is not None and not without.decoder.greedy
    with pytest.raises(BackendError, match="greedy_pick"):
        lengths = np.zeros(4, dtype=np.int64)
        without.decoder.step_greedy(start, lengths, lengths + 1, np.zeros(4, dtype=bool))


def test_the_server_loads_the_pick_and_uses_it_on_devices_only(tiny_repository: Path) -> None:
    entry = tiny_repository / "translator"
    config = read_model_config(entry)
    backend = make_backend(config, resolve_version(entry))
    assert GREEDY_PICK in backend.graphs()
    cache = inplace_cache(backend, config)
    assert cache is not None and cache.decoder.picker is not None
    assert not cache.decoder.greedy  # on the CPU numpy's argmax is cheaper


def test_the_hosts_greedy_step_takes_the_first_nan_or_the_lowest_allowed_maximum() -> None:
    logits = np.array(
        [[1, 3, 3, 0], [np.nan, 5, np.nan, 0], [-np.inf] * 4, [0, 9, 1, 8], [7, 1, 2, 2]],
        dtype=np.float32,
    )
    before = logits.copy()
    no_eos = np.array([False, False, False, False, True])
    step = GreedyStep.of_logits(logits, np.array([1]), 0, no_eos)  # id 1 suppressed, EOS 0
    assert step.tokens.tolist() == [2, 0, 0, 3, 2]
    assert step.best[0] == 3 and np.isnan(step.best[1]) and step.best[2] == -np.inf
    assert step.best[3] == 8 and step.best[4] == 2
    assert step.logits() is logits and np.array_equal(logits, before, equal_nan=True)


def greedy_jobs() -> list[GenerationRequest]:
    rng = np.random.default_rng(3)
    options = [
        DecodingOptions(max_new_tokens=10),
        DecodingOptions(max_new_tokens=7, min_new_tokens=7),  # an early EOS: the sampler decides
        DecodingOptions(max_new_tokens=16),
    ]
    return [
        GenerationRequest(options=options[i % 3], source_ids=rng.integers(8, 150, 2 + i % 5))
        for i in range(12)
    ]


@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "fixed"])
def test_the_engine_decodes_the_same_tokens_through_the_pick(
    tiny_repository: Path, fixed: bool
) -> None:
    config, runner, cache = picking(tiny_repository / "translator", fixed)
    picked_steps = []
    step_greedy = cache.decoder.step_greedy

    def counted(*args, **kwargs):
        picked_steps.append(len(args[0]))
        return step_greedy(*args, **kwargs)

    cache.decoder.step_greedy = counted
    # four at a time: the pick serves steps of GREEDY_PASS_ROWS rows or more
    ours = decode_all(config, runner, cache, greedy_jobs(), together=4)
    _, host_runner, host_cache = picking(tiny_repository / "translator", fixed, device_greedy=False)
    theirs = decode_all(config, host_runner, host_cache, greedy_jobs(), together=4)
    assert [e.tokens for e in ours] == [e.tokens for e in theirs]
    assert [e.reason for e in ours] == [e.reason for e in theirs]
    assert picked_steps  # the pick ran
    assert cache.rows == 0


@pytest.mark.skipif(not HAS_CUDA, reason="the pick on a device needs onnxruntime-gpu and a GPU")
@pytest.mark.parametrize("fixed", [False, True], ids=["plain", "cuda-graphs"])
def test_on_cuda_the_pick_decodes_the_tokens_of_the_host_argmax(
    tiny_repository: Path, fixed: bool
) -> None:
    """The same logits on the same GPU: the pick's tokens and the host's argmax agree exactly."""
    cuda = ("CUDAExecutionProvider",)
    entry = tiny_repository / "translator"
    config, runner, cache = picking(entry, fixed, device_greedy=None, providers=cuda)
    assert cache.decoder.device.kind == "cuda" and cache.decoder.greedy
    assert (cache.decoder.captured is not None) == fixed
    ours = decode_all(config, runner, cache, greedy_jobs())
    _, host_runner, host = picking(entry, fixed, device_greedy=False, providers=cuda)
    theirs = decode_all(config, host_runner, host, greedy_jobs())
    assert [e.tokens for e in ours] == [e.tokens for e in theirs]
