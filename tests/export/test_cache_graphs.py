"""The in-place cache's helper graphs, run in ONNX Runtime against numpy's answer."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.graphs import (
    ROWS,
    SOURCE_ROWS,
    VECTOR_SCATTER,
    WIDTH,
    cache_buffer_names,
    is_scale,
    kv_names,
    resize_buffer_names,
    scale_name,
    update_name,
    vector_size,
    width_axis,
    written_name,
)
from export.cache_graphs import (
    INT8_EPSILON,
    cache_copy_model,
    cache_resize_model,
    cache_write_model,
)

LAYERS, HEADS, HEAD_DIM = 2, 2, 4
_SESSIONS: dict[str, ort.InferenceSession] = {}


def resizer(kv_dtype: str) -> ort.InferenceSession:
    if kv_dtype not in _SESSIONS:
        model = cache_resize_model(LAYERS, HEADS, HEAD_DIM, kv_dtype)
        _SESSIONS[kv_dtype] = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
    return _SESSIONS[kv_dtype]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 3),
    width_in=st.integers(1, 12),
    width_out=st.integers(1, 12),
    kv_dtype=st.sampled_from(["fp32", "fp16"]),
    seed=st.integers(0, 2**16),
)
def test_cache_resize_cuts_or_zero_pads_every_buffer(
    rows: int, width_in: int, width_out: int, kv_dtype: str, seed: int
) -> None:
    """One Pad per buffer: wider keeps the data and adds zeros, narrower keeps the first
    ``width_out`` positions, equal copies."""
    dtype = np.float32 if kv_dtype == "fp32" else np.float16
    rng = np.random.default_rng(seed)
    names = resize_buffer_names(2 * LAYERS)
    buffers = {
        n: rng.standard_normal((rows, HEADS, width_in, HEAD_DIM)).astype(dtype) for n in names
    }
    outputs = resizer(kv_dtype).run(
        [written_name(n) for n in names], {WIDTH: np.array([width_out]), **buffers}
    )
    for name, out in zip(names, outputs, strict=True):
        expected = np.zeros((rows, HEADS, width_out, HEAD_DIM), dtype)
        kept = min(width_in, width_out)
        expected[:, :, :kept] = buffers[name][:, :, :kept]
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, expected)


def test_cache_resize_is_one_pad_per_buffer() -> None:
    model = cache_resize_model(LAYERS, HEADS, HEAD_DIM, "fp32")
    copies = [n.op_type for n in model.graph.node if n.op_type in ("Pad", "Slice")]
    assert copies == ["Pad"] * (2 * LAYERS)


# --- the int8 cache: scales beside every buffer, keys transposed ---------------------------------

INT8_NAMES = cache_buffer_names("past", LAYERS, "int8")


def int8_buffers(rng: np.random.Generator, rows: int, width: int) -> dict[str, np.ndarray]:
    """Random buffers in the int8 layout (``contract.graphs``), named as the cache names them."""
    buffers = {}
    for name in INT8_NAMES:
        inner = vector_size(name, HEAD_DIM)
        keys = width_axis(name, "int8") == 3
        shape = (rows, HEADS, inner, width) if keys else (rows, HEADS, width, inner)
        if is_scale(name):
            buffers[name] = rng.random(shape, dtype=np.float32)
        else:
            buffers[name] = rng.integers(-127, 128, shape).astype(np.int8)
    return buffers


def quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's int8 per-vector quantisation, the formula the graphs implement."""
    scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True), INT8_EPSILON) * np.float32(1 / 127)
    return np.round(x / scale).astype(np.int8), scale.astype(np.float32)


def session(model) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 3),
    width_in=st.integers(1, 10),
    width_out=st.integers(1, 10),
    seed=st.integers(0, 2**16),
)
def test_int8_cache_resize_cuts_or_pads_along_each_buffers_positions(
    rows: int, width_in: int, width_out: int, seed: int
) -> None:
    buffers = int8_buffers(np.random.default_rng(seed), rows, width_in)
    names = resize_buffer_names(len(INT8_NAMES))
    feeds = {WIDTH: np.array([width_out]), **dict(zip(names, buffers.values(), strict=True))}
    resize = session(cache_resize_model(LAYERS, HEADS, HEAD_DIM, "int8"))
    outputs = resize.run([written_name(n) for n in names], feeds)
    kept = min(width_in, width_out)
    for (name, before), out in zip(buffers.items(), outputs, strict=True):
        axis = width_axis(name, "int8")
        assert out.dtype == before.dtype and out.shape[axis] == width_out
        np.testing.assert_array_equal(
            np.take(out, range(kept), axis=axis), np.take(before, range(kept), axis=axis)
        )
        assert not np.take(out, range(kept, width_out), axis=axis).any()


