"""K greedy decoder steps in one ONNX Runtime run: the ``decoder_block`` graph on the in-place
decoder's buffers.

The graph (``export/decoder_block.py``) runs the in-place decoder and ``greedy_pick`` K times,
each step's pick fed to the next; its K cache outputs per buffer are bound to that buffer, so
every step writes in place and reads what the steps before it wrote. Only the token ids, the
lengths and each row's EOS ban go in; each row's K picks and their logits come out. Under CUDA
graphs (``captured_steps``) a block is one replayed graph: the host's part of a step (the run
call, the copies, the engine's bookkeeping) is paid once per K tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from contract.graphs import (
    BLOCK_EOS_AFTER,
    BLOCK_IDS,
    BLOCK_LOGIT,
    DECODER_BLOCK,
    block_present_name,
)
from contract.model_config import DecoderSpec
from serving.backends.base import BackendError
from serving.backends.cache_buffers import CacheBuffer, Device, pick_masks
from serving.backends.captured_steps import STEP_INPUTS, CapturedSteps
from serving.backends.host_memory import CudaHost, pinned_empty
from serving.backends.onnxruntime import run_bound

# the block's int64 inputs (name -> rank), packed as the rows of one tensor under CUDA graphs
BLOCK_INPUTS = {**STEP_INPUTS, BLOCK_EOS_AFTER: 1}


class DecodeBlock:
    """The ``decoder_block`` session bound to the in-place decoder's buffers.

    Args:
        session: the block graph's session (on the decoder's device).
        spec: the decoder facts (vocabulary, suppressed ids, EOS).
        past, cross: the in-place decoder's cache buffers (bound at their current widths).
        device: where they live.
        rows: cache rows (the most rows one block runs).
        host: page-locked host memory for the outputs' copies on CUDA (None: pageable).
        fixed_bindings: run at fixed addresses, one binding per shape (as CUDA graphs need).
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        spec: DecoderSpec,
        past: Mapping[str, CacheBuffer],
        cross: Mapping[str, CacheBuffer],
        device: Device,
        rows: int,
        host: CudaHost | None = None,
        fixed_bindings: bool = False,
    ) -> None:
        outputs = {o.name: o for o in session.get_outputs()}
        steps = outputs[BLOCK_IDS].shape[1] if BLOCK_IDS in outputs else None
        if not isinstance(steps, int) or steps < 2:
            raise BackendError(f"{DECODER_BLOCK} has no block_ids output of a fixed width")
        self.session, self.steps = session, steps
        self.past, self.cross, self.device = past, cross, device
        self._masks = pick_masks(spec, device)
        self.ids = pinned_empty((rows, steps), host, np.int64)
        self.best = pinned_empty((rows, steps), host)
        self._bound: tuple[tuple[int, int, int], ort.IOBinding] | None = None
        self.captured = (
            CapturedSteps(
                session,
                (device.kind, device.index),
                spec.vocab_size,
                host=host,
                inputs=BLOCK_INPUTS,
                outputs={BLOCK_IDS: ((steps,), np.int64), BLOCK_LOGIT: ((steps,), np.float32)},
            )
            if fixed_bindings
            else None
        )

    def run(
        self,
        input_ids: np.ndarray,
        cache_lengths: np.ndarray,
        cross_lengths: np.ndarray,
        eos_after: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``steps`` greedy steps over rows ``[0, len(input_ids))``.

        Args:
            input_ids, cache_lengths, cross_lengths: (B,) int64, as for one step.
            eos_after: (B,) int64 the block's first step at which each row may choose EOS.

        Returns:
            Each row's picks (B, steps) int64 and their logits (B, steps) float32 (-inf where no
            token was allowed, NaN where the row's logits held one): views of buffers the next
            block reuses. The caches then hold every step's keys and values.
        """
        batch = len(input_ids)
        feeds = {
            "input_ids": input_ids[:, None],
            "cache_lengths": cache_lengths,
            "cross_lengths": cross_lengths,
            BLOCK_EOS_AFTER: eos_after,
        }
        if self.captured is not None:
            key = self._shape_key(batch)
            try:
                self.captured.run(key, batch, lambda io: self._bind_caches(io, batch), feeds)
            except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
                raise BackendError(f"{DECODER_BLOCK} graph failed: {err}") from err
            ids, best = self.captured.last_outputs()
            return ids, best
        io = self._binding(batch)
        for name, value in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        run_bound(self.session, io, DECODER_BLOCK)
        return self.ids[:batch], self.best[:batch]

    def _shape_key(self, batch: int) -> tuple[int, int, int]:
        past, cross = next(iter(self.past.values())), next(iter(self.cross.values()))
        return (batch, past.width, cross.width)

    def _binding(self, batch: int) -> ort.IOBinding:
        """The binding of ``batch`` rows at the caches' widths, kept while they stay."""
        key = self._shape_key(batch)
        if self._bound is not None and self._bound[0] == key:
            return self._bound[1]
        io = self.session.io_binding()
        self._bind_caches(io, batch)
        for name, host in ((BLOCK_IDS, self.ids), (BLOCK_LOGIT, self.best)):
            io.bind_output(name, "cpu", 0, host.dtype, [batch, self.steps], host.ctypes.data)
        self._bound = (key, io)
        return io

    def _bind_caches(self, io: ort.IOBinding, batch: int) -> None:
        for name, buffer in self.past.items():
            buffer.bind(io, name, batch)
            for step in range(self.steps):
                buffer.bind(io, block_present_name(name, step), batch, output=True)
        for name, buffer in self.cross.items():
            buffer.bind(io, name, batch)
        for name, (_, value) in self._masks.items():
            io.bind_ortvalue_input(name, value)
