"""``serving.scoring`` without gRPC: the ``Scorer`` over the exported graphs of ``hf_repository``'s
tiny random Marian (and captioner), its lazily loaded ``decoder.onnx``, its result arrays, and a
"score" message on the engine process's wire.

A pair's scores do not depend on the pairs it is batched with (the sources and targets are
right-padded and masked), hold one log-probability per target token and one for EOS (all finite,
<= 0), and match PyTorch's teacher-forced log-softmax for arbitrary ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.graphs import DECODER, DECODER_FILE
from contract.model_config import OnnxRuntimeOptions
from contract.repository import read_model_config, resolve_version
from serving.backends.base import Backend, BackendError
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.engine.requests import GenerationRequest
from serving.errors import FailedPrecondition
from serving.generation.options import DecodingOptions
from serving.metrics import ServingMetrics
from serving.multiprocess.protocol import decode, encode
from serving.multiprocess.shm import ArenaReader, TensorArena
from serving.repository import make_backend
from serving.scoring import ScoreItem, Scorer, ScoringGraphs, from_result, result_array
from serving.seq2seq import Seq2SeqRunner
from serving.served.generator import ServedGenerator

SAME = 1e-5  # one graph, other batch companions
TOLERANCE = 2e-4  # ONNX Runtime against PyTorch


# --- fixtures -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Loaded:
    config: Any
    version_dir: Path
    backend: Backend
    graphs: ScoringGraphs
    scorer: Scorer


def load(entry: Path) -> Loaded:
    config = read_model_config(entry)
    version_dir = resolve_version(entry)
    backend = make_backend(config, version_dir)
    graphs = ScoringGraphs(backend, version_dir, config.onnxruntime)
    return Loaded(config, version_dir, backend, graphs, Scorer(graphs, config.decoder))


@pytest.fixture(scope="module")
def marian(hf_repository: Path) -> Loaded:
    return load(hf_repository / "marian")


@pytest.fixture(scope="module")
def captioner(hf_repository: Path) -> Loaded:
    return load(hf_repository / "hf-captioner")


def item(source: list[int], target: list[int]) -> ScoreItem:
    return ScoreItem(np.asarray(source, dtype=np.int64), np.asarray(target, dtype=np.int64))


def assert_results_equal(got: list[np.ndarray], want: list[np.ndarray], atol: float = SAME):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        assert a[0] == b[0]
        np.testing.assert_allclose(a[1:], b[1:], atol=atol)


def check_result(result: np.ndarray, pair: ScoreItem, positions: int | None = None) -> None:
    assert result.dtype == np.float64
    assert result.shape == (len(pair.target) + 2,)
    got_positions, log_probs = from_result(result)
    assert got_positions == (len(pair.source) if positions is None else positions)
    assert log_probs.dtype == np.float32 and log_probs.shape == (len(pair.target) + 1,)
    assert np.isfinite(log_probs).all()
    assert (log_probs <= 0).all()


# --- batches of random pairs: each pair scores as alone ---------------------------------------

# Marian's specials: </s> 0, <unk> 1, <pad> 193 (vocab_size 194, the decoder's start token too)
EOS, FIRST_PLAIN, PAD = 0, 2, 193
plain_id = st.integers(FIRST_PLAIN, PAD - 1)
sources = st.lists(plain_id, min_size=0, max_size=20).map(lambda ids: [*ids, EOS])
targets = st.lists(plain_id, min_size=0, max_size=12)
batches = st.lists(st.tuples(sources, targets), min_size=1, max_size=6)


def test_the_ids_the_strategies_draw_are_the_entrys(marian: Loaded) -> None:
    spec = marian.config.decoder
    assert (spec.eos_id, spec.pad_id, spec.decoder_start_id) == (EOS, PAD, PAD)
    assert spec.vocab_size == PAD + 1
    assert list(spec.suppress_ids) == [PAD]


@settings(max_examples=25, deadline=None)
@given(pairs=batches)
def test_a_batch_scores_each_pair_as_alone(marian: Loaded, pairs: list[Any]) -> None:
    items = [item(source, target) for source, target in pairs]
    together = marian.scorer.score_batch(items)
    alone = [marian.scorer.score_batch([pair])[0] for pair in items]
    for result, pair in zip(together, items, strict=True):
        check_result(result, pair)
    assert_results_equal(together, alone)


def test_pytorch_gives_the_same_log_probs_for_random_ids(
    marian: Loaded, hf_sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids no tokenizer chose (the ids of a real source are tested through the server): each
    target token's and EOS's log-softmax of the teacher-forced logits, pad excluded."""
    torch = pytest.importorskip("torch", reason="needs the export extra")
    transformers = pytest.importorskip("transformers", reason="needs the export extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    model = transformers.MarianMTModel.from_pretrained(hf_sources["marian"]).eval()
    rng = np.random.default_rng(4)
    items = [
        item(
            [*rng.integers(FIRST_PLAIN, PAD, size=rng.integers(1, 15)).tolist(), EOS],
            rng.integers(FIRST_PLAIN, PAD, size=size).tolist(),
        )
        for size in (0, 1, 7, 12, 3)
    ]
    results = marian.scorer.score_batch(items)
    for pair, result in zip(items, results, strict=True):
        source = torch.tensor([pair.source.tolist()])
        decoder = torch.tensor([[PAD, *pair.target.tolist()]])
        with torch.no_grad():
            logits = model(input_ids=source, decoder_input_ids=decoder).logits[0]
        logits[:, PAD] = -np.inf
        log_probs = torch.log_softmax(logits, -1)
        chosen = [*pair.target.tolist(), EOS]
        expected = [float(log_probs[i, t]) for i, t in enumerate(chosen)]
        np.testing.assert_allclose(from_result(result)[1], expected, atol=TOLERANCE)


def test_images_score_each_pair_as_alone(captioner: Loaded) -> None:
    """Pixels (float32, the image's size): the encoder's positions are its patches and class
    token, whatever the batch."""
    size = captioner.config.image.size
    rng = np.random.default_rng(9)
    vocab = captioner.config.decoder.vocab_size
    end = captioner.config.decoder.eos_id
    items = [
        ScoreItem(
            rng.uniform(-1, 1, size=(3, size, size)).astype(np.float32),
            np.asarray([t for t in rng.integers(0, vocab, size=n) if t != end], dtype=np.int64),
        )
        for n in (4, 0, 9, 1)
    ]
    encoder = Seq2SeqRunner(captioner.backend, captioner.config.decoder)
    encoded = encoder.encode({"pixel_values": items[0].source[None]})
    positions = encoded.cross[0].shape[2]
    assert positions == (size // 16) ** 2 + 1  # hf-captioner: 16 px patches and a class token
    together = captioner.scorer.score_batch(items)
    alone = [captioner.scorer.score_batch([pair])[0] for pair in items]
    for result, pair in zip(together, items, strict=True):
        check_result(result, pair, positions)
    assert_results_equal(together, alone)


# --- result arrays ------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", [0, 1, 10, 4096])
@pytest.mark.parametrize(
    "log_probs",
    [[-0.5], [-1e-8, -30.25, 0.0], np.linspace(-20, 0, 20)],
    ids=["eos-only", "three", "twenty"],
)
def test_result_arrays_round_trip(positions: int, log_probs: Any) -> None:
    values = np.asarray(log_probs, dtype=np.float32)
    result = result_array(positions, values)
    assert result.dtype == np.float64 and result.shape == (len(values) + 1,)
    got_positions, got = from_result(result)
    assert got_positions == positions and isinstance(got_positions, int)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values)


# --- a "score" message on the engine process's wire --------------------------------------------

HEADER = {
    "t": "score",
    "id": 7,
    "model": "marian",
    "version": 1,
    "timeout": 2.5,
    "priority": 0,
    "times": True,
}


def round_trip(arrays: list[np.ndarray], arena: TensorArena | None = None) -> Any:
    reader = None if arena is None else ArenaReader(os.dup(arena.fd), arena.size)
    place = None if arena is None else (lambda a: arena.put(a, 1) if a.nbytes else None)
    try:
        frames = encode(HEADER, arrays, place)
        if arena is not None:
            frames = [bytes(f) for f in frames]
        return decode(frames, reader)
    finally:
        if reader is not None:
            reader.close()


def test_a_score_message_of_token_ids_survives_the_wire(marian: Loaded) -> None:
    pair = item([5, 17, 44, 99, EOS], [12, 7, 150])
    header, arrays = round_trip(list(pair))
    assert {k: header[k] for k in HEADER} == HEADER
    assert [a.dtype for a in arrays] == [np.dtype(np.int64)] * 2
    np.testing.assert_array_equal(arrays[0], pair.source)
    np.testing.assert_array_equal(arrays[1], pair.target)
    (sent,) = marian.scorer.score_batch([ScoreItem(*arrays)])
    (kept,) = marian.scorer.score_batch([pair])
    np.testing.assert_array_equal(sent, kept)


@pytest.mark.parametrize("shared", [False, True], ids=["socket", "arena"])
def test_a_score_message_of_pixels_and_an_empty_target_survives_the_wire(
    captioner: Loaded, shared: bool
) -> None:
    size = captioner.config.image.size
    pixels = np.random.default_rng(1).uniform(-1, 1, (3, size, size)).astype(np.float32)
    pair = ScoreItem(pixels, np.zeros(0, dtype=np.int64))
    arena = TensorArena(1 << 20) if shared else None
    try:
        header, arrays = round_trip(list(pair), arena)
    finally:
        if arena is not None:
            arena.close()
    assert header["t"] == "score" and len(arrays) == 2
    if shared:
        assert "shm" in header["arrays"][0] and "shm" not in header["arrays"][1]
    assert arrays[0].dtype == np.float32 and arrays[0].shape == (3, size, size)
    np.testing.assert_array_equal(arrays[0], pixels)
    assert arrays[1].dtype == np.int64 and arrays[1].shape == (0,)
    (sent,) = captioner.scorer.score_batch([ScoreItem(*arrays)])
    (kept,) = captioner.scorer.score_batch([pair])
    np.testing.assert_array_equal(sent, kept)
    assert sent.shape == (2,)  # the positions, then EOS's log-probability alone


# --- the decoder graph: the backend's own, or decoder.onnx loaded once on first use ---------------


def test_an_inplace_backend_loads_decoder_onnx_once_on_first_use(marian: Loaded) -> None:
    assert DECODER not in marian.backend.graphs()  # the server decodes in place
    calls: list[tuple[Path, dict[str, str], OnnxRuntimeOptions]] = []

    def counted(path: Path, graphs: dict[str, str], options: OnnxRuntimeOptions) -> Backend:
        calls.append((path, graphs, options))
        time.sleep(0.05)  # threads asking meanwhile wait for this load
        return OnnxRuntimeBackend(path, graphs, options)

    graphs = ScoringGraphs(
        marian.backend, marian.version_dir, marian.config.onnxruntime, load=counted
    )
    assert calls == []
    got: list[Backend] = []
    threads = [threading.Thread(target=lambda: got.append(graphs.decoder())) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(got) == 6 and all(d is got[0] for d in got)
    assert graphs.decoder() is got[0]
    assert calls == [(marian.version_dir, {DECODER: DECODER_FILE}, marian.config.onnxruntime)]
    assert DECODER in got[0].graphs()


def test_the_default_loader_gives_one_onnxruntime_decoder(marian: Loaded) -> None:
    graphs = ScoringGraphs(marian.backend, marian.version_dir, marian.config.onnxruntime)
    first = graphs.decoder()
    assert isinstance(first, OnnxRuntimeBackend)
    assert DECODER in first.graphs()
    assert graphs.decoder() is first
    assert graphs.backend is marian.backend


def test_a_growing_cache_backend_is_its_own_scoring_decoder(marian: Loaded) -> None:
    """Served with the growing cache, the backend holds ``decoder`` already: nothing more is
    loaded, and the scores are the in-place server's (whose decoder.onnx is loaded apart)."""
    config = dataclasses.replace(
        marian.config,
        onnxruntime=dataclasses.replace(marian.config.onnxruntime, kv_cache="growing"),
    )
    backend = make_backend(config, marian.version_dir)
    assert DECODER in backend.graphs()

    def never(*_: Any) -> Backend:
        raise AssertionError("the backend's own decoder is the scoring decoder")

    graphs = ScoringGraphs(backend, marian.version_dir, config.onnxruntime, load=never)
    assert graphs.decoder() is backend
    items = [item([5, 9, 31, EOS], [12, 13]), item([8, EOS], []), item([40] * 9 + [EOS], [3])]
    assert_results_equal(
        Scorer(graphs, config.decoder).score_batch(items), marian.scorer.score_batch(items)
    )


def test_a_version_without_decoder_onnx_fails_naming_the_file(
    marian: Loaded, tmp_path: Path
) -> None:
    version_dir = tmp_path / marian.version_dir.name
    shutil.copytree(marian.version_dir, version_dir, ignore=shutil.ignore_patterns(DECODER_FILE))
    backend = make_backend(marian.config, version_dir)  # the in-place graphs are all there
    graphs = ScoringGraphs(backend, version_dir, marian.config.onnxruntime)
    for _ in range(2):  # not remembered as loaded
        with pytest.raises(BackendError, match=r"decoder\.onnx") as missing:
            graphs.decoder()
        assert str(version_dir / DECODER_FILE) in str(missing.value)
    scorer = Scorer(graphs, marian.config.decoder)
    refused = scorer.score_batch([item([5, EOS], [7]), item([6, EOS], [])])
    assert [type(r) for r in refused] == [FailedPrecondition, FailedPrecondition]
    assert all("decoder.onnx" in str(r) for r in refused)


# --- the scoring batcher beside the engine: the model's queue gauge ------------------------------


def test_a_score_leaves_the_engines_queue_depth_as_it_was(marian: Loaded) -> None:
    """attnserve_queue_depth{model, version} is the in-flight engine's waiting generations: the
    scoring batcher beside it binds the same series and must not set it (as first committed it
    did, so a Score call reset the gauge to 0 while generations still waited)."""
    metrics = ServingMetrics()
    served = ServedGenerator(marian.config, marian.version_dir, marian.backend, metrics)
    labels = {"model": "marian", "version": marian.version_dir.name}

    def depth() -> float | None:
        return metrics.registry.get_sample_value("attnserve_queue_depth", labels)

    async def go() -> tuple[float | None, float | None]:
        # the engine is not started: its three generations wait in its queue
        waiting = [
            GenerationRequest(
                options=DecodingOptions(), source_ids=np.asarray([5, 9, EOS], dtype=np.int64)
            )
            for _ in range(3)
        ]
        for request in waiting:
            served.engine.submit(request, lambda events: None)
        before = depth()
        assert served.scorer is not None
        await served.scorer.start()
        try:
            (scored,) = await served.score([item([5, 9, EOS], [12])], timeout_s=30)
            assert scored.log_probs.shape == (2,)
        finally:
            await served.scorer.stop()
            for request in waiting:
                request.cancel()
        return before, depth()

    before, after = asyncio.run(go())
    assert before == 3
    assert after == 3
