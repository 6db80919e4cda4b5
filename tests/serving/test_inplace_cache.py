"""The fixed-capacity KV cache written in place: row policies, device buffers, same tokens as the
growing cache, and the server's choice between the two decoders."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.graphs import DECODER_INPLACE_FILE, INPLACE_GRAPH_FILES, graph_files
from contract.images import pixel_values
from contract.repository import read_model_config, resolve_version, write_model_config
from models.data import shapes
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.backends.onnxruntime_io import InPlaceDecoder
from serving.engine.inflight import InFlightEngine
from serving.engine.inplace_cache import InPlaceKVCache, leading_rows
from serving.engine.requests import FinishEvent, GenerationRequest
from serving.engine.slots import RowSlots, SlotsExhausted, power_of_two_buckets, rows_to_compute
from serving.generation.options import DecodingOptions
from serving.repository import ModelRepository
from serving.seq2seq import Seq2SeqRunner

# --- row policies (pure) ------------------------------------------------------------------------


def test_rows_are_taken_lowest_first_and_reused() -> None:
    slots = RowSlots(6)
    assert slots.take(3) == [0, 1, 2]
    slots.give_back([1])
    assert slots.take(2) == [1, 3]
    assert slots.highest_used() == 3 and slots.used == 4 and slots.free == 2
    with pytest.raises(SlotsExhausted):
        slots.take(3)
    with pytest.raises(ValueError, match="not in use"):
        slots.give_back([5])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=40))
def test_row_bookkeeping_never_loses_or_duplicates_a_row(moves: list[tuple[bool, int]]) -> None:
    slots, held = RowSlots(8), []
    for take, count in moves:
        if take and count <= slots.free:
            rows = slots.take(count)
            assert not set(rows) & set(held)
            # the rows handed out are the lowest free ones
            assert rows == sorted(set(range(8)) - set(held))[:count]
            held += rows
        elif not take and held:
            back, held = held[:count], held[count:]
            slots.give_back(back)
        assert slots.used == len(held) and slots.highest_used() == max(held, default=-1)


def test_rows_to_compute_covers_the_highest_row() -> None:
    assert rows_to_compute(4, 64) == 5
    buckets = power_of_two_buckets(48)
    assert buckets == (1, 2, 4, 8, 16, 32, 48)
    assert [rows_to_compute(r, 48, buckets) for r in (0, 1, 2, 7, 8, 40)] == [1, 2, 4, 8, 16, 48]


# --- the in-place cache on real graphs ----------------------------------------------------------


def load(entry: Path, rows: int = 8):
    config = read_model_config(entry)
    files = {**graph_files("seq2seq"), **INPLACE_GRAPH_FILES}
    backend = OnnxRuntimeBackend(resolve_version(entry), files)
    runner = Seq2SeqRunner(backend, config.decoder)
    sessions = {graph: backend.session(graph) for graph in INPLACE_GRAPH_FILES}
    decoder = InPlaceDecoder(sessions, config.decoder, rows, 20, config.limits.max_source_length)
    return config, runner, InPlaceKVCache(decoder, config.decoder.pad_id)


def translator_jobs() -> list[tuple[np.ndarray, DecodingOptions]]:
    mix = [
        DecodingOptions(max_new_tokens=12),
        DecodingOptions(max_new_tokens=9, beam_size=3, num_alternatives=2),
        DecodingOptions(max_new_tokens=14, temperature=0.9, top_p=0.9, seed=5),
        DecodingOptions(max_new_tokens=6, min_new_tokens=6),
    ]
    rng = np.random.default_rng(0)
    return [(rng.integers(8, 150, 3 + i % 6).astype(np.int64), mix[i % 4]) for i in range(16)]


def decode_all(
    config,
    runner,
    cache,
    requests: list[GenerationRequest],
    together: int = 1,
    engines: list[InFlightEngine] | None = None,
    **options: Any,
) -> list[FinishEvent]:
    """Every request through a fresh engine, joining at staggered times (``together`` at a
    time: 2 ms apart, each request decodes before the next joins on a fast CPU); ``options``
    go to the engine, which is appended to ``engines``."""
    batching = dataclasses.replace(config.batching, max_active_sequences=8)
    engine = InFlightEngine("m", runner, config.decoder, 20, batching, cache=cache, **options)
    if engines is not None:
        engines.append(engine)

    async def one(request: GenerationRequest, delay: float) -> FinishEvent:
        await asyncio.sleep(delay)
        events = [e async for e in engine.generate(request)]
        assert isinstance(events[-1], FinishEvent), events[-1]
        return events[-1]

    async def go() -> list[FinishEvent]:
        engine.start()
        try:
            return list(
                await asyncio.gather(
                    *(one(r, 0.002 * (i // together)) for i, r in enumerate(requests))
                )
            )
        finally:
            engine.stop()

    return asyncio.run(go())


def test_translator_tokens_equal_the_growing_cache(tiny_repository: Path) -> None:
    config, runner, cache = load(tiny_repository / "translator")
    jobs = translator_jobs()

    def requests():
        return [GenerationRequest(options=o, source_ids=ids) for ids, o in jobs]

    inplace = decode_all(config, runner, cache, requests())
    growing = decode_all(config, runner, None, requests())
    assert [e.tokens for e in inplace] == [e.tokens for e in growing]
    for ours, theirs in zip(inplace, growing, strict=True):  # scores: summation order differs
        assert [a[0] for a in ours.alternatives] == [a[0] for a in theirs.alternatives]
        assert [a[2] for a in ours.alternatives] == [a[2] for a in theirs.alternatives]
        assert [a[1] for a in ours.alternatives] == pytest.approx(
            [a[1] for a in theirs.alternatives], rel=1e-5
        )
        if theirs.score is None:  # greedy and sampling have no score
            assert ours.score is None
        else:
            assert ours.score == pytest.approx(theirs.score, rel=1e-5)
    assert cache.rows == 0 and cache.tokens == 0  # every row was given back


def test_captioner_tokens_equal_the_growing_cache(tiny_repository: Path) -> None:
    config, runner, cache = load(tiny_repository / "captioner")
    images = np.stack([image for image, _ in shapes.generate(6, seed=1, split="test")])
    pixels = pixel_values(images)

    def requests():
        return [
            GenerationRequest(
                options=DecodingOptions(max_new_tokens=10, beam_size=1 + i % 2), pixels=p
            )
            for i, p in enumerate(pixels)
        ]

    inplace = decode_all(config, runner, cache, requests())
    growing = decode_all(config, runner, None, requests())
    assert [e.tokens for e in inplace] == [e.tokens for e in growing]


def test_a_step_writes_the_cache_where_it_lies(tiny_repository: Path) -> None:
    _, runner, cache = load(tiny_repository / "translator")
    encoded = runner.encode(
        {"input_ids": np.array([[9, 10, 11, 2]]), "attention_mask": np.ones((1, 4), np.int64)}
    )
    first, second = cache.admit(encoded, [1]), cache.admit(encoded, [2])
    assert first[0].tolist() == [0] and second[0].tolist() == [1, 2]
    buffer = cache.decoder.past["past_key.0"]
    address = buffer.value.data_ptr()
    assert not buffer.host().any()
    rows = np.array([0, 1, 2])
    cache.step(rows, np.array([1, 1, 1]), np.array([0, 0, 0]))
    cache.step(rows, np.array([5, 6, 7]), np.array([1, 1, 1]))
    host = buffer.host()
    assert buffer.value.data_ptr() == address  # the same memory, written in place
    assert host[rows, :, :2].any(axis=(1, 3)).all()  # positions 0 and 1 written for every row
    assert not host[:, :, 2:].any() and not host[3:].any()  # nothing else touched
    assert cache.tokens == 6 and cache.relayouts == 0
    cache.reorder(np.array([1, 2]), np.array([2, 2]))  # beam: row 1 continues row 2
    np.testing.assert_array_equal(host[1], host[2])
    cache.release(np.array([1, 2]))
    assert cache.rows == 1 and cache.tokens == 2
    assert cache.admit(encoded, [1])[0].tolist() == [1]  # the lowest free row again


def test_caches_widen_and_narrow_with_their_longest_row(tiny_repository: Path) -> None:
    _, runner, cache = load(tiny_repository / "translator")
    short = runner.encode(
        {"input_ids": np.array([[9, 10, 2]]), "attention_mask": np.ones((1, 3), np.int64)}
    )
    decoder = cache.decoder
    (a,), (b,) = cache.admit(short, [1]), cache.admit(short, [1])
    assert (decoder.past_width, decoder.source_width) == (8, 8)
    for position in range(10):  # row a decodes 10 tokens, row b only the first 3
        rows = np.concatenate([a, b]) if position < 3 else a
        cache.step(rows, np.full(len(rows), 5 + position), np.full(len(rows), position))
    assert decoder.past_width == 16 and cache.relayouts == 1
    written = decoder.past["past_value.1"].host()[:2, :, :10].copy()
    long_source = runner.encode(
        {"input_ids": np.arange(4, 16)[None], "attention_mask": np.ones((1, 12), np.int64)}
    )
    (c,) = cache.admit(long_source, [1])
    assert decoder.source_width == 16 and cache.relayouts == 2
    cross = decoder.cross["cross_key.0"]  # written through a binding of the wider buffers
    np.testing.assert_allclose(cross.host()[c[0], :, :12], long_source.cross[0][0], rtol=1e-6)
    np.testing.assert_array_equal(decoder.past["past_value.1"].host()[:2, :, :10], written)
    cache.release(a)  # the longest self-attention row leaves: back to 8 positions
    assert decoder.past_width == 8 and decoder.source_width == 16
    np.testing.assert_array_equal(decoder.past["past_value.1"].host()[1, :, :3], written[1, :, :3])
    cache.release(c)  # the longest source leaves
    assert decoder.source_width == 8 and cache.relayouts == 4
    (d,) = cache.admit(short, [1])  # the writer binds the buffers at 8 positions again
    np.testing.assert_allclose(cross.host()[d[0], :, :3], short.cross[0][0], rtol=1e-6)
    cache.release(d)
    cache.release(b)
    assert cache.rows == 0 and cache.tokens == 0


def test_positions_past_the_capacity_are_refused(tiny_repository: Path) -> None:
    _, runner, cache = load(tiny_repository / "translator")
    encoded = runner.encode(
        {"input_ids": np.array([[9, 2]]), "attention_mask": np.ones((1, 2), np.int64)}
    )
    (rows,) = cache.admit(encoded, [1])
    with pytest.raises(ValueError, match="past the cache"):
        cache.step(rows, np.array([1]), np.array([cache.decoder.capacity]))


# --- which decoder the server uses --------------------------------------------------------------


def copy_entry(tiny_repository: Path, tmp_path: Path, name: str = "translator") -> Path:
    root = tmp_path / "repo"
    shutil.copytree(tiny_repository / name, root / name)
    return root


def served_cache(root: Path) -> str:
    repository = ModelRepository.load(root)
    return repository.get("translator").kv_cache


def test_the_server_decodes_in_place_by_default(tiny_repository: Path, tmp_path: Path) -> None:
    assert served_cache(copy_entry(tiny_repository, tmp_path)) == "inplace"


def test_kv_cache_growing_in_config_yaml(tiny_repository: Path, tmp_path: Path) -> None:
    root = copy_entry(tiny_repository, tmp_path)
    config = read_model_config(root / "translator")
    options = dataclasses.replace(config.onnxruntime, kv_cache="growing")
    write_model_config(dataclasses.replace(config, onnxruntime=options), root / "translator")
    assert served_cache(root) == "growing"


def test_older_exports_fall_back_to_the_growing_cache(tiny_repository: Path, tmp_path) -> None:
    root = copy_entry(tiny_repository, tmp_path)
    (resolve_version(root / "translator") / DECODER_INPLACE_FILE).unlink()
    assert served_cache(root) == "growing"


def test_an_unloadable_inplace_graph_falls_back_with_a_warning(
    tiny_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = copy_entry(tiny_repository, tmp_path)
    (resolve_version(root / "translator") / DECODER_INPLACE_FILE).write_bytes(b"not a graph")
    with caplog.at_level(logging.WARNING):
        assert served_cache(root) == "growing"
    assert "cannot load the in-place decoder" in caplog.text


def test_only_the_step_graphs_spin(tiny_repository: Path) -> None:
    """With allow_spinning, the decoder's idle threads spin between steps; the encoder's and the
    cache helpers' never do (their own pools' spinning workers slowed the steps after them)."""
    from serving.backends.onnxruntime import SPINNING_GRAPHS

    config = read_model_config(tiny_repository / "translator")
    options = dataclasses.replace(config.onnxruntime, allow_spinning=True, intra_op_threads=2)
    files = {"encoder": "encoder.onnx", **INPLACE_GRAPH_FILES}
    backend = OnnxRuntimeBackend(resolve_version(tiny_repository / "translator"), files, options)
    spinning = {
        graph: backend.session(graph)
        .get_session_options()
        .get_session_config_entry("session.intra_op.allow_spinning")
        for graph in files
    }
    assert spinning == {g: "1" if g in SPINNING_GRAPHS else "0" for g in files}
    assert spinning["decoder_inplace"] == "1" and spinning["encoder"] == "0"
    off = dataclasses.replace(options, allow_spinning=False)  # the server's default: none spin
    quiet = OnnxRuntimeBackend(resolve_version(tiny_repository / "translator"), files, off)
    entry = "session.intra_op.allow_spinning"
    assert {
        quiet.session(g).get_session_options().get_session_config_entry(entry) for g in files
    } == {"0"}


def test_spin_duration_bounds_the_spinning_sessions_only(tiny_repository: Path) -> None:
    """spin_duration_us reaches the sessions that spin, and only with allow_spinning; ONNX
    Runtime's own duration otherwise (no entry)."""
    config = read_model_config(tiny_repository / "translator")
    files = {"encoder": "encoder.onnx", **INPLACE_GRAPH_FILES}
    key = "session.intra_op.spin_duration_us"

    def durations(**changes: object) -> dict[str, str | None]:
        options = dataclasses.replace(config.onnxruntime, intra_op_threads=2, **changes)
        backend = OnnxRuntimeBackend(
            resolve_version(tiny_repository / "translator"), files, options
        )
        found: dict[str, str | None] = {}
        for graph in files:
            try:
                found[graph] = (
                    backend.session(graph).get_session_options().get_session_config_entry(key)
                )
            except RuntimeError:  # ONNX Runtime: no such entry
                found[graph] = None
        return found

    bounded = durations(allow_spinning=True, spin_duration_us=50)
    assert bounded["decoder_inplace"] == "50" and bounded["encoder"] is None
    assert set(durations(allow_spinning=True).values()) == {None}
    assert set(durations(allow_spinning=False, spin_duration_us=50).values()) == {None}
    with pytest.raises(ValueError, match="spin_duration_us must be >= 0"):
        dataclasses.replace(config.onnxruntime, spin_duration_us=-1)


