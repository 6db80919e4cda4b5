"""The int8 cache's decode attention, run in ONNX Runtime against numpy doing the same integer
arithmetic: its integer GEMMs must be exact on every CPU, including AVX2 without VNNI, where
ONNX Runtime's uint8 x int8 kernel saturates on full-range uint8 inputs."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st

from export.kv_int8 import decode_attention_model
from tests.export.test_cache_graphs import quantized

HEADS = 2
_SESSIONS: dict[int, ort.InferenceSession] = {}


def attention(head_dim: int) -> ort.InferenceSession:
    if head_dim not in _SESSIONS:
        _SESSIONS[head_dim] = ort.InferenceSession(
            decode_attention_model(HEADS, head_dim).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
    return _SESSIONS[head_dim]


def numpy_attention(feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The graph's arithmetic in numpy (int64 GEMMs, no saturation); also each row's weight
    scale (one step of the quantised weights)."""
    head_dim = feeds["query"].shape[-1]
    query = feeds["query"] * np.float32(1 / math.sqrt(head_dim))
    query_i, query_scale = quantized(query)
    scores = (query_i.astype(np.int64) @ feeds["key"].astype(np.int64)).astype(np.float32)
    scores = scores * (feeds["key_scale"] * query_scale) + feeds["mask"]
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    weights = weights * np.swapaxes(feeds["value_scale"], -1, -2)
    weights_i, weights_scale = quantized(weights)  # >= 0: 0..127
    out = (weights_i.astype(np.int64) @ feeds["value"].astype(np.int64)).astype(np.float32)
    return out * weights_scale, weights_scale


def feeds_for(
    rng: np.random.Generator, batch: int, width: int, head_dim: int, lengths: list[int], top: bool
) -> dict[str, np.ndarray]:
    """Random int8 keys / values (``top``: every one at +127, the worst case for saturation)."""

    def int8(shape: tuple[int, ...]) -> np.ndarray:
        if top:
            return np.full(shape, 127, np.int8)
        return rng.integers(-127, 128, shape).astype(np.int8)

    positions = np.arange(width)[None, :] < np.array(lengths)[:, None]
    return {
        "query": rng.uniform(-2, 2, (batch, HEADS, 1, head_dim)).astype(np.float32),
        "key": int8((batch, HEADS, head_dim, width)),
        "key_scale": rng.uniform(0.001, 0.05, (batch, HEADS, 1, width)).astype(np.float32),
        "value": int8((batch, HEADS, width, head_dim)),
        "value_scale": rng.uniform(0.001, 0.05, (batch, HEADS, width, 1)).astype(np.float32),
        "mask": np.where(positions, 0.0, -1e30).astype(np.float32)[:, None, None, :],
    }


def check(feeds: dict[str, np.ndarray]) -> None:
    ours = attention(feeds["query"].shape[-1]).run(None, feeds)[0]
    expected, weights_scale = numpy_attention(feeds)
    # float rounding may move one quantised weight by one step: at most one step of the
    # weights times the largest |value|
    assert np.all(np.abs(ours - expected) <= 1.01 * weights_scale * 127 + 1e-6)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    width=st.integers(1, 48),
    head_dim=st.sampled_from([4, 16, 64]),
    top=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_int8_decode_attention_is_numpys_integer_arithmetic(
    batch: int, width: int, head_dim: int, top: bool, seed: int, data: st.DataObject
) -> None:
    lengths = data.draw(st.lists(st.integers(1, width), min_size=batch, max_size=batch))
    check(feeds_for(np.random.default_rng(seed), batch, width, head_dim, lengths, top))


def test_full_scale_keys_and_values_do_not_saturate() -> None:
    """Every key and value at +127 and an even softmax: each pair of products in a uint8 x int8
    GEMM would be 255 * 127 * 2 with 8-bit weights, past int16 (VPMADDUBSW on AVX2)."""
    rng = np.random.default_rng(0)
    feeds = feeds_for(rng, 2, 32, 64, [32, 32], top=True)
    feeds["query"][:] = 0.5
    feeds["key_scale"][:] = feeds["value_scale"][:] = 0.01
    check(feeds)
    ours = attention(64).run(None, feeds)[0]
    np.testing.assert_allclose(ours, 1.27, rtol=1e-3)  # the mean of values all 127 * 0.01
