"""Device-resident decoding on ONNX Runtime: the in-place decoder's buffers and bound runs.

The KV cache and the cross-attention keys / values live on the execution provider's device as
preallocated tensors of ``rows x ...``; every call binds the leading rows it needs by address
(IO binding), so nothing is copied between calls:

- ``step``: the in-place decoder graph writes each row's new key / value into the cache where it
  lies (its ``present_*`` outputs are bound to the ``past_*`` buffers); only the token ids and
  the per-row lengths go in, only the logits come out;
- ``step_greedy``: the same step, then the ``greedy_pick`` graph over its logits where they lie:
  only each row's argmax and its logit come to the host; the logits stay on the device until
  ``last_logits`` asks for them;
- ``block`` (exports with ``--decode-block K``): K such greedy steps in one run
  (``serving.backends.decode_block``);
- ``write_cross``: a joining request's encoder output goes into its rows (``cache_write`` graph);
- ``copy_rows``: beam search continues a row in another (``cache_copy`` graph);
- ``resize``: a cache re-laid out at another width when its longest row needs it
  (``cache_resize`` graph).

The same code runs on the CPU (buffers in host memory, bound zero-copy) and on CUDA (buffers in
device memory); ``contract.graphs`` documents the three graphs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from contract.graphs import (
    CACHE_COPY,
    CACHE_RESIZE,
    CACHE_WRITE,
    DECODER_BLOCK,
    DECODER_INPLACE,
    GREEDY_IDS,
    GREEDY_LOGIT,
    GREEDY_NO_EOS,
    GREEDY_PICK,
    LOGITS,
    ROWS,
    SOURCE_ROWS,
    VECTOR_SCATTER,
    WIDTH,
    cache_buffer_names,
    kv_names,
    present_name,
    resize_buffer_names,
    update_name,
    written_name,
)
from contract.model_config import DecoderSpec
from serving.backends.base import BackendError
from serving.backends.cache_buffers import (
    NUMPY_TYPES,
    CacheBuffer,
    Device,
    cache_buffers,
    pick_masks,
)
from serving.backends.captured_steps import CapturedSteps, captures_cuda_graphs
from serving.backends.decode_block import DecodeBlock
from serving.backends.host_memory import CudaHost, pinned_empty
from serving.backends.onnxruntime import run_bound

INPLACE_GRAPHS = (DECODER_INPLACE, CACHE_COPY, CACHE_WRITE, CACHE_RESIZE)


class InPlaceDecoder:
    """The in-place decoder, its cache graphs and their device buffers for one model.

    The self-attention caches are ``rows x capacity`` positions, the cross-attention ones
    ``rows x source_capacity``; each is bound at its current width (``past_width``,
    ``source_width``), which the caller keeps as small as the longest row needs, because ONNX
    Runtime's attention kernels read the whole bound width (``resize`` re-lays a cache out).

    Args:
        sessions: ONNX Runtime sessions of the graphs in ``INPLACE_GRAPHS``
            (``OnnxRuntimeBackend.session``).
        spec: the model's decoder facts (layers, heads, head size, vocabulary).
        rows: cache rows (the most sequences decoded at once).
        capacity: cache positions per row (the most tokens one sequence feeds the decoder).
        source_capacity: cross-attention positions per row (the longest encoder output).
        fixed_bindings: run steps at fixed addresses (``captured_steps``), as CUDA graphs need;
            None: when the decoder's session captures CUDA graphs.
        device_greedy: greedy steps pick their tokens with the ``greedy_pick`` graph (when
            ``sessions`` has it); None: on a device only (on the CPU numpy's argmax over the
            logits in host memory is cheaper: ``export/greedy_pick.py``).

    Raises:
        BackendError: a graph is missing or its inputs are not the in-place contract's.
    """

    def __init__(
        self,
        sessions: Mapping[str, ort.InferenceSession],
        spec: DecoderSpec,
        rows: int,
        capacity: int,
        source_capacity: int,
        fixed_bindings: bool | None = None,
        device_greedy: bool | None = None,
    ) -> None:
        missing = [g for g in INPLACE_GRAPHS if g not in sessions]
        if missing:
            raise BackendError(f"in-place decoding needs the graphs {missing}; re-export the model")
        self.decoder = sessions[DECODER_INPLACE]
        self.copier = sessions[CACHE_COPY]
        self.writer = sessions[CACHE_WRITE]
        self.resizer = sessions[CACHE_RESIZE]
        self.device = Device.of(self.decoder)
        self.rows, self.capacity, self.source_capacity = rows, capacity, source_capacity
        past_names = kv_names("past", spec.num_layers)
        types = {i.name: i.type for i in self.decoder.get_inputs()}
        if past_names[0] not in types or "cache_lengths" not in types:
            raise BackendError(f"{DECODER_INPLACE} does not take the in-place decoder's inputs")
        self.kv_dtype = NUMPY_TYPES.get(types[past_names[0]], np.float32)
        layout = "int8" if self.kv_dtype == np.int8 else "float"
        # cache_write takes the encoder's cross keys / values: float, also for an int8 cache
        self.update_dtype = np.float32 if layout == "int8" else self.kv_dtype
        layers, device = spec.num_layers, self.device
        past = cache_buffer_names("past", layers, layout)
        cross = cache_buffer_names("cross", layers, layout)
        self.past = cache_buffers(past, layout, types, spec, rows, capacity, device)
        self.cross = cache_buffers(cross, layout, types, spec, rows, source_capacity, device)
        self.updates = [update_name(n) for n in kv_names("cross", layers)]  # cache_write's inputs
        # its ONNX type ("tensor(float)"): an OrtValue of it is bound as it is
        self.update_type = next(k for k, v in NUMPY_TYPES.items() if v == self.update_dtype)
        # CPU float buffers take a joiner's cross keys / values by numpy assignment into their
        # host memory: what ``cache_write`` does, without a graph run per admission
        self.host_writes = device.kind == "cpu" and layout == "float"
        # the helper graphs' scatters write a vector per index on a GPU (its ScatterND copies an
        # index's slice in one thread), a row per index on the CPU (``contract.graphs``)
        self.vector_scatter = device.kind != "cpu"
        # where the encoder leaves a joiner's cross keys / values for ``write_cross``: on the
        # cache's device (None: the host, as numpy arrays)
        self.encoder_device = None if device.kind == "cpu" else (device.kind, device.index)
        # on CUDA the logits come back into page-locked memory where the runtime allows
        self.host = CudaHost.load() if device.kind == "cuda" else None
        self.logits = pinned_empty((rows, 1, spec.vocab_size), self.host)
        self.picker = sessions.get(GREEDY_PICK)  # exports since 2026-11-26
        if device_greedy is None:
            device_greedy = device.kind != "cpu"
        self.greedy = self.picker is not None and device_greedy  # step_greedy can run
        self.suppressed = np.asarray(spec.suppress_ids, dtype=np.int64)
        self.eos_id = spec.eos_id
        self._masks = pick_masks(spec, device) if self.greedy else {}
        self.greedy_ids = pinned_empty((rows, 1), self.host, np.int64)
        self.greedy_logit = pinned_empty((rows, 1), self.host)
        self._device_logits: ort.OrtValue | None = None  # greedy steps' logits on a device
        # per kind of step (logits left on the device or not): the binding of the latest shape
        self._bound: dict[bool, tuple[tuple[int, int, int], ort.IOBinding]] = {}
        self._picks: dict[tuple[int, int], ort.IOBinding] = {}  # (rows, logits' address)
        # the cache writer's and copier's bindings of the buffers at their latest width
        self._helpers: dict[str, tuple[int, ort.IOBinding]] = {}
        self._last: tuple[int, ort.IOBinding | None] = (0, None)  # rows, binding of device logits
        self.bytes = sum(b.nbytes for b in (*self.past.values(), *self.cross.values()))
        if fixed_bindings is None:
            fixed_bindings = captures_cuda_graphs(self.decoder)
        self.captured = (
            CapturedSteps(
                self.decoder,
                (device.kind, device.index),
                spec.vocab_size,
                host=self.host,
            )
            if fixed_bindings
            else None
        )
        block = sessions.get(DECODER_BLOCK)  # exports with --decode-block
        self.block = (
            DecodeBlock(block, spec, self.past, self.cross, device, rows, self.host, fixed_bindings)
            if block is not None
            else None
        )

    @property
    def past_width(self) -> int:
        return next(iter(self.past.values())).width

    @property
    def source_width(self) -> int:
        return next(iter(self.cross.values())).width

    def step(
        self, input_ids: np.ndarray, cache_lengths: np.ndarray, cross_lengths: np.ndarray
    ) -> np.ndarray:
        """One decoder step over rows ``[0, len(input_ids))``.

        Args:
            input_ids: (B,) int64 the new token of every row.
            cache_lengths: (B,) int64 tokens already in each row's cache (where the new one goes;
                below ``past_width``).
            cross_lengths: (B,) int64 real source positions per row (1..``source_width``).

        Returns:
            The logits (B, vocab) of the new tokens, a view of a buffer the next step reuses.
        """
        batch = len(input_ids)
        if self.captured is not None:
            return self._captured_step(batch, input_ids, cache_lengths, cross_lengths)
        self._run_step(batch, input_ids, cache_lengths, cross_lengths, device_logits=False)
        return self.logits[:batch, 0]

    def step_greedy(
        self,
        input_ids: np.ndarray,
        cache_lengths: np.ndarray,
        cross_lengths: np.ndarray,
        no_eos: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``step``, returning each row's greedy token (B,) int64 and its logit (B,) float32,
        picked by the ``greedy_pick`` graph where the logits lie (``self.greedy``): never a
        suppressed id, not EOS where ``no_eos`` (B,) bool; the logit -inf where nothing is
        allowed, NaN where the row holds a NaN. On a device only those come to the host;
        ``last_logits`` fetches the logits if a row needs them. Both are views of buffers the
        next step reuses."""
        if not self.greedy or self.picker is None:
            raise BackendError(f"this model has no {GREEDY_PICK} graph or does not pick with it")
        batch = len(input_ids)
        if self.captured is not None:
            feeds = self._feeds(input_ids, cache_lengths, cross_lengths)
            try:
                logits = self.captured.run_on_device(
                    self._shape_key(batch), batch, lambda io: self._bind_caches(io, batch), feeds
                )
            except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
                raise BackendError(f"{DECODER_INPLACE} graph failed: {err}") from err
            kind, pointer = logits.device_name(), logits.data_ptr()
        else:
            on_device = self.device.kind != "cpu"
            io = self._run_step(batch, input_ids, cache_lengths, cross_lengths, on_device)
            if on_device:
                io.synchronize_outputs()  # the pick may run on another stream
                kind, pointer = self.device.kind, self._logits_on_device().data_ptr()
            else:
                kind, pointer = "cpu", self.logits.ctypes.data
        self._pick(batch, kind, pointer, no_eos)
        return self.greedy_ids[:batch, 0], self.greedy_logit[:batch, 0]

    def _pick(self, batch: int, kind: str, pointer: int, no_eos: np.ndarray) -> None:
        """Run ``greedy_pick`` over the logits of ``batch`` rows at ``pointer``."""
        assert self.picker is not None
        io = self._picks.get((batch, pointer))
        if io is None:
            io = self.picker.io_binding()
            index = self.device.index if kind != "cpu" else 0
            dims = [batch, 1, self.logits.shape[-1]]
            io.bind_input(LOGITS, kind, index, np.float32, dims, pointer)
            for name, (_, value) in self._masks.items():
                io.bind_ortvalue_input(name, value)
            for name, host in ((GREEDY_IDS, self.greedy_ids), (GREEDY_LOGIT, self.greedy_logit)):
                io.bind_output(name, "cpu", 0, host.dtype, [batch, 1], host.ctypes.data)
            self._picks[(batch, pointer)] = io
        rows_no_eos = np.ascontiguousarray(no_eos, dtype=bool).reshape(batch, 1, 1)
        io.bind_cpu_input(GREEDY_NO_EOS, rows_no_eos)
        self._run(self.picker, io, GREEDY_PICK)

    def last_logits(self) -> np.ndarray:
        """The logits (B, vocab) of the latest step, copied from the device where a greedy step
        left them there (a view of a buffer the next step reuses)."""
        if self.captured is not None:
            return self.captured.last_logits()[:, 0]
        batch, io = self._last
        if io is not None and self._device_logits is not None:
            io.synchronize_outputs()  # the copy runs on another stream than ONNX Runtime's
            if self.host is not None:
                self.host.copy_to_host(self.logits[:batch], self._device_logits.data_ptr())
            else:
                self.logits[:batch] = self._device_logits.numpy()[:batch]
            self._last = (batch, None)  # on the host now
        return self.logits[:batch, 0]

    def _run_step(
        self,
        batch: int,
        input_ids: np.ndarray,
        cache_lengths: np.ndarray,
        cross_lengths: np.ndarray,
        device_logits: bool,
    ) -> ort.IOBinding:
        io = self._step_binding(batch, device_logits)
        for name, value in self._feeds(input_ids, cache_lengths, cross_lengths).items():
            io.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        self._run(self.decoder, io, DECODER_INPLACE)
        self._last = (batch, io if device_logits else None)
        return io

    @staticmethod
    def _feeds(
        input_ids: np.ndarray, cache_lengths: np.ndarray, cross_lengths: np.ndarray
    ) -> dict[str, np.ndarray]:
        return {
            "input_ids": input_ids[:, None],
            "cache_lengths": cache_lengths,
            "cross_lengths": cross_lengths,
        }

    def _shape_key(self, batch: int) -> tuple[int, int, int]:
        return (batch, self.past_width, self.source_width)

    def _step_binding(self, batch: int, device_logits: bool) -> ort.IOBinding:
        """The decoder's binding of the caches and outputs for ``batch`` rows at the current
        widths: kept from the previous step of its kind while those stay the same (a step then
        rebinds only its three small inputs), built again when a join, a leave or a re-layout
        changes them. The logits go to the host, or with ``device_logits`` stay on the
        device."""
        key = self._shape_key(batch)
        bound = self._bound.get(device_logits)
        if bound is not None and bound[0] == key:
            return bound[1]
        io = self.decoder.io_binding()
        self._bind_caches(io, batch)
        dims = [batch, 1, self.logits.shape[-1]]
        if device_logits:
            value = self._logits_on_device()
            kind, index = self.device.kind, self.device.index
            io.bind_output(LOGITS, kind, index, np.float32, dims, value.data_ptr())
        else:
            io.bind_output(LOGITS, "cpu", 0, np.float32, dims, self.logits.ctypes.data)
        self._bound[device_logits] = (key, io)
        return io

    def _logits_on_device(self) -> ort.OrtValue:
        if self._device_logits is None:
            kind, index = self.device.kind, self.device.index
            dims = list(self.logits.shape)
            self._device_logits = ort.OrtValue.ortvalue_from_shape_and_type(
                dims, np.float32, kind, index
            )
        return self._device_logits

    def _bind_caches(self, io: ort.IOBinding, batch: int) -> None:
        for name, buffer in self.past.items():
            buffer.bind(io, name, batch)
            buffer.bind(io, present_name(name), batch, output=True)
        for name, buffer in self.cross.items():
            buffer.bind(io, name, batch)

    def _captured_step(
        self,
        batch: int,
        input_ids: np.ndarray,
        cache_lengths: np.ndarray,
        cross_lengths: np.ndarray,
    ) -> np.ndarray:
        """``step`` through the fixed bindings of its shape (one CUDA graph per shape)."""
        assert self.captured is not None
        key = self._shape_key(batch)
        feeds = self._feeds(input_ids, cache_lengths, cross_lengths)
        try:
            logits = self.captured.run(key, batch, lambda io: self._bind_caches(io, batch), feeds)
        except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
            raise BackendError(f"{DECODER_INPLACE} graph failed: {err}") from err
        return logits[:, 0]

    def write_cross(self, rows: np.ndarray, cross: list[np.ndarray | ort.OrtValue]) -> None:
        """Write the cross keys / values of new rows (each (n, H, S, D), S <= source_width),
        zero-padded to the buffers' width. OrtValues (the encoder's, left on the cache's device:
        ``encoder_device``) are bound as they are when of the writer's type."""
        if self.host_writes:
            cross = [on_host(values) for values in cross]
            # one row by a plain index (a view): half the cost of the indexed copy
            where, one = (int(rows[0]), 0) if len(rows) == 1 else (rows, slice(None))
            for buffer, values in zip(self.cross.values(), cross, strict=True):
                host, length = buffer.host(), values.shape[2]
                host[where, :, :length] = values[one]
                host[where, :, length:] = 0
            return
        io = self._helper_binding(CACHE_WRITE, self.writer, self.cross)
        io.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        for name, values in zip(self.updates, cross, strict=True):
            if isinstance(values, ort.OrtValue) and values.data_type() == self.update_type:
                io.bind_ortvalue_input(name, values)
            else:
                io.bind_cpu_input(name, np.ascontiguousarray(on_host(values), self.update_dtype))
        self._run(self.writer, io, CACHE_WRITE)

    def copy_rows(self, rows: np.ndarray, source_rows: np.ndarray) -> None:
        """Make cache row ``rows[j]`` a copy of row ``source_rows[j]`` (every layer)."""
        io = self._helper_binding(CACHE_COPY, self.copier, self.past)
        io.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        io.bind_cpu_input(SOURCE_ROWS, np.ascontiguousarray(source_rows, dtype=np.int64))
        self._run(self.copier, io, CACHE_COPY)

    def _helper_binding(
        self, graph: str, session: ort.InferenceSession, buffers: dict[str, CacheBuffer]
    ) -> ort.IOBinding:
        """``session``'s binding of ``buffers`` (all rows, in place: each is input and output),
        kept while their width stays: a call then binds only its own small inputs. Building it
        costs a dozen Python-level binds, about 0.2 ms here, once per admission or beam step."""
        width = next(iter(buffers.values())).width
        kept = self._helpers.get(graph)
        if kept is not None and kept[0] == width:
            return kept[1]
        io = session.io_binding()
        for name, buffer in buffers.items():
            buffer.bind(io, name, self.rows)
            buffer.bind(io, written_name(name), self.rows, output=True)
        if VECTOR_SCATTER in {i.name for i in session.get_inputs()}:  # exports since 2026-11-27
            io.bind_cpu_input(VECTOR_SCATTER, np.array([self.vector_scatter]))
        self._helpers[graph] = (width, io)
        return io

    def resize(self, which: str, width: int, rows: int) -> None:
        """Re-lay out the ``past`` or ``cross`` caches at ``width`` positions, keeping the data of
        the leading ``rows`` (cut or zero-padded along the sequence axis).

        On the CPU in host memory (``CacheBuffer.relayout``); on a device, two runs of
        ``cache_resize``: into scratch tensors the runtime allocates on the device, then back
        into the buffers at the new width (old and new layouts overlap in memory).
        """
        buffers = list((self.past if which == "past" else self.cross).values())
        limit = buffers[0].max_width
        if not 1 <= width <= limit:
            raise ValueError(f"{which} width {width} is outside 1..{limit}")
        if rows and self.device.kind == "cpu":
            for buffer in buffers:
                buffer.relayout(width, rows)
        elif rows:
            self.resize_with_graph(buffers, width, rows)
        for buffer in buffers:
            buffer.width = width

    def resize_with_graph(self, buffers: list[CacheBuffer], width: int, rows: int) -> None:
        """``resize`` through the ``cache_resize`` graph, as on a device (tests run it on the
        CPU too, against ``CacheBuffer.relayout``)."""
        names = resize_buffer_names(len(buffers))
        target = np.array([width], dtype=np.int64)
        io = self.resizer.io_binding()
        io.bind_cpu_input(WIDTH, target)
        for name, buffer in zip(names, buffers, strict=True):
            buffer.bind(io, name, rows)
            io.bind_output(written_name(name), self.device.kind, self.device.index)
        self._run(self.resizer, io, CACHE_RESIZE)
        scratch = io.get_outputs()
        for buffer in buffers:
            buffer.width = width
        io = self.resizer.io_binding()
        io.bind_cpu_input(WIDTH, target)
        for name, value, buffer in zip(names, scratch, buffers, strict=True):
            io.bind_ortvalue_input(name, value)
            buffer.bind(io, written_name(name), rows, output=True)
        self._run(self.resizer, io, CACHE_RESIZE)

    _run = staticmethod(run_bound)


def on_host(values: np.ndarray | ort.OrtValue) -> np.ndarray:
    """``values`` as a numpy array (an OrtValue copied from its device)."""
    return values.numpy() if isinstance(values, ort.OrtValue) else values