@pytest.mark.parametrize("entry", ["tiny:translator", "int8:kv8"])
@pytest.mark.parametrize(("start", "end", "rows"), [(8, 16, 3), (16, 8, 5), (20, 8, 8), (8, 20, 1)])
def test_host_relayout_equals_the_cache_resize_graph(
    request: pytest.FixtureRequest, entry: str, start: int, end: int, rows: int
) -> None:
    """On the CPU the caches are re-laid out in host memory; the device path's ``cache_resize``
    graph gives the same buffers (float caches, and int8 ones: transposed keys and scales)."""
    fixture, name = entry.split(":")
    root = request.getfixturevalue("tiny_repository" if fixture == "tiny" else "int8_repository")
    decoder = load(root / name)[2].decoder
    buffers = list(decoder.past.values())
    decoder.resize("past", start, 0)  # no rows in use: only the width changes
    rng = np.random.default_rng(start * 100 + end + rows)
    for buffer in buffers:
        view = buffer.host()
        view[...] = rng.integers(-100, 100, view.shape).astype(view.dtype)
    before = {id(b): b.host()[:rows].copy() for b in buffers}
    snapshot = [b._host.copy() for b in buffers]
    decoder.resize("past", end, rows)
    ours = [b.host()[:rows].copy() for b in buffers]
    for buffer, saved in zip(buffers, snapshot, strict=True):
        buffer._host[...] = saved
        buffer.width = start
    decoder.resize_with_graph(buffers, end, rows)
    for buffer, mine in zip(buffers, ours, strict=True):
        np.testing.assert_array_equal(buffer.host()[:rows], mine)
        axis = 3 if buffer.width_last else 2
        kept = np.take(before[id(buffer)], range(min(start, end)), axis=axis)
        np.testing.assert_array_equal(np.take(mine, range(min(start, end)), axis=axis), kept)
        assert not np.take(mine, range(min(start, end), end), axis=axis).any()  # zero-padded


