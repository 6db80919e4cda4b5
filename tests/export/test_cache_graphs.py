"""The in-place cache's helper graphs, run in ONNX Runtime against numpy's answer."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.graphs import WIDTH, resize_buffer_names, written_name
from export.cache_graphs import cache_resize_model

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
    names = resize_buffer_names(LAYERS)
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