@settings(max_examples=25, deadline=None)
@given(
    source=st.integers(1, 6),
    rows=st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
    by_vector=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int8_cache_write_quantises_new_rows_into_place(
    source: int, rows: list[int], by_vector: bool, seed: int
) -> None:
    """cache_write takes the encoder's float keys / values and writes them quantised (one scale
    per vector, keys transposed), zero-padded to the buffers' width; other rows keep theirs."""
    rng = np.random.default_rng(seed)
    capacity = 6
    buffers = {n.replace("past_", "cross_"): b for n, b in int8_buffers(rng, 4, capacity).items()}
    new = {
        update_name(n): (rng.standard_normal((len(rows), HEADS, source, HEAD_DIM)) * 3).astype(
            np.float32
        )
        for n in kv_names("cross", LAYERS)
    }
    names = list(buffers)
    write = session(cache_write_model(LAYERS, HEADS, HEAD_DIM, "int8"))
    outputs = dict(
        zip(
            names,
            write.run(
                [written_name(n) for n in names],
                {ROWS: np.array(rows), VECTOR_SCATTER: np.array([by_vector]), **buffers, **new},
            ),
            strict=True,
        )
    )
    others = [r for r in range(4) if r not in rows]
    for name in kv_names("cross", LAYERS):
        values, scales = quantized(new[update_name(name)])
        if width_axis(name, "int8") == 3:
            values, scales = values.transpose(0, 1, 3, 2), scales.transpose(0, 1, 3, 2)
        for buffer, expected in ((name, values), (scale_name(name), scales)):
            axis = width_axis(buffer, "int8")
            got = outputs[buffer]
            np.testing.assert_allclose(
                np.take(got[rows], range(source), axis=axis), expected, rtol=1e-6
            )
            assert not np.take(got[rows], range(source, capacity), axis=axis).any()
            np.testing.assert_array_equal(got[others], buffers[buffer][others])
    # what comes back is the input within half a quantisation step
    name = kv_names("cross", LAYERS)[1]  # a value buffer: [rows, heads, width, head_dim]
    restored = outputs[name][rows, :, :source] * outputs[scale_name(name)][rows, :, :source]
    step = outputs[scale_name(name)][rows, :, :source]
    assert (np.abs(restored - new[update_name(name)]) <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("by_vector", [True, False])
def test_int8_cache_copy_copies_values_and_scales(by_vector: bool) -> None:
    rng = np.random.default_rng(0)
    buffers = int8_buffers(rng, 4, 5)
    copy = session(cache_copy_model(LAYERS, HEADS, HEAD_DIM, "int8"))
    feeds = {
        ROWS: np.array([0, 3]),
        SOURCE_ROWS: np.array([2, 2]),
        VECTOR_SCATTER: np.array([by_vector]),
        **buffers,
    }
    outputs = copy.run([written_name(n) for n in INT8_NAMES], feeds)
    for name, out in zip(INT8_NAMES, outputs, strict=True):
        before = buffers[name]
        np.testing.assert_array_equal(out[[0, 3]], before[[2, 2]])
        np.testing.assert_array_equal(out[[1, 2]], before[[1, 2]])


# --- float caches: writes and copies, one vector per scatter index -------------------------------


@settings(max_examples=30, deadline=None)
@given(
    source=st.integers(1, 6),
    rows=st.lists(st.integers(0, 4), min_size=1, max_size=4, unique=True),
    kv_dtype=st.sampled_from(["fp32", "fp16"]),
    by_vector=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cache_write_puts_new_rows_in_place_zero_padded(
    source: int, rows: list[int], kv_dtype: str, by_vector: bool, seed: int
) -> None:
    """The joiners' cross keys / values land in their rows (in any order), zero-padded to the
    buffers' width over what the rows held; the other rows keep theirs. Alike whether the
    scatters take a vector (GPU) or a row (CPU) per index."""
    dtype = np.float32 if kv_dtype == "fp32" else np.float16
    rng = np.random.default_rng(seed)
    capacity, total = 6, 5
    names = kv_names("cross", LAYERS)
    buffers = {
        n: rng.standard_normal((total, HEADS, capacity, HEAD_DIM)).astype(dtype) for n in names
    }
    new = {
        update_name(n): rng.standard_normal((len(rows), HEADS, source, HEAD_DIM)).astype(dtype)
        for n in names
    }
    write = session(cache_write_model(LAYERS, HEADS, HEAD_DIM, kv_dtype))
    feeds = {ROWS: np.array(rows), VECTOR_SCATTER: np.array([by_vector]), **buffers, **new}
    outputs = write.run([written_name(n) for n in names], feeds)
    others = [r for r in range(total) if r not in rows]
    for name, out in zip(names, outputs, strict=True):
        np.testing.assert_array_equal(out[rows, :, :source], new[update_name(name)])
        assert not out[rows, :, source:].any()
        np.testing.assert_array_equal(out[others], buffers[name][others])


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 4)),
        min_size=1,
        max_size=4,
        unique_by=lambda pair: pair[0],
    ),
    by_vector=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cache_copy_continues_source_rows_in_their_target_rows(
    pairs: list[tuple[int, int]], by_vector: bool, seed: int
) -> None:
    """Beam search's copy: every target row becomes its source row as it was before the call
    (a row can be a source and a target at once), the other rows stay."""
    rng = np.random.default_rng(seed)
    names = kv_names("past", LAYERS)
    buffers = {n: rng.standard_normal((5, HEADS, 7, HEAD_DIM)).astype(np.float32) for n in names}
    rows, sources = (np.array(column) for column in zip(*pairs, strict=True))
    copy = session(cache_copy_model(LAYERS, HEADS, HEAD_DIM, "fp32"))
    outputs = copy.run(
        [written_name(n) for n in names],
        {ROWS: rows, SOURCE_ROWS: sources, VECTOR_SCATTER: np.array([by_vector]), **buffers},
    )
    others = [r for r in range(5) if r not in rows]
    for name, out in zip(names, outputs, strict=True):
        np.testing.assert_array_equal(out[rows], buffers[name][sources])
        np.testing.assert_array_equal(out[others], buffers[name][others])