@pytest.mark.parametrize(
    ("width", "length", "rows"),
    [(8, 5, [2, 0]), (16, 16, [7]), (16, 3, [5]), (8, 1, [1, 3, 4])],
)
def test_host_cross_writes_equal_the_cache_write_graph(
    tiny_repository: Path, width: int, length: int, rows: list[int]
) -> None:
    """On the CPU a joiner's cross keys / values are written by numpy assignment; the
    ``cache_write`` graph (every device, and int8 caches) gives the same buffers: the new values
    zero-padded to the width, over whatever the rows held, the other rows untouched."""
    decoder = load(tiny_repository / "translator")[2].decoder
    assert decoder.host_writes
    buffers = list(decoder.cross.values())
    decoder.resize("cross", width, 0)
    rng = np.random.default_rng(width + length)
    for buffer in buffers:  # stale values everywhere, as rows that held longer sources leave
        view = buffer.host()
        view[...] = rng.standard_normal(view.shape).astype(view.dtype)
    snapshot = [b._host.copy() for b in buffers]
    heads, inner = buffers[0].heads, buffers[0].inner
    cross = [rng.standard_normal((len(rows), heads, length, inner)) for _ in buffers]
    at = np.asarray(rows, dtype=np.int64)
    decoder.write_cross(at, cross)
    ours = [b.host().copy() for b in buffers]
    for buffer, saved in zip(buffers, snapshot, strict=True):
        buffer._host[...] = saved
    decoder.host_writes = False
    decoder.write_cross(at, cross)
    others = [r for r in range(decoder.rows) if r not in rows]
    for buffer, mine, values, saved in zip(buffers, ours, cross, snapshot, strict=True):
        np.testing.assert_array_equal(buffer.host(), mine)
        np.testing.assert_array_equal(mine[at, :, :length], values.astype(mine.dtype))
        assert not mine[at, :, length:].any()  # zero-padded
        before = saved[: mine.size].reshape(mine.shape)
        np.testing.assert_array_equal(mine[others], before[others])


