"""What one `attnserve bench engine` run measures: ``EngineSettings`` and the engine families."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.marian import BASE, TINY, MarianShape

FAMILIES = ("attnserve", "ctranslate2", "hf")


@dataclass
class EngineSettings:
    """What one engine benchmark run measures."""

    shape: MarianShape = BASE
    source_length: int = 32
    new_tokens: int = 64
    batches: tuple[int, ...] = (1, 8, 16, 32)
    repetitions: int = 3
    warmup: int = 1
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    device: str = "cpu"
    engines: tuple[str, ...] = FAMILIES  # families to run
    precisions: tuple[str, ...] = ("fp32", "int8")
    # the in-place decoder's attentions per precision (``contract.graphs.DECODE_ATTENTIONS``);
    # None: the precision's default, and on the CPU also the other one for fp32 and int8
    decode_attentions: tuple[str, ...] | None = None
    # greedy steps per decode block (batching.decode_block): the in-place runners again in blocks
    # of this many steps; 0: not
    decode_block: int = 0
    pause_s: float = 0.2  # idle time before each timed run (lets spinning thread pools sleep)
    # A timed run during which other processes used more than this share of the machine's CPU
    # is discarded (recorded) and repeated, at most ``noise_retries`` times. None: keep all.
    max_foreign_share: float | None = 0.10
    noise_retries: int = 3
    isolate: bool = True  # each engine in its own worker process
    seed: int = 0
    tiny: bool = False
    fast_int8: bool = False  # int8 = quantised copy of the fp32 export (no second trace)

    @classmethod
    def tiny_settings(cls, **overrides: Any) -> EngineSettings:
        """The CI configuration: 2-layer d64 Marian, source 8, 8 new tokens, batch 1 and 2."""
        base = cls(
            shape=TINY,
            source_length=8,
            new_tokens=8,
            batches=(1, 2),
            repetitions=1,
            warmup=1,
            pause_s=0.0,
            max_foreign_share=None,
            tiny=True,
            fast_int8=True,
        )
        return replace(base, **overrides)

    def check(self) -> None:
        """Raise ValueError for settings that cannot run."""
        if self.repetitions < 1 or self.warmup < 0:
            raise ValueError("--repetitions must be >= 1 and --warmup >= 0")
        if not self.batches or min(self.batches) < 1:
            raise ValueError("--batches must list sizes >= 1")
        if self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if self.source_length < 2 or self.new_tokens < 1:
            raise ValueError("--source-length must be >= 2 and --new-tokens >= 1")
        if self.source_length + 1 > self.shape.max_positions:
            raise ValueError(f"--source-length must be < {self.shape.max_positions}")
        if self.new_tokens + 1 > self.shape.max_positions:
            raise ValueError(f"--new-tokens must be < {self.shape.max_positions}")
        unknown = sorted(set(self.engines) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown engine(s) {unknown}; choose from {list(FAMILIES)}")
        bad = sorted(set(self.precisions) - {"fp32", "fp16", "int8"})
        if bad:
            raise ValueError(f"unknown precision(s) {bad}; choose from fp32, fp16, int8")
        if self.decode_attentions is not None:
            from contract.graphs import DECODE_ATTENTIONS

            wrong = sorted(set(self.decode_attentions) - set(DECODE_ATTENTIONS))
            if wrong or not self.decode_attentions:
                raise ValueError(
                    f"--decode-attentions must list {', '.join(DECODE_ATTENTIONS)} (got "
                    f"{list(self.decode_attentions)})"
                )
        if self.decode_block and not 2 <= self.decode_block <= 16:
            raise ValueError(f"--decode-block takes 2-16 steps (or 0), not {self.decode_block}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError("--device must be cpu or cuda")
        if "fp16" in self.precisions and self.device != "cuda":
            raise ValueError(
                "fp16 runs with --device cuda only (CTranslate2 has no fp16 compute on the CPU)"
            )