@pytest.mark.parametrize("by_vector", [True, False])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("graph", ["cache_write", "cache_copy"])
def test_scatters_write_a_vector_per_index_on_a_gpu_and_a_row_on_the_cpu(
    graph: str, kv_dtype: str, by_vector: bool
) -> None:
    """ONNX Runtime's CUDA ScatterND copies each index's slice in one thread: whole rows as
    slices ran a join's writes in one thread per row (0.6-1.7 ms per buffer on an H100), so
    with ``vector_scatter`` (the server sets it on a GPU) each scatter's indices, made outputs
    of the graph and run, address single vectors, [n, a, b, 3] for updates [n, a, b, c]; without
    it (the CPU, whose kernel pays per index) rows, [n, 1]."""
    build = cache_write_model if graph == "cache_write" else cache_copy_model
    model = build(LAYERS, HEADS, HEAD_DIM, kv_dtype)
    scatters = [n for n in model.graph.node if n.op_type == "ScatterND"]
    assert len(scatters) == len(cache_buffer_names("past", LAYERS, kv_dtype))
    watched = sorted({n.input[1] for n in scatters} | {n.input[2] for n in scatters})
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in watched)
    rng = np.random.default_rng(0)
    rows = np.array([3, 1])
    if kv_dtype == "int8":
        buffers = int8_buffers(rng, 4, 6)
        if graph == "cache_write":
            buffers = {n.replace("past_", "cross_"): b for n, b in buffers.items()}
    else:
        dtype = np.float32 if kv_dtype == "fp32" else np.float16
        prefix = "cross" if graph == "cache_write" else "past"
        buffers = {
            n: rng.standard_normal((4, HEADS, 6, HEAD_DIM)).astype(dtype)
            for n in kv_names(prefix, LAYERS)
        }
    feeds: dict[str, np.ndarray] = {ROWS: rows, VECTOR_SCATTER: np.array([by_vector]), **buffers}
    if graph == "cache_write":
        update = np.float32 if kv_dtype == "int8" else next(iter(buffers.values())).dtype
        for name in kv_names("cross", LAYERS):
            feeds[update_name(name)] = rng.standard_normal((2, HEADS, 3, HEAD_DIM)).astype(update)
    else:
        feeds[SOURCE_ROWS] = np.array([0, 0])
    values = dict(zip(watched, session(model).run(watched, feeds), strict=True))
    for scatter in scatters:
        indices, updates = values[scatter.input[1]], values[scatter.input[2]]
        if by_vector:
            assert indices.shape == (*updates.shape[:3], 3)
            assert (indices[..., 0] == rows[:, None, None]).all()
        else:
            np.testing.assert_array_equal(indices, rows[:, None])


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "int8"])
def test_helper_graphs_load_without_warnings(kv_dtype: str, capfd: pytest.CaptureFixture) -> None:
    """No constant that no node reads (ONNX Runtime warned of each one whenever a server loaded
    the graphs), the ``If`` branches' reads counted."""
    capfd.readouterr()
    for build in (cache_write_model, cache_copy_model, cache_resize_model):
        session(build(LAYERS, HEADS, HEAD_DIM, kv_dtype))
    assert "Removing initializer" not in capfd.readouterr().err