@pytest.mark.parametrize("kv_dtype", ["float", "int8"])
def test_vector_and_row_scatters_fill_the_caches_alike(
    tiny_repository: Path, int8_repository: Path, kv_dtype: str
) -> None:
    """A GPU's helper graphs scatter one vector per index, the CPU's one row
    (``vector_scatter``): a join's cross writes and a beam's row copies leave the same buffers
    either way. Here both run on the CPU's kernels, the GPU's way chosen by hand."""
    entry = tiny_repository / "translator" if kv_dtype == "float" else int8_repository / "kv8"
    decoder = load(entry)[2].decoder
    assert not decoder.vector_scatter  # the CPU's way
    decoder.host_writes = False  # through the cache_write graph
    rng = np.random.default_rng(7)
    buffers = list(decoder.cross.values()) + list(decoder.past.values())
    first = next(iter(decoder.cross.values()))  # a key buffer: heads, head size
    cross = [rng.standard_normal((2, first.heads, 3, first.inner)) for _ in decoder.updates]
    results = []
    for vector_scatter in (False, True):
        for buffer in buffers:  # the same stale values before each way
            buffer._host[...] = np.random.default_rng(1).integers(-9, 9, buffer._host.shape)
        decoder.vector_scatter = vector_scatter
        decoder._helpers.clear()  # the kept bindings hold the flag
        decoder.write_cross(np.array([3, 0]), cross)
        decoder.copy_rows(np.array([1, 2]), np.array([2, 0]))
        results.append([b._host.copy() for b in buffers])
    for by_row, by_vector in zip(*results, strict=True):
        np.testing.assert_array_equal(by_vector, by_row)


