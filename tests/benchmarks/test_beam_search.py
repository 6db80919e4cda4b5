"""``python -m benchmarks.beam_search``: attnserve's served beam search against CTranslate2 and HF
``generate`` on the tiny Marian model, each in its own process, and the served engine's beams
giving HF's best hypotheses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import beam_search

PEERS = importlib.util.find_spec("ctranslate2") and importlib.util.find_spec("transformers")


def probe(out: Path, *args: str) -> dict:
    """Run the probe on the tiny model, one round, and read the one JSON it wrote."""
    assert beam_search.main(["--tiny", "--repetitions", "1", "--out", str(out), *args]) == 0
    (path,) = out.glob("beam-search-*-tiny.json")
    return json.loads(path.read_text())


@pytest.mark.skipif(not PEERS, reason="needs ctranslate2 and transformers (the peers)")
def test_every_runner_decodes_the_asked_length_and_ratios_are_recorded(tmp_path: Path) -> None:
    result = probe(
        tmp_path, "--precisions", "fp32", "--batches", "2", "--new-tokens", "6", "--beam-size", "3"
    )
    assert result["beam_size"] == 3 and result["new_tokens"] == 6
    (point,) = result["points"]
    rates = point["new_tokens_per_s"]
    assert "attnserve-fp32-beam3" in rates and "hf-generate-kv" in rates
    assert any(name.startswith("ctranslate2-fp32-") for name in rates)
    assert all(rate > 0 for rate in rates.values())
    for runs in point["runs"].values():  # every engine gave 2 rows of exactly 6 tokens
        assert runs["output_shape"] == [2, 6] and len(runs["runs_s"]) == 1
    best_ct2 = max(r for n, r in rates.items() if n.startswith("ctranslate2-"))
    ours = max(r for n, r in rates.items() if n.startswith("attnserve-"))
    assert point["vs_ctranslate2"] == pytest.approx(ours / best_ct2, 1e-2)
    assert point["vs_hf"] == pytest.approx(ours / rates["hf-generate-kv"], 1e-2)


@pytest.mark.skipif(not PEERS, reason="needs transformers (the reference)")
def test_the_served_beams_give_hf_generates_best_hypotheses() -> None:
    """The runner's tokens are the served engine's beam search, not a stand-in: on the tiny
    random Marian model they equal HF's 4-beam ``generate`` with the same fixed length."""
    from benchmarks.attnserve_runner import export_attnserve
    from benchmarks.beam_runner import AttnServeBeamRunner
    from benchmarks.marian import TINY, build_marian, default_cache, source_ids
    from benchmarks.peers import HFGenerateRunner

    cache = default_cache()
    marian_dir = build_marian(cache, TINY)
    entry = export_attnserve(marian_dir, cache, TINY, "fp32", fast_int8=True)
    ids = source_ids(np.random.default_rng(3), 3, 8, TINY)
    ours = AttnServeBeamRunner(entry, "fp32", 7, 4, threads=1, max_batch=3)
    try:
        served = ours.run(ids)
    finally:
        ours.close()
    hf = HFGenerateRunner(marian_dir, 7, use_cache=True, threads=1, beam_size=4)
    reference = hf.run(ids)
    assert served.shape == reference.shape == (3, 7)
    np.testing.assert_array_equal(served, reference)


def test_cuda_runs_or_says_why_not(tmp_path: Path) -> None:
    """On a GPU every engine runs; elsewhere each is skipped with its reason, and the file is
    written either way."""
    result = probe(
        tmp_path, "--device", "cuda", "--precisions", "fp16", "--batches", "1", "--new-tokens", "4"
    )
    (point,) = result["points"]
    ran = set(point["new_tokens_per_s"])
    skipped = {entry["engine"]: entry["reason"] for entry in result["skipped"]}
    for engine in ("attnserve-fp16-beam4", "hf-generate-kv-fp16"):
        assert (engine in ran) != (engine in skipped)
    assert not {"hf-generate-kv", "hf-generate-nokv"} & (ran | set(skipped))  # fp16 only
    assert all(reason for reason in skipped.values())
    assert ran or point["vs_ctranslate2"] is None


def test_options_outside_their_ranges_are_refused() -> None:
    for args in (["--beam-size", "1"], ["--precisions", "fp16"], ["--device", "cuda"]):
        with pytest.raises(SystemExit) as exit_:
            beam_search.main(args)  # int8 (a default) is not measured on CUDA
        assert exit_.value.code == 2


def test_a_runner_that_fails_is_recorded_and_the_rest_are_timed() -> None:
    class Works:
        name = "works"

        def run(self, ids: np.ndarray) -> np.ndarray:
            return np.zeros((len(ids), 3), dtype=np.int64)

        def timed_run(self, ids: np.ndarray) -> tuple[float, np.ndarray]:
            return 0.5, self.run(ids)

    class Fails(Works):
        name = "fails"

        def run(self, ids: np.ndarray) -> np.ndarray:
            raise RuntimeError("no kernel for this step")

    failed: list[dict[str, str]] = []
    timed = beam_search.time_runners([Fails(), Works()], np.zeros((2, 4)), 2, failed)
    assert set(timed) == {"works"} and timed["works"]["runs_s"] == [0.5, 0.5]
    assert failed == [{"engine": "fails", "reason": "RuntimeError: no kernel for this step"}]
