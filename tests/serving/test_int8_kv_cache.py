"""Serving through an int8 KV cache: int8 buffers with their scales, keys transposed, written in
place, re-laid out and copied like the float cache, and in-flight decoding on top."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.graphs import cache_buffer_names, is_scale, scale_name
from export.exporter import ExportOptions, export
from serving.backends.base import BackendError
from serving.backends.cache_buffers import cache_buffers
from serving.client import AttnServeClient
from serving.engine.requests import GenerationRequest
from tests.serving.server_thread import ServerThread
from tests.serving.test_inplace_cache import decode_all, load, translator_jobs
from tests.serving.test_server import EXPECTED


def encode(runner, ids: list[int]):
    array = np.array([ids])
    return runner.encode({"input_ids": array, "attention_mask": np.ones_like(array)})


def test_a_step_writes_int8_keys_and_scales_in_place(int8_repository: Path) -> None:
    _, runner, cache = load(int8_repository / "kv8")
    encoded = encode(runner, [9, 10, 11, 2])
    cache.admit(encoded, [1]), cache.admit(encoded, [2])
    keys = cache.decoder.past["past_key.0"]
    key_scales = cache.decoder.past[scale_name("past_key.0")]
    values = cache.decoder.past["past_value.1"]
    assert keys.dtype == np.int8 and key_scales.dtype == np.float32
    address = keys.value.data_ptr()
    rows = np.array([0, 1, 2])
    cache.step(rows, np.array([1, 1, 1]), np.array([0, 0, 0]))
    cache.step(rows, np.array([5, 6, 7]), np.array([1, 1, 1]))
    assert keys.value.data_ptr() == address  # the same memory, written in place
    k, s, v = keys.host(), key_scales.host(), values.host()
    width = cache.decoder.past_width
    assert k.shape[2:] == (cache.decoder.past["past_key.0"].inner, width)  # [.., head_dim, width]
    assert s.shape[2:] == (1, width) and v.shape[2] == width
    assert (s[rows, :, 0, :2] > 0).all()  # positions 0 and 1 have scales for every row
    assert k[rows, :, :, :2].any(axis=(1, 2)).all()
    assert not s[:, :, :, 2:].any() and not k[3:].any() and not v[:, :, 2:].any()
    # each stored vector uses the int8 range: its largest magnitude is 127
    assert (np.abs(k[rows, :, :, :2].astype(np.int32)).max(axis=2) == 127).all()
    cache.reorder(np.array([1, 2]), np.array([2, 2]))  # beam: row 1 continues row 2
    np.testing.assert_array_equal(k[1], k[2])
    np.testing.assert_array_equal(s[1], s[2])
    cache.release(np.array([0, 1, 2]))
    assert cache.rows == 0 and cache.tokens == 0


def test_int8_caches_widen_and_narrow_keeping_values_and_scales(int8_repository: Path) -> None:
    _, runner, cache = load(int8_repository / "kv8")
    decoder = cache.decoder
    short = encode(runner, [9, 10, 2])
    (a,), (b,) = cache.admit(short, [1]), cache.admit(short, [1])
    assert decoder.past_width == 8
    for position in range(10):  # row a decodes 10 tokens, row b only the first 3
        rows = np.concatenate([a, b]) if position < 3 else a
        cache.step(rows, np.full(len(rows), 5 + position), np.full(len(rows), position))
    assert decoder.past_width == 16 and cache.relayouts == 1
    keys = decoder.past["past_key.1"].host()[:2, :, :, :10].copy()
    scales = decoder.past[scale_name("past_key.1")].host()[:2, :, :, :10].copy()
    assert (scales[0] > 0).all() and (scales[1, :, :, :3] > 0).all()
    cache.release(a)  # the longest row leaves: back to 8 positions, row b's 3 kept
    assert decoder.past_width == 8
    np.testing.assert_array_equal(decoder.past["past_key.1"].host()[1, :, :, :3], keys[1, :, :, :3])
    kept = decoder.past[scale_name("past_key.1")].host()[1, :, :, :3]
    np.testing.assert_array_equal(kept, scales[1, :, :, :3])
    cache.release(b)
    assert cache.rows == 0


def test_in_flight_requests_finish_through_the_int8_cache(int8_repository: Path) -> None:
    """Greedy, beam and sampling requests joining at staggered times all finish, within their
    limits, and give every row back; greedy ones mostly choose the float cache's tokens."""
    jobs = translator_jobs()
    results = {}
    for name in ("float", "kv8"):
        config, runner, cache = load(int8_repository / name)
        requests = [GenerationRequest(options=o, source_ids=ids) for ids, o in jobs]
        results[name] = decode_all(config, runner, cache, requests)
        assert cache.rows == 0 and cache.tokens == 0
    for (_, options), event in zip(jobs, results["kv8"], strict=True):
        assert options.min_new_tokens <= len(event.tokens) <= options.max_new_tokens
        if options.beam_size > 1:
            assert len(event.alternatives) == options.num_alternatives
    greedy = [i for i, (_, o) in enumerate(jobs) if o.beam_size == 1 and o.temperature == 0]
    same = [results["kv8"][i].tokens == results["float"][i].tokens for i in greedy]
    assert np.mean(same) >= 0.5, same


@pytest.mark.parametrize(("kv_cache_dtype", "attention"), [("int8", "int8"), ("float", "matmul")])
def test_the_shipped_translator_serves_right_answers_at_int8(
    tmp_path: Path, kv_cache_dtype: str, attention: str
) -> None:
    """The trained translator at int8, with the int8 cache and with the float one (whose
    attention an int8 export writes as MatMuls), a real server, real clients."""
    options = ExportOptions(precision="int8", kv_cache_dtype=kv_cache_dtype, parity_examples=100)
    result = export("translator", tmp_path, options)
    assert result.manifest["decoders"]["inplace"]["kv_dtype"] == kv_cache_dtype
    assert result.manifest["decoders"]["inplace"]["decode_attention"] == attention
    with ServerThread(tmp_path) as server, AttnServeClient(server.address) as client:
        for language, expected in EXPECTED.items():
            (answer,) = client.translate(["three hundred and twelve"], to=language)
            assert answer.text == expected and answer.finish_reason == "stop"
        texts = ["seven hundred and forty-one", "twelve", "nine thousand and three"]
        greedy = client.translate(texts, to="fr")
        beams = client.translate(texts, to="fr", beam_size=4)
        assert [a.text for a in beams] == [a.text for a in greedy]
        streamed = "".join(client.translate_stream(texts[0], to="fr"))
        assert streamed == greedy[0].text


def test_a_graph_without_the_scales_is_refused(int8_repository: Path) -> None:
    config, _, cache = load(int8_repository / "kv8")
    names = cache_buffer_names("past", config.decoder.num_layers, "int8")
    types = {n: "tensor(int8)" for n in names if not is_scale(n)}  # the scales missing
    with pytest.raises(BackendError, match=r"does not take the cache inputs \['past_key.0_scale'"):
        cache_buffers(names, "int8", types, config.decoder, 2, 8, cache.decoder.device)