def test_encoder_outputs_left_on_the_device_fill_the_cache_alike(tiny_repository: Path) -> None:
    """The encoder's cross keys / values left as OrtValues on the cache's device (here the CPU's:
    on a GPU they never cross to the host) are what ``encode`` returns, and admitting them through
    the ``cache_write`` graph (bound as they are) or the host writes gives the buffers the numpy
    arrays give, beams (their rows repeated on the host) included."""
    runner = load(tiny_repository / "translator")[1]
    ids = np.zeros((3, 9), dtype=np.int64)
    for row, length in enumerate((9, 4, 6)):
        ids[row, :length] = np.arange(10, 10 + length)
    feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
    host, kept = runner.encode(feeds), runner.encode(feeds, ("cpu", 0))
    assert all(not isinstance(c, np.ndarray) for c in kept.cross)  # OrtValues
    np.testing.assert_array_equal(kept.mask, host.mask)
    for ours, theirs in zip(kept.cross, host.cross, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=0, atol=1e-6)
    filled = []
    for encoded, graph in ((host, False), (kept, False), (kept, True), (host, True)):
        cache = load(tiny_repository / "translator")[2]
        cache.decoder.host_writes = not graph
        rows = cache.admit(encoded, [1, 2, 1])  # the second request holds two beams' rows
        assert [r.tolist() for r in rows] == [[0], [1, 2], [3]]
        filled.append([b.host().copy() for b in cache.decoder.cross.values()])
    for buffers in filled[1:]:
        for ours, theirs in zip(buffers, filled[0], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    assert filled[0][0][1:3].any() and np.array_equal(filled[0][0][1], filled[0][0][2])
    captioner = load(tiny_repository / "captioner")[1]  # images: the mask from the shape
    images = np.stack([image for image, _ in shapes.generate(2, seed=3, split="test")])
    pixels = {"pixel_values": pixel_values(images)}
    kept, host = captioner.encode(pixels, ("cpu", 0)), captioner.encode(pixels)
    np.testing.assert_array_equal(kept.mask, host.mask)
    np.testing.assert_allclose(kept.cross[-1].numpy(), host.cross[-1], rtol=0, atol=1e-6)


def test_the_engine_hands_the_encoder_output_over_on_the_device(tiny_repository: Path) -> None:
    """With the cache asking for the encoder's output on its device (``encoder_device``, as on a
    GPU) the engine decodes the tokens it decodes from numpy arrays (beams and sampling too)."""
    config, runner, cache = load(tiny_repository / "translator")
    jobs = translator_jobs()

    def requests():
        return [GenerationRequest(options=o, source_ids=ids) for ids, o in jobs]

    plain = decode_all(config, runner, cache, requests())
    cache = load(tiny_repository / "translator")[2]
    cache.decoder.encoder_device, cache.decoder.host_writes = ("cpu", 0), False
    encoded = []
    encode = runner.encode
    runner.encode = lambda feeds, device=None: encoded.append(device) or encode(feeds, device)
    on_device = decode_all(config, runner, cache, requests())
    assert encoded and set(encoded) == {("cpu", 0)}
    assert [e.tokens for e in on_device] == [e.tokens for e in plain]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 5),
    heads=st.integers(1, 3),
    inner=st.integers(1, 4),
    widths=st.lists(st.integers(1, 12), min_size=2, max_size=5),
    width_last=st.booleans(),
    int8=st.booleans(),
)
def test_relayouts_keep_every_row_like_numpy(
    rows: int, heads: int, inner: int, widths: list[int], width_last: bool, int8: bool
) -> None:
    """A buffer re-laid out again and again holds, per row, what padding / cutting the first
    layout along its position axis gives (the other axes untouched)."""
    from serving.backends.cache_buffers import CacheBuffer, Device

    dtype = np.int8 if int8 else np.float32
    buffer = CacheBuffer(rows + 1, heads, 12, inner, dtype, Device(), width_last)
    buffer.width = widths[0]
    axis = 3 if width_last else 2
    start = np.random.default_rng(len(widths)).integers(1, 100, buffer.host().shape)
    buffer.host()[...] = start.astype(dtype)
    expected = buffer.host()[:rows].copy()
    for width in widths[1:]:
        buffer.relayout(width, rows)
        kept = min(width, expected.shape[axis])
        pad = [(0, 0)] * 4
        pad[axis] = (0, width - kept)
        expected = np.pad(np.take(expected, range(kept), axis=axis), pad)
        np.testing.assert_array_equal(buffer.host()[:rows], expected)


@given(
    st.one_of(
        st.integers(0, 40).map(lambda n: np.arange(n, dtype=np.int64)),
        st.lists(st.integers(0, 40), max_size=40).map(lambda r: np.array(r, dtype=np.int64)),
    )
)
def test_leading_rows_is_exactly_the_first_rows_in_order(rows: np.ndarray) -> None:
    """The step hands out the decoder's first rows without a copy only for rows 0..n-1."""
    assert leading_rows(rows) == (len(rows) > 0 and np.array_equal(rows, np.arange(len(rows))))
