"""Peer engines for the engine benchmark: CTranslate2 and Hugging Face ``generate``.

Every runner takes the same input, a (batch, source) int64 array of token ids of the random
Marian model (``benchmarks.marian``), and returns a (batch, new_tokens) array of generated ids:
exactly ``new_tokens`` per row, EOS suppressed, greedy (or the best of a beam search with
``beam_size`` > 1: ``benchmarks.beam_search``). Runners are built once and timed many
times; ``run`` must do the whole job (encode and every decoder step) and nothing else.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class Unavailable(Exception):
    """The engine cannot run here (package missing, no CUDA, ...); the message says why."""


@dataclass
class Runner:
    """A benchmarked engine: ``run(ids) -> ids`` plus what the results record about it."""

    name: str  # unique key in the results, e.g. "ctranslate2-int8-2x1"
    family: str  # attnserve | ctranslate2 | hf
    precision: str  # fp32 | int8
    label: str  # human-readable
    config: dict[str, Any] = field(default_factory=dict)

    def run(self, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def timed_run(self, ids: np.ndarray) -> tuple[float, np.ndarray]:
        """(seconds, output) of one ``run``."""
        started = time.perf_counter()
        out = self.run(ids)
        return time.perf_counter() - started, out

    def close(self) -> None:
        """Release the engine's memory."""


def thread_splits(threads: int) -> list[tuple[int, int]]:
    """CTranslate2 (inter_threads, intra_threads) pairs using exactly ``threads`` threads.

    All threads in one translation (1 x N), and one thread per translation worker (N x 1),
    CTranslate2's fastest setting for batches when first measured on a 2-core AMD EPYC (inter 2
    x intra 1, 2026-11-21); both are measured in every run and the faster one is kept.
    """
    splits = [(1, threads)]
    if threads > 1:
        splits.append((threads, 1))
    return splits


# --- CTranslate2 --------------------------------------------------------------------------------


def ctranslate2_available(device: str) -> str | None:
    """None when CTranslate2 can run on ``device``, else the reason it cannot."""
    if importlib.util.find_spec("ctranslate2") is None:
        return "ctranslate2 is not installed (pip install 'ctranslate2>=4.5')"
    if device == "cuda":
        import ctranslate2

        if ctranslate2.get_cuda_device_count() == 0:
            return "ctranslate2 sees no CUDA device"
    return None


def convert_ctranslate2(marian_dir: Path, cache: Path, quantization: str) -> Path:
    """Convert the HF Marian directory once per quantisation (``CT2_TYPES``' values)."""
    from ctranslate2.converters import TransformersConverter

    target = Path(cache) / f"ct2-{Path(marian_dir).name}-{quantization}"
    if (target / "model.bin").is_file():
        return target
    scratch = target.with_name(target.name + ".partial")
    TransformersConverter(str(marian_dir)).convert(
        str(scratch), quantization=quantization, force=True
    )
    if target.exists():
        import shutil

        shutil.rmtree(target)
    scratch.rename(target)
    return target


CT2_TYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}  # precision -> CTranslate2's
CT2_ISA_VARIABLE = "CT2_FORCE_CPU_ISA"  # CTranslate2's override of the CPU kernels it picks
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")


def ct2_name(precision: str, inter: int, intra: int, cpu_isa: str | None = None) -> str:
    """The results' key of a CTranslate2 runner, e.g. ``ctranslate2-int8-2x1(-avx512)``."""
    return f"ctranslate2-{precision}-{inter}x{intra}" + (f"-{cpu_isa.lower()}" if cpu_isa else "")


def ct2_forced_isas(cpu_model: str, flags: set[str]) -> list[str]:
    """The CPU kernels to also run CTranslate2 with, besides its own pick.

    CTranslate2 picks its AVX-512 kernels on Intel CPUs only; on other CPUs with AVX-512 (AMD's
    Zen 4) it runs AVX2 unless ``CT2_FORCE_CPU_ISA=AVX512``, which a user there can set. On a
    2-core AMD EPYC (Zen 4) VM, 2026-11-27: int8 at batch 8 1,610-1,659 new tokens/s against
    1,404-1,440 with its pick, fp32 at batch 16 980-1,082 against 1,151-1,183, so both run and
    the faster one per precision is the peer.
    """
    if all(f in flags for f in AVX512_FLAGS) and "intel" not in cpu_model.lower():
        return ["AVX512"]
    return []


