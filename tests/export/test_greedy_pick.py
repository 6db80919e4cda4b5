"""The greedy pick graph (``export/greedy_pick.py``): ONNX Runtime's masked argmax and winning
logit against the host's greedy step, on any logits and masks; and every seq2seq export writes
it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from contract.graphs import (
    GREEDY_EOS,
    GREEDY_IDS,
    GREEDY_LOGIT,
    GREEDY_NO_EOS,
    GREEDY_PICK_FILE,
    GREEDY_SUPPRESSED,
    LOGITS,
)
from contract.repository import resolve_version
from export.greedy_pick import greedy_pick_model
from serving.engine.decode_cache import GreedyStep

VOCAB = 7


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    model = greedy_pick_model().SerializeToString()
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def pick(session, logits: np.ndarray, suppressed, eos_id: int, no_eos: np.ndarray):
    """The graph's (ids, logit) per row."""
    vocab = logits.shape[-1]
    masks = np.zeros((2, 1, 1, vocab), dtype=bool)
    masks[0, 0, 0, list(suppressed)] = True
    masks[1, 0, 0, eos_id] = True
    feeds = {
        LOGITS: logits,
        GREEDY_SUPPRESSED: masks[0],
        GREEDY_EOS: masks[1],
        GREEDY_NO_EOS: no_eos.reshape(-1, 1, 1),
    }
    ids, best = session.run([GREEDY_IDS, GREEDY_LOGIT], feeds)
    return ids[:, 0], best[:, 0]


VALUES = st.one_of(
    st.floats(-8, 8, width=32),
    st.sampled_from([0.0, 1.0, np.inf, -np.inf, np.nan]),  # ties and special values
)


@st.composite
def pick_inputs(draw):
    batch = draw(st.integers(1, 6))
    logits = draw(arrays(np.float32, (batch, 1, VOCAB), elements=VALUES))
    eos_id = draw(st.integers(0, VOCAB - 1))
    others = [i for i in range(VOCAB) if i != eos_id]
    suppressed = draw(st.lists(st.sampled_from(others), unique=True, max_size=3))
    no_eos = draw(arrays(np.bool_, batch))
    return logits, np.asarray(sorted(suppressed), dtype=np.int64), eos_id, no_eos


@settings(max_examples=150, deadline=None)
@given(pick_inputs())
def test_the_pick_is_the_hosts_greedy_step(session, inputs) -> None:
    """The graph agrees with the host path (``GreedyStep.of_logits``: numpy's argmax, again
    without the banned tokens where one won) wherever its logit is a number; a row holding a
    NaN says NaN in both (the sampler then decides from the logits)."""
    logits, suppressed, eos_id, no_eos = inputs
    ids, best = pick(session, logits, suppressed, eos_id, no_eos)
    assert ids.dtype == np.int64 and best.dtype == np.float32
    host = GreedyStep.of_logits(logits[:, 0], suppressed, eos_id, no_eos)
    for j, row in enumerate(logits[:, 0]):
        if np.isnan(row).any():
            assert np.isnan(best[j]) and np.isnan(host.best[j])
        elif not np.isnan(best[j]):
            assert ids[j] == host.tokens[j] and best[j] == host.best[j]
            assert ids[j] not in suppressed or best[j] == -np.inf  # -inf: nothing allowed
            assert not (no_eos[j] and ids[j] == eos_id) or best[j] == -np.inf
        else:  # NaN without a NaN: only +inf and -inf together sum to one
            assert np.isposinf(row).any() and np.isneginf(row).any()


def test_any_vocabulary_and_batch(session) -> None:
    logits = np.random.default_rng(0).standard_normal((5, 1, 1000)).astype(np.float32)
    no_eos = np.zeros(5, dtype=bool)
    ids, best = pick(session, logits, [], 3, no_eos)
    assert ids.tolist() == logits[:, 0].argmax(-1).tolist()
    assert np.array_equal(best, logits[:, 0].max(-1))
    logits[:, 0, 3] = 100.0  # EOS wins unless the row may not end
    no_eos[[1, 4]] = True
    ids, _ = pick(session, logits, [], 3, no_eos)
    assert [i == 3 for i in ids] == [True, False, True, True, False]


@pytest.mark.parametrize("entry", ["translator", "captioner"])
def test_every_seq2seq_export_writes_it(tiny_repository: Path, entry: str) -> None:
    version = resolve_version(tiny_repository / entry)
    manifest = json.loads((version / "manifest.json").read_text())
    assert GREEDY_PICK_FILE in manifest["files"]
    assert GREEDY_PICK_FILE in manifest["decoders"]["inplace"]["cache_graphs"]
    assert (version / GREEDY_PICK_FILE).is_file()


def test_its_ir_version_is_one_older_runtimes_read() -> None:
    """Written with the IR version of the cache graphs, not the onnx package's own: a newer
    onnx (IR 14) made a graph onnxruntime-gpu 1.31 refused (at most IR 13) on an H100."""
    model = greedy_pick_model()
    assert model.ir_version == 9
    onnx.checker.check_model(model)
