"""Decode steps at fixed addresses (what CUDA graphs replay): same tokens, same memory every step
of a shape, a graph id per shape, and the CUDA graph option reaching only the in-place decoder."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from contract.graphs import DECODER_INPLACE, ENCODER, INPLACE_GRAPH_FILES, graph_files
from contract.model_config import OnnxRuntimeOptions
from contract.repository import read_model_config, resolve_version
from serving.backends.captured_steps import CUDA_GRAPH_OPTION, GRAPH_ID
from serving.backends.onnxruntime import (
    CONV_ALGO_SEARCH,
    OnnxRuntimeBackend,
    graph_provider_options,
)
from serving.backends.onnxruntime_io import InPlaceDecoder
from serving.engine.inplace_cache import InPlaceKVCache
from serving.engine.requests import GenerationRequest
from serving.engine.slots import power_of_two_buckets
from serving.seq2seq import Seq2SeqRunner
from serving.served.generator import inplace_cache
from tests.serving.test_inplace_cache import decode_all, load, translator_jobs

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def fixed(entry: Path, rows: int = 8, providers: tuple[str, ...] = ("CPUExecutionProvider",)):
    """The translator's runner and an in-place cache whose steps run at fixed addresses, at
    power-of-two batch sizes, as the server runs them when it captures CUDA graphs."""
    config = read_model_config(entry)
    options = dataclasses.replace(
        config.onnxruntime, execution_providers=providers, cuda_graph=True
    )
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES}
    backend = OnnxRuntimeBackend(resolve_version(entry), files, options)
    sessions = {graph: backend.session(graph) for graph in INPLACE_GRAPH_FILES}
    decoder = InPlaceDecoder(
        sessions, config.decoder, rows, 20, config.limits.max_source_length, fixed_bindings=True
    )
    cache = InPlaceKVCache(decoder, config.decoder.pad_id, power_of_two_buckets(rows))
    return config, Seq2SeqRunner(backend, config.decoder), cache


def requests() -> list[GenerationRequest]:
    return [GenerationRequest(options=o, source_ids=ids) for ids, o in translator_jobs()]


def test_fixed_bindings_decode_the_same_tokens(tiny_repository: Path) -> None:
    """Greedy, beam and sampling requests joining and leaving at staggered times."""
    config, runner, cache = fixed(tiny_repository / "translator")
    ours = decode_all(config, runner, cache, requests())
    _, plain_runner, plain = load(tiny_repository / "translator")
    theirs = decode_all(config, plain_runner, plain, requests())
    assert [e.tokens for e in ours] == [e.tokens for e in theirs]
    assert [e.alternatives and e.alternatives[0][0] for e in ours] == [
        e.alternatives and e.alternatives[0][0] for e in theirs
    ]
    captured = cache.decoder.captured
    assert captured is not None and captured.graphs > 1  # several batch sizes and widths ran
    assert cache.rows == 0  # every row given back


def test_each_step_shape_keeps_its_memory_and_graph_id(tiny_repository: Path) -> None:
    _, runner, cache = fixed(tiny_repository / "translator")
    captured, vocab = cache.decoder.captured, cache.decoder.logits.shape[-1]
    assert captured is not None
    ids = np.array([[9, 10, 11, 2]])
    rows = cache.admit(runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)}), [3])
    steps = [  # copies: a step's logits are valid until the next step
        cache.step(rows[0], np.array([5, 6, 7]), np.array([i] * 3)).copy() for i in range(2)
    ]
    assert captured.graphs == 1  # rows 0..2 ran as the bucket of 4, twice
    (shape,) = captured._shapes.values()
    pointer = shape.packed.data_ptr()
    third = cache.step(rows[0], np.array([8, 9, 10]), np.array([2, 2, 2]))
    assert shape.packed.data_ptr() == pointer
    # the inputs were overwritten in place: the third step's values, the idle row padded
    ids_row, lengths_row, cross_row = shape.packed.numpy().tolist()
    assert ids_row == [8, 9, 10, cache.pad_id]
    assert lengths_row == [2, 2, 2, 0]
    assert cross_row == [4, 4, 4, 1]  # the source's 4 tokens; 1 for the idle row
    first = int(shape.run_options.get_run_config_entry(GRAPH_ID))
    assert first >= 1  # 0 is ONNX Runtime's own, -1 means no graph
    assert third.shape == steps[0].shape == (3, vocab)
    assert np.isfinite(third).all() and not np.array_equal(third, steps[1])
    # a wider cache is another shape: another binding, another graph id
    more = cache.admit(runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)}), [3])
    cache.step(np.concatenate([rows[0], more[0]]), np.arange(6), np.array([3, 3, 3, 0, 0, 0]))
    assert captured.graphs == 2
    ids_used = {s.run_options.get_run_config_entry(GRAPH_ID) for s in captured._shapes.values()}
    assert len(ids_used) == 2 and str(first) in ids_used
    captured.max_graphs = 2  # a third shape runs at fixed addresses, without a graph
    cache.step(np.concatenate([rows[0], more[0]]), np.arange(6), np.full(6, 8))  # width 16
    assert captured.graphs == 3
    newest = list(captured._shapes.values())[-1]
    assert newest.run_options.get_run_config_entry(GRAPH_ID) == "-1"
    assert {key[0] for key in captured._shapes} == {4, 8}  # batch buckets, not 3 and 6 rows


def test_the_cuda_graph_option_reaches_only_the_inplace_decoder_on_cuda() -> None:
    on = OnnxRuntimeOptions(cuda_graph=True)
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    given = {"CUDAExecutionProvider": {"device_id": "1"}}
    search = {CONV_ALGO_SEARCH: "EXHAUSTIVE"}  # every CUDA session's, ONNX Runtime's default
    options = graph_provider_options(DECODER_INPLACE, on, cuda, given)
    assert options == [{"device_id": "1", **search, CUDA_GRAPH_OPTION: "1"}, {}]
    assert given == {"CUDAExecutionProvider": {"device_id": "1"}}  # the caller's dict untouched
    for graph in (ENCODER, "decoder", "cache_write", "cache_copy", "cache_resize"):
        assert graph_provider_options(graph, on, cuda, given) == [{"device_id": "1", **search}, {}]
    off = OnnxRuntimeOptions(cuda_graph=False)
    assert graph_provider_options(DECODER_INPLACE, off, cuda) == [search, {}]
    assert graph_provider_options(DECODER_INPLACE, on, ["CPUExecutionProvider"]) == [{}]


def test_the_convolution_search_reaches_every_cuda_session_unless_given() -> None:
    """onnxruntime.cudnn_conv_algo_search becomes the CUDA provider's option in upper case;
    provider options that name one win; other providers get nothing."""
    heuristic = OnnxRuntimeOptions(cudnn_conv_algo_search="heuristic")
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert graph_provider_options("model", heuristic, cuda) == [{CONV_ALGO_SEARCH: "HEURISTIC"}, {}]
    plain = {CONV_ALGO_SEARCH: "DEFAULT"}
    given = {"CUDAExecutionProvider": plain}
    assert graph_provider_options("model", heuristic, cuda, given)[0] == plain
    trt = ["TensorrtExecutionProvider", "CPUExecutionProvider"]
    assert graph_provider_options("model", heuristic, trt) == [{}, {}]


@pytest.mark.parametrize("cuda_listed", [False, True], ids=["cpu-config", "cuda-config"])
def test_on_the_cpu_the_option_changes_nothing_and_says_so_where_cuda_was_asked_for(
    tiny_repository: Path, caplog: pytest.LogCaptureFixture, cuda_listed: bool
) -> None:
    """The option is on by default: a CPU config decodes without graphs and without a word; a
    config listing the CUDA provider that runs on the CPU (no GPU build here) says so."""
    if cuda_listed and HAS_CUDA:
        pytest.skip("the CUDA provider is available here: the graphs would be captured")
    entry = tiny_repository / "translator"
    config = read_model_config(entry)
    providers = ("CUDAExecutionProvider",) * cuda_listed + ("CPUExecutionProvider",)
    options = dataclasses.replace(
        config.onnxruntime, cuda_graph=True, execution_providers=providers
    )
    assert OnnxRuntimeOptions().cuda_graph and options.captures_cuda_graphs is cuda_listed
    config = dataclasses.replace(config, onnxruntime=options)
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES}
    backend = OnnxRuntimeBackend(resolve_version(entry), files, config.onnxruntime)
    with caplog.at_level(logging.WARNING):
        cache = inplace_cache(backend, config)
    assert cache is not None and cache.decoder.captured is None and cache.buckets == ()
    warned = "onnxruntime.cuda_graph applies to the in-place decoder on CUDA only" in caplog.text
    assert warned is cuda_listed


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need onnxruntime-gpu and a CUDA device")
def test_cuda_graphs_decode_the_cpu_tokens(tiny_repository: Path) -> None:
    entry = tiny_repository / "translator"
    config, runner, cache = fixed(entry, providers=("CUDAExecutionProvider",))
    assert cache.decoder.device.kind == "cuda"
    ours = decode_all(config, runner, cache, requests())
    _, cpu_runner, cpu = load(entry)
    theirs = decode_all(config, cpu_runner, cpu, requests())
    same = sum(a.tokens == b.tokens for a, b in zip(ours, theirs, strict=True))
    assert same >= len(theirs) - 1  # GPU kernels may flip one near-tied token


class RefusesGraphs:
    """A session whose provider cannot capture CUDA graphs: every run with a graph id fails (as
    ONNX Runtime does when a graph's nodes cannot be captured); runs without one go through."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.refused = 0

    def io_binding(self) -> ort.IOBinding:
        return self.session.io_binding()

    def run_with_iobinding(self, io: ort.IOBinding, run_options: ort.RunOptions) -> None:
        if run_options.get_run_config_entry(GRAPH_ID) != "-1":
            self.refused += 1
            raise RuntimeError("this graph cannot be captured")
        self.session.run_with_iobinding(io, run_options)


def test_a_graph_that_cannot_be_captured_falls_back_with_a_warning(
    tiny_repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Decoding goes on with the same tokens, the shape and every new one without a graph."""
    config, runner, cache = fixed(tiny_repository / "translator")
    captured = cache.decoder.captured
    assert captured is not None
    refusing = RefusesGraphs(captured.session)
    captured.session = refusing
    with caplog.at_level(logging.WARNING):
        ours = decode_all(config, runner, cache, requests())
    _, plain_runner, plain = load(tiny_repository / "translator")
    assert [e.tokens for e in ours] == [
        e.tokens for e in decode_all(config, plain_runner, plain, requests())
    ]
    assert refusing.refused == 1  # the first graph failed; no other was tried
    assert "decoding on without CUDA graphs" in caplog.text
    assert {s.run_options.get_run_config_entry(GRAPH_ID) for s in captured._shapes.values()} == {
        "-1"
    }
    assert captured.graphs > 1
