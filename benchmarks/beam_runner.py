"""attnserve's beam search as ``benchmarks.beam_search`` times it: the served engine itself.

Beam search lives in the in-flight engine (``BeamSearch`` per request, the cache rows of its beams
reordered through ``cache_copy`` after each step), so this runner loads an exported entry as the
server does (``make_backends``, ``serve``, the server's ONNX Runtime settings for the device),
starts its engine and submits one request per source row with ``beam_size`` beams (1: greedy) and
exactly ``new_tokens`` new tokens (``min_new_tokens`` = ``max_new_tokens``), all at once, as a
batch of clients would; ``controls`` are further decoding options (``repetition_penalty``,
``no_repeat_ngram_size``: ``benchmarks.repetition_controls``; ``prefix_tokens``: each row's
first source tokens as its target prefix).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers import Runner


def beam_runner_name(precision: str, beam_size: int, instances: int, threads: int) -> str:
    """The results' key, e.g. ``attnserve-int8-beam4`` (``attnserve-int8-greedy`` for one beam)
    or, for one-thread instances, ``attnserve-int8-beam4-2x1``."""
    split = f"-{instances}x{threads // instances}" if instances > 1 else ""
    search = f"beam{beam_size}" if beam_size > 1 else "greedy"
    return f"attnserve-{precision}-{search}{split}"


class AttnServeBeamRunner(Runner):
    """The served engine's beam search over ``entry`` on ``device`` (``threads`` intra-op
    threads, or ``instances`` engines sharing them, ``batching.instances``), with cache rows for
    ``max_batch`` requests of ``beam_size`` beams (per instance)."""

    def __init__(
        self,
        entry: Path,
        precision: str,
        new_tokens: int,
        beam_size: int,
        threads: int,
        max_batch: int,
        instances: int = 1,
        device: str = "cpu",
        controls: dict[str, Any] | None = None,
    ) -> None:
        from benchmarks.serve_offline import served_config
        from contract.repository import resolve_version
        from serving.repository import make_backends
        from serving.served import serve

        config = served_config(entry, max(1, threads // instances), device)
        # a sampled row with num_alternatives is that many more sequences, decoded side by side
        samples = 1 + int((controls or {}).get("num_alternatives", 0)) * (beam_size == 1)
        rows = max_batch * beam_size * samples
        batching = replace(
            config.batching,
            instances=instances,
            max_batch_size=max_batch,
            max_active_sequences=max(rows, config.batching.max_active_sequences),
            token_budget=max(config.batching.token_budget, rows * 2 * new_tokens),
            max_queue_size=max(config.batching.max_queue_size, max_batch * samples),
        )
        prefix = int((controls or {}).get("prefix_tokens", 0))  # counts toward the limit
        limits = replace(
            config.limits, max_new_tokens=max(config.limits.max_new_tokens, new_tokens + prefix)
        )
        config = replace(config, batching=batching, limits=limits)
        version = resolve_version(entry)
        super().__init__(
            name=beam_runner_name(precision, beam_size, instances, threads),
            family="attnserve",
            precision=precision,
            label=f"attnserve {precision}, the served engine's beam search ({beam_size} beams)",
            config={
                "entry": str(entry),
                "beam_size": beam_size,
                "threads": threads,
                "instances": instances,
                "device": device,
                "max_active_sequences": batching.max_active_sequences,
                "kv_cache": config.onnxruntime.kv_cache,
                "controls": controls or {},
            },
        )
        first, *more = make_backends(config, version)
        self.model: Any = serve(config, version, first, more_backends=more)
        self.new_tokens = new_tokens
        self.beam_size = beam_size
        self.controls = dict(controls or {})  # repetition_penalty, no_repeat_ngram_size
        self.prefix_tokens = int(self.controls.pop("prefix_tokens", 0))
        # bad words as token ids (the served model tokenizes a request's texts into these)
        self.bad_words = tuple(tuple(w) for w in self.controls.pop("bad_words_ids", ()))
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.model.start())

    async def _generate(self, ids: np.ndarray) -> list[Any]:
        from serving.generation.options import DecodingOptions

        n = self.new_tokens
        options = DecodingOptions(
            max_new_tokens=n, min_new_tokens=n, beam_size=self.beam_size, **self.controls
        )
        k = self.prefix_tokens
        requests = [
            self.model.request(options, source_ids=row, prefix=tuple(row[:k].tolist()))
            for row in ids
        ]
        for request in requests:
            request.bad_words = self.bad_words
        return list(await asyncio.gather(*(self.model.generate(r) for r in requests)))

    def run(self, ids: np.ndarray) -> np.ndarray:
        results = self.loop.run_until_complete(self._generate(np.asarray(ids, dtype=np.int64)))
        out = np.full((len(results), self.new_tokens), -1, dtype=np.int64)
        for row, result in enumerate(results):
            tokens = result.token_ids[self.prefix_tokens :][: self.new_tokens]
            out[row, : len(tokens)] = tokens
        return out

    def close(self) -> None:
        self.loop.run_until_complete(self.model.stop())
        self.loop.close()
