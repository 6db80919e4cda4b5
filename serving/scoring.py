"""Scoring given outputs: each target token's log-probability after its source, in one pass.

CTranslate2's ``score_batch``, fairseq's and Marian's scoring: the decoder reads the start
token and the whole target at once (teacher forcing) and every position's log-softmax gives
the next target token's log-probability, the last position's EOS's. What rerankers, filters of
parallel data and quality estimation ask of a translation model, and image-text matching of a
captioner.

A batch of pairs runs the encoder once and the multi-token ``decoder`` graph once (its past
empty), the targets right-padded (a padded position is masked and comes after every real one,
so causal attention never reads it). The log-probabilities are those generation reports with
``return_log_probs`` for the same tokens: the logits' log-softmax after the model's own token
rules (``DecoderSpec.suppress_ids`` never chosen), before any request's options.

The in-place decoder takes one position per row and step, so a server decoding through it
loads ``decoder.onnx`` for scoring on the first request (``ScoringGraphs``): a session of its
own, its weights held once more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from contract.graphs import DECODER, DECODER_FILE
from contract.model_config import DecoderSpec, OnnxRuntimeOptions
from serving.backends.base import Backend, BackendError
from serving.errors import FailedPrecondition
from serving.seq2seq import Seq2SeqRunner, padded_sources

log = logging.getLogger(__name__)


class ScoreItem(NamedTuple):
    """One pair to score."""

    source: np.ndarray  # the source's token ids (S,) int64, or an image's pixels (3, H, W)
    target: np.ndarray  # the target's token ids (T,) int64: no start token, no EOS


def result_array(positions: int, log_probs: np.ndarray) -> np.ndarray:
    """A scored pair as one float64 array (what the batcher returns, and what crosses from the
    engine process): the source's encoder positions (its tokens, or an image's patches), then
    the log-probabilities."""
    return np.concatenate([[float(positions)], log_probs.astype(np.float64)])


def from_result(result: np.ndarray) -> tuple[int, np.ndarray]:
    """``result_array``'s encoder positions and log-probabilities (float32)."""
    return int(result[0]), result[1:].astype(np.float32)


class ScoringGraphs:
    """The encoder and the multi-token decoder a scorer runs: the serving backend's own where it
    loaded ``decoder``; else ``decoder.onnx`` of the version folder, loaded on first use.

    Args:
        backend: the model's serving backend (its encoder runs the sources).
        version_dir: REPOSITORY/NAME/VERSION, where ``decoder.onnx`` lies.
        options: the model's ONNX Runtime settings, for a decoder session of its own.
        load: makes that backend (tests pass their own); default ``OnnxRuntimeBackend``.
    """

    def __init__(
        self,
        backend: Backend,
        version_dir: Path,
        options: OnnxRuntimeOptions,
        load: Callable[[Path, dict[str, str], OnnxRuntimeOptions], Backend] | None = None,
    ) -> None:
        self.backend = backend
        self.version_dir = version_dir
        self.options = options
        self._load = load
        self._decoder: Backend | None = backend if DECODER in backend.graphs() else None
        self._lock = threading.Lock()

    def decoder(self) -> Backend:
        """The backend whose ``decoder`` graph takes several positions per row.

        Raises:
            BackendError: ``decoder.onnx`` is missing or does not load.
        """
        if self._decoder is None:
            with self._lock:
                if self._decoder is None:
                    self._decoder = self._load_decoder()
        return self._decoder

    def _load_decoder(self) -> Backend:
        path = self.version_dir / DECODER_FILE
        if not path.is_file():
            raise BackendError(f"scoring needs {path}, which the export writes; re-export it")
        log.info("loading %s for scoring", path)
        if self._load is not None:
            return self._load(self.version_dir, {DECODER: DECODER_FILE}, self.options)
        from serving.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(self.version_dir, {DECODER: DECODER_FILE}, self.options)


class Scorer:
    """Scores batches of ``ScoreItem``: what a dynamic batcher's batch function calls.

    Args:
        graphs: the encoder and the multi-token decoder.
        spec: the decoder facts (start, end, padding and suppressed ids).
    """

    def __init__(self, graphs: ScoringGraphs, spec: DecoderSpec) -> None:
        self.graphs = graphs
        self.spec = spec
        self.encoder = Seq2SeqRunner(graphs.backend, spec)
        self._suppress = np.asarray(sorted(set(spec.suppress_ids)), dtype=np.int64)

    def score_batch(self, items: Sequence[ScoreItem]) -> list[np.ndarray | FailedPrecondition]:
        """Each item's result (``result_array``): its encoder positions, then its target tokens'
        log-probabilities and EOS's; FailedPrecondition for each where the version has no
        multi-token decoder to load (``decoder.onnx`` missing or unloadable).

        Raises:
            BackendError: a graph failed to run.
        """
        try:
            decoder = self.graphs.decoder()
        except BackendError as err:
            return [FailedPrecondition(f"this model version cannot score: {err}")] * len(items)
        sources = [item.source for item in items]
        if sources[0].dtype.kind in "iu":
            ids, mask = padded_sources(sources, self.spec.pad_id)
            encoded = self.encoder.encode({"input_ids": ids, "attention_mask": mask})
        else:
            pixels = np.stack(sources).astype(self.encoder.kv_dtype, copy=False)
            encoded = self.encoder.encode({"pixel_values": pixels})
        inputs, mask, chosen = self._decoder_inputs([item.target for item in items])
        runner = Seq2SeqRunner(decoder, self.spec)
        steps = np.broadcast_to(np.arange(inputs.shape[1], dtype=np.int64), inputs.shape)
        logits, _ = runner.step(
            inputs, np.ascontiguousarray(steps), mask, runner.empty_past(len(items)), encoded
        )
        positions = encoded.mask.sum(axis=1)
        ends = [len(item.target) + 1 for item in items]
        return [
            result_array(int(positions[r]), self._log_probs(logits[r, :end], chosen[r, :end]))
            for r, end in enumerate(ends)
        ]

    def _decoder_inputs(
        self, targets: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The decoder's input ids (start token, then the target), its mask (1 on real
        positions) and each position's next token (the target's, then EOS), right-padded."""
        length = max(len(t) for t in targets) + 1
        inputs = np.full((len(targets), length), self.spec.pad_id, dtype=np.int64)
        chosen = np.full((len(targets), length), self.spec.pad_id, dtype=np.int64)
        mask = np.zeros((len(targets), length), dtype=np.int64)
        inputs[:, 0] = self.spec.decoder_start_id
        for row, target in enumerate(targets):
            inputs[row, 1 : len(target) + 1] = target
            chosen[row, : len(target)] = target
            chosen[row, len(target)] = self.spec.eos_id
            mask[row, : len(target) + 1] = 1
        return inputs, mask, chosen

    def _log_probs(self, logits: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """log-softmax(logits)[i, chosen[i]] for every position, the suppressed ids removed."""
        x = logits.astype(np.float32)  # a copy: the suppressed ids are written over
        x[:, self._suppress[self._suppress < x.shape[1]]] = -np.inf
        top = x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(x - top).sum(axis=1)) + top[:, 0]
        return (x[np.arange(len(chosen)), chosen] - lse).astype(np.float32)