class CTranslate2Runner(Runner):
    """``ctranslate2.Translator.translate_batch`` on token strings, min = max decoding length
    (greedy, or ``beam_size`` beams)."""

    def __init__(
        self,
        model_dir: Path,
        vocabulary: list[str],
        precision: str,
        new_tokens: int,
        inter_threads: int,
        intra_threads: int,
        device: str = "cpu",
        cpu_isa: str | None = None,
        beam_size: int = 1,
        controls: dict[str, Any] | None = None,
    ) -> None:
        if cpu_isa is not None:
            # CTranslate2 reads it once per process, when it first picks its CPU kernels
            if "ctranslate2" in sys.modules:
                raise Unavailable(
                    f"{CT2_ISA_VARIABLE}={cpu_isa} needs a process of its own (isolated runners)"
                )
            os.environ[CT2_ISA_VARIABLE] = cpu_isa
        import ctranslate2

        compute_type = CT2_TYPES[precision]
        if device == "cuda" and precision == "int8":
            compute_type = "int8_float16"
        setup = f"inter {inter_threads} x intra {intra_threads}"
        if cpu_isa:
            setup += f", {CT2_ISA_VARIABLE}={cpu_isa}"
        super().__init__(
            name=ct2_name(precision, inter_threads, intra_threads, cpu_isa),
            family="ctranslate2",
            precision=precision,
            label=f"CTranslate2 {precision} ({setup})",
            config={
                "version": ctranslate2.__version__,
                "compute_type": compute_type,
                "inter_threads": inter_threads,
                "intra_threads": intra_threads,
                "device": device,
                "cpu_isa": cpu_isa or "auto",
                "beam_size": beam_size,
                "controls": controls or {},
            },
        )
        self.beam_size = beam_size
        # translate_batch's repetition_penalty, ...; ``prefix_tokens``: a target prefix of
        # each row's first source tokens (``target_prefix``)
        self.controls = dict(controls or {})
        self.prefix_tokens = int(self.controls.pop("prefix_tokens", 0))
        if bad := self.controls.pop("bad_words_ids", None):  # as tokens: suppress_sequences
            self.controls["suppress_sequences"] = [[vocabulary[i] for i in w] for w in bad]
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device=device,
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=intra_threads,
        )
        self.vocabulary = vocabulary
        self.index = {token: i for i, token in enumerate(vocabulary)}
        self.new_tokens = new_tokens
        self.inter_threads = inter_threads

    def run(self, ids: np.ndarray) -> np.ndarray:
        batch = [[self.vocabulary[i] for i in row] for row in ids.tolist()]
        # Split the batch evenly over the translation workers (inter_threads).
        per_worker = max(1, math.ceil(len(batch) / self.inter_threads))
        k = self.prefix_tokens  # its decoding lengths count the prefix
        prefix = {"target_prefix": [row[:k] for row in batch]} if k else {}
        results = self.translator.translate_batch(
            batch,
            beam_size=self.beam_size,
            max_batch_size=per_worker,
            batch_type="examples",
            min_decoding_length=self.new_tokens + k,
            max_decoding_length=self.new_tokens + k,
            **{"return_scores": False, **prefix, **self.controls},
        )
        return np.array(
            [[self.index.get(t, -1) for t in r.hypotheses[0][k:]] for r in results],
            dtype=np.int64,
        )

    def close(self) -> None:
        del self.translator


# --- Hugging Face transformers ------------------------------------------------------------------


def hf_available(device: str) -> str | None:
    """None when transformers + torch can run on ``device``, else why not."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
    return None


def hf_name(use_cache: bool, precision: str = "fp32") -> str:
    """``hf-generate-kv`` / ``-nokv``, with ``-fp16`` for the half-precision model."""
    return f"hf-generate-{'kv' if use_cache else 'nokv'}" + ("-fp16" if precision == "fp16" else "")


class HFGenerateRunner(Runner):
    """``MarianMTModel.generate``: greedy (or ``num_beams``), min_new_tokens = max_new_tokens,
    with / without cache."""

    def __init__(
        self,
        marian_dir: Path,
        new_tokens: int,
        use_cache: bool,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
        beam_size: int = 1,
        controls: dict[str, Any] | None = None,
    ) -> None:
        """``precision`` fp16: the model in half precision (on CUDA); ``beam_size`` > 1: beam
        search (``num_beams``), the best hypothesis returned; ``controls``: more ``generate``
        options (``repetition_penalty``, ``no_repeat_ngram_size``; ``prefix_tokens``: each
        row's first source tokens as a target prefix, ``decoder_input_ids`` after the start
        token)."""
        import torch
        import transformers

        super().__init__(
            name=hf_name(use_cache, precision),
            family="hf",
            precision=precision,
            label=f"HF transformers generate, {'KV cache' if use_cache else 'no KV cache'}"
            + (", fp16" if precision == "fp16" else ""),
            config={
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "use_cache": use_cache,
                "torch_threads": threads,
                "device": device,
                "beam_size": beam_size,
                "controls": controls or {},
            },
        )
        self.beam_size = beam_size
        self.controls = dict(controls or {})
        self.prefix_tokens = int(self.controls.pop("prefix_tokens", 0))
        torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        model = transformers.MarianMTModel.from_pretrained(str(marian_dir), local_files_only=True)
        if precision == "fp16":
            model = model.half()
        self.model = model.to(device).eval()  # type: ignore[arg-type]
        self.new_tokens = new_tokens
        self.use_cache = use_cache

    def run(self, ids: np.ndarray) -> np.ndarray:
        torch = self.torch
        input_ids = torch.from_numpy(ids).to(self.device)
        k = self.prefix_tokens
        prefix = {}
        if k:
            start = torch.full((len(ids), 1), self.model.config.decoder_start_token_id)
            prefix["decoder_input_ids"] = torch.cat([start, input_ids[:, :k].cpu()], 1).to(
                self.device
            )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=self.new_tokens,
                min_new_tokens=self.new_tokens,
                num_beams=self.beam_size,
                use_cache=self.use_cache,
                **prefix,
                **{"do_sample": False, **self.controls},
            )
        out = getattr(out, "sequences", out)  # return_dict_in_generate: a ModelOutput
        if self.device == "cuda":
            torch.cuda.synchronize()
        return out[:, 1 + k :].cpu().numpy()  # drop the decoder start token and the prefix

    def close(self) -> None:
        del self.model
