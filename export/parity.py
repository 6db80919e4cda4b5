"""Parity of exported graphs with PyTorch: per-graph output differences and greedy decoding.

Figures land in manifest.json; ``check`` turns them into a pass / fail with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from export.errors import ExportError
from export.serving_runner import DecodeCache, OnnxRuntimeBackend, Seq2SeqRunner, greedy
from export.spec import GraphSpec
from models.captioner import Captioner
from models.generation import greedy_generate
from models.translator import Translator
from models.vit import ViT

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "int8": None}  # int8 is judged on decoded outputs
MIN_GREEDY_AGREEMENT = {"fp32": 1.0, "fp16": 0.98, "int8": 0.95}


@dataclass
class ParityReport:
    """What manifest.json records under "parity"."""

    precision: str
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per graph, random inputs
    real_max_abs_diff: dict[str, float] = field(default_factory=dict)  # per graph, real inputs
    greedy_examples: int = 0
    greedy_identical: dict[str, int] = field(default_factory=dict)  # per KV cache (decoder graph)
    accuracy_examples: int = 0
    top1_identical: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "precision": self.precision,
            "tolerance": TOLERANCE[self.precision],
            "max_abs_diff": self.max_abs_diff,
            "real_max_abs_diff": self.real_max_abs_diff,
        }
        if self.greedy_examples:
            out["greedy_examples"] = self.greedy_examples
            out["greedy_identical"] = self.worst_greedy
            out["greedy_agreement"] = round(self.worst_greedy / self.greedy_examples, 4)
            out["greedy_identical_by_decoder"] = dict(self.greedy_identical)
        if self.accuracy_examples:
            out["top1_examples"] = self.accuracy_examples
            out["top1_identical"] = self.top1_identical
        return out

    @property
    def worst_greedy(self) -> int:
        """Identical greedy outputs of the decoder graph that matched PyTorch least often."""
        return min(self.greedy_identical.values(), default=0)

    def check(self) -> None:
        """Raise ExportError when a figure is outside tolerance."""
        tolerance = TOLERANCE[self.precision]
        if tolerance is not None:
            worst = {
                **self.max_abs_diff,
                **{f"{k} (real)": v for k, v in self.real_max_abs_diff.items()},
            }
            bad = {k: v for k, v in worst.items() if not v <= tolerance}
            if bad:
                raise ExportError(
                    f"parity check failed for {self.precision}: max abs diff "
                    + ", ".join(f"{k}={v:.3g}" for k, v in bad.items())
                    + f" > {tolerance}; the graph does not reproduce PyTorch — try another "
                    "--opset or precision, and report the model config"
                )
        agreement_needed = MIN_GREEDY_AGREEMENT[self.precision]
        for decoder, identical in self.greedy_identical.items():
            if identical / self.greedy_examples < agreement_needed:
                raise ExportError(
                    f"end-to-end parity failed for {self.precision}: greedy decoding through "
                    f"ONNX Runtime ({decoder} KV cache) matched PyTorch on {identical}/"
                    f"{self.greedy_examples} examples (need {agreement_needed:.0%})"
                )
        if self.accuracy_examples:
            agreement = self.top1_identical / self.accuracy_examples
            if agreement < agreement_needed:
                raise ExportError(
                    f"parity failed for {self.precision}: top-1 class matched PyTorch on "
                    f"{self.top1_identical}/{self.accuracy_examples} images"
                )


def _flat_numpy(values: Any) -> list[np.ndarray]:
    if isinstance(values, torch.Tensor):
        return [values.detach().numpy()]
    return [a for v in values for a in _flat_numpy(v)]


def _as_feeds(spec: GraphSpec, example: tuple, dtype: Any) -> dict[str, np.ndarray]:
    arrays = _flat_numpy(example)
    feeds = {}
    for name, array in zip(spec.input_names, arrays, strict=True):
        feeds[name] = array.astype(dtype) if array.dtype == np.float32 else array
    return feeds


def _max_diff(reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
    return max(
        float(np.abs(r.astype(np.float64) - o.astype(np.float64)).max())
        for r, o in zip(reference, outputs, strict=True)
    )


@torch.no_grad()
def random_input_parity(
    specs: list[GraphSpec], backend: OnnxRuntimeBackend, kv_dtype: Any, seeds: int = 3
) -> dict[str, float]:
    """Max |torch - ORT| over every output of every graph, for a few random ragged batches."""
    result: dict[str, float] = {}
    for spec in specs:
        worst = 0.0
        for seed in range(seeds):
            example = spec.example_inputs(torch.Generator().manual_seed(100 + seed))
            reference = _flat_numpy(spec.module(*example))
            outputs = backend.run(spec.name, _as_feeds(spec, example, kv_dtype))
            worst = max(worst, _max_diff(reference, [outputs[n] for n in spec.output_names]))
        result[spec.name] = worst
    return result


@torch.no_grad()
def seq2seq_real_parity(
    model: Translator | Captioner,
    runner: Seq2SeqRunner,
    caches: dict[str, DecodeCache],
    torch_inputs: tuple[torch.Tensor, ...],
    targets: list[list[int]],
    report: ParityReport,
    max_new_tokens: int,
) -> None:
    """Real held-out inputs: encoder outputs, teacher-forced decoder logits, greedy tokens
    through every KV cache (decoder graph) the server may use."""
    config = model.config
    memory, cross = model.encode(*torch_inputs)
    if len(torch_inputs) == 2:
        feeds = {"input_ids": torch_inputs[0].numpy(), "attention_mask": torch_inputs[1].numpy()}
        mask = torch_inputs[1]
    else:
        feeds = {"pixel_values": torch_inputs[0].numpy().astype(_np_float(runner))}
        mask = torch.ones(memory.shape[:2], dtype=torch.long)
    encoded = runner.encode(feeds)
    reference = [t.numpy() for kv in cross for t in kv]
    _record(report.real_max_abs_diff, "encoder", _max_diff(reference, encoded.cross))

    # Teacher-forced decoder pass over the reference targets (start token + target).
    length = max(len(t) for t in targets) + 1
    batch = len(targets)
    ids = np.full((batch, length), config.pad_id, dtype=np.int64)
    ids[:, 0] = config.decoder_start_id
    self_mask = np.zeros((batch, length), dtype=np.int64)
    for row, target in enumerate(targets):
        ids[row, 1 : len(target) + 1] = target
        self_mask[row, : len(target) + 1] = 1
    positions = np.broadcast_to(np.arange(length), (batch, length)).astype(np.int64)
    logits, _ = runner.step(ids, positions, self_mask, runner.empty_past(batch), encoded)
    empty = model.decoder.empty_past(batch, memory)
    torch_logits, _ = model.decode_step(
        torch.from_numpy(ids),
        torch.from_numpy(positions),
        empty,
        torch.from_numpy(self_mask),
        cross,
        mask,
    )
    real = self_mask.astype(bool)
    decoder_diff = np.abs(torch_logits.numpy()[real] - logits[real].astype(np.float32)).max()
    _record(report.real_max_abs_diff, "decoder", float(decoder_diff))

    expected = greedy_generate(
        model,
        cross,
        mask,
        max_new_tokens=max_new_tokens,
        start_id=config.decoder_start_id,
        eos_id=config.eos_id,
    )
    report.greedy_examples += batch
    for decoder, cache in caches.items():
        produced = greedy(cache, encoded, runner.spec, max_new_tokens)
        same = sum(a == b for a, b in zip(expected, produced, strict=True))
        report.greedy_identical[decoder] = report.greedy_identical.get(decoder, 0) + same


@torch.no_grad()
def classifier_real_parity(
    model: ViT,
    backend: OnnxRuntimeBackend,
    pixels: torch.Tensor,
    report: ParityReport,
    dtype: Any,
) -> None:
    """Real held-out images: logits difference and identical top-1 classes."""
    reference = model(pixels).numpy()
    logits = backend.run("model", {"pixel_values": pixels.numpy().astype(dtype)})["logits"]
    _record(report.real_max_abs_diff, "model", _max_diff([reference], [logits]))
    report.accuracy_examples += len(pixels)
    report.top1_identical += int((reference.argmax(-1) == logits.argmax(-1)).sum())


def _record(figures: dict[str, float], graph: str, value: float) -> None:
    """Keep the worst figure over all batches."""
    figures[graph] = max(figures.get(graph, 0.0), value)


def _np_float(runner: Seq2SeqRunner) -> Any:
    return runner.kv_dtype
