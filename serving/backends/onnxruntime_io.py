"""Device-resident decoding on ONNX Runtime: the in-place decoder's buffers and bound runs.

The KV cache and the cross-attention keys / values live on the execution provider's device as
preallocated tensors of ``rows x ...``; every call binds the leading rows it needs by address
(IO binding), so nothing is copied between calls:

- ``step``: the in-place decoder graph writes each row's new key / value into the cache where it
  lies (its ``present_*`` outputs are bound to the ``past_*`` buffers); only the token ids and
  the per-row lengths go in, only the logits come out;
- ``write_cross``: a joining request's encoder output goes into its rows (``cache_write`` graph);
- ``copy_rows``: beam search continues a row in another (``cache_copy`` graph);
- ``resize``: a cache re-laid out at another width when its longest row needs it
  (``cache_resize`` graph).

The same code runs on the CPU (buffers in host memory, bound zero-copy) and on CUDA (buffers in
device memory); ``contract.graphs`` documents the three graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from contract.graphs import (
    CACHE_COPY,
    CACHE_RESIZE,
    CACHE_WRITE,
    DECODER_INPLACE,
    LOGITS,
    ROWS,
    SOURCE_ROWS,
    WIDTH,
    cache_buffer_names,
    kv_names,
    present_name,
    resize_buffer_names,
    update_name,
    vector_size,
    width_axis,
    written_name,
)
from contract.model_config import DecoderSpec
from serving.backends.base import BackendError
from serving.backends.captured_steps import CapturedSteps, captures_cuda_graphs
from serving.backends.host_memory import CudaHost, pinned_empty

CUDA_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
INPLACE_GRAPHS = (DECODER_INPLACE, CACHE_COPY, CACHE_WRITE, CACHE_RESIZE)
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}


@dataclass(frozen=True)
class Device:
    """Where a session computes: ``cpu``, or ``cuda`` with its index."""

    kind: str = "cpu"
    index: int = 0

    @classmethod
    def of(cls, session: ort.InferenceSession) -> Device:
        """The device of a session's first (preferred) execution provider."""
        first = session.get_providers()[0]
        if first in CUDA_PROVIDERS:
            options = session.get_provider_options().get(first, {})
            return cls("cuda", int(options.get("device_id", 0)))
        return cls("cpu", 0)


class CacheBuffer:
    """Memory on a device for ``rows x heads x max_width x inner`` values, laid out compactly for
    the current ``width`` <= ``max_width`` as ``[rows, heads, width, inner]``, or as
    ``[rows, heads, inner, width]`` when ``width_last`` (an int8 cache's transposed keys).

    ``inner`` is the head size, or 1 for an int8 cache's scales. The leading rows are bound to a
    graph by address (a contiguous prefix). Zero-filled, so that positions no row has written
    hold finite values.
    """

    def __init__(
        self,
        rows: int,
        heads: int,
        max_width: int,
        inner: int,
        dtype: type,
        device: Device,
        width_last: bool = False,
    ) -> None:
        self.rows, self.heads, self.max_width, self.inner = rows, heads, max_width, inner
        self.width_last = width_last
        self.width = max_width
        self.dtype = np.dtype(dtype)
        self.device = device
        zeros = np.zeros(rows * heads * max_width * inner, dtype=self.dtype)
        if device.kind == "cpu":
            self._host: np.ndarray | None = zeros  # the OrtValue below shares this memory
            self.value = ort.OrtValue.ortvalue_from_numpy(zeros)
        else:
            self._host = None
            self.value = ort.OrtValue.ortvalue_from_numpy(zeros, device.kind, device.index)
        self.pointer = self.value.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.rows * self.heads * self.max_width * self.inner * self.dtype.itemsize

    def shape(self, rows: int) -> list[int]:
        if self.width_last:
            return [rows, self.heads, self.inner, self.width]
        return [rows, self.heads, self.width, self.inner]

    def bind(self, io: ort.IOBinding, name: str, rows: int, *, output: bool = False) -> None:
        """Bind rows ``[0, rows)`` at the current width as input (or output) ``name``."""
        bind = io.bind_output if output else io.bind_input
        bind(name, self.device.kind, self.device.index, self.dtype, self.shape(rows), self.pointer)

    def relayout(self, width: int, rows: int) -> None:
        """Lay rows ``[0, rows)`` out again at ``width`` positions, in host memory (CPU buffers
        only): cut, or zero-padded along the position axis, as ``cache_resize`` does on a device.

        Every run of positions (per row and head, and per channel when ``width_last``) moves as
        one block of a 2-D view: two numpy copies, about twice as fast here as the two runs of
        ``cache_resize`` (4 rows of Marian-base, 32 -> 64 positions: 0.36 against 1.04 ms).
        """
        if self._host is None:
            raise RuntimeError("only CPU buffers are laid out again in host memory")
        step = 1 if self.width_last else self.inner
        blocks = rows * self.heads * (self.inner if self.width_last else 1)
        old, new = self.width * step, width * step
        kept = self._host[: blocks * old].reshape(blocks, old)[:, : min(old, new)].copy()
        target = self._host[: blocks * new].reshape(blocks, new)
        target[:, : kept.shape[1]] = kept
        target[:, kept.shape[1] :] = 0
        self.width = width

    def host(self) -> np.ndarray:
        """A numpy view of the current layout (CPU buffers only; tests look inside)."""
        if self._host is None:
            raise RuntimeError("only CPU buffers have a host view")
        shape = self.shape(self.rows)
        return self._host[: int(np.prod(shape))].reshape(shape)


def cache_buffers(
    names: list[str],
    layout: str,
    types: Mapping[str, str],
    spec: DecoderSpec,
    rows: int,
    width: int,
    device: Device,
) -> dict[str, CacheBuffer]:
    """The buffers of cache tensors ``names``, typed as the decoder graph takes them (``types``:
    input name -> ONNX type) and laid out as ``layout`` (``float`` | ``int8``: scales beside
    every buffer, keys transposed) lays them out.

    Raises:
        BackendError: the graph lacks one of them, or takes a type no cache is kept in.
    """
    unknown = [n for n in names if types.get(n) not in _NUMPY_TYPES]
    if unknown:
        raise BackendError(
            f"{DECODER_INPLACE} does not take the cache inputs {unknown} as float, float16 or "
            "int8 tensors; re-export the model"
        )
    buffers = {}
    for name in names:
        inner = vector_size(name, spec.head_dim)
        dtype = _NUMPY_TYPES[types[name]]
        width_last = width_axis(name, layout) == 3
        buffers[name] = CacheBuffer(rows, spec.num_heads, width, inner, dtype, device, width_last)
    return buffers


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
        self.kv_dtype = _NUMPY_TYPES.get(types[past_names[0]], np.float32)
        layout = "int8" if self.kv_dtype == np.int8 else "float"
        # cache_write takes the encoder's cross keys / values: float, also for an int8 cache
        self.update_dtype = np.float32 if layout == "int8" else self.kv_dtype
        layers, device = spec.num_layers, self.device
        past = cache_buffer_names("past", layers, layout)
        cross = cache_buffer_names("cross", layers, layout)
        self.past = cache_buffers(past, layout, types, spec, rows, capacity, device)
        self.cross = cache_buffers(cross, layout, types, spec, rows, source_capacity, device)
        self.updates = [update_name(n) for n in kv_names("cross", layers)]  # cache_write's inputs
        # on CUDA the logits come back into page-locked memory where the runtime allows
        self.host = CudaHost.load() if device.kind == "cuda" else None
        self.logits = pinned_empty((rows, 1, spec.vocab_size), self.host)
        self._bound: tuple[tuple[int, int, int], ort.IOBinding] | None = None
        self.bytes = sum(b.nbytes for b in (*self.past.values(), *self.cross.values()))
        if fixed_bindings is None:
            fixed_bindings = captures_cuda_graphs(self.decoder)
        self.captured = (
            CapturedSteps(
                self.decoder, (device.kind, device.index), spec.vocab_size, host=self.host
            )
            if fixed_bindings
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
        io = self._step_binding(batch)
        io.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids[:, None], dtype=np.int64))
        io.bind_cpu_input("cache_lengths", np.ascontiguousarray(cache_lengths, dtype=np.int64))
        io.bind_cpu_input("cross_lengths", np.ascontiguousarray(cross_lengths, dtype=np.int64))
        self._run(self.decoder, io, DECODER_INPLACE)
        return self.logits[:batch, 0]

    def _step_binding(self, batch: int) -> ort.IOBinding:
        """The decoder's binding of the caches and logits for ``batch`` rows at the current
        widths: kept from the previous step while those stay the same (a step then rebinds only
        its three small inputs), built again when a join, a leave or a re-layout changes them."""
        key = (batch, self.past_width, self.source_width)
        if self._bound is not None and self._bound[0] == key:
            return self._bound[1]
        io = self.decoder.io_binding()
        self._bind_caches(io, batch)
        logits = self.logits[:batch]
        io.bind_output(LOGITS, "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self._bound = (key, io)
        return io

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
        key = (batch, self.past_width, self.source_width)
        feeds = {
            "input_ids": input_ids[:, None],
            "cache_lengths": cache_lengths,
            "cross_lengths": cross_lengths,
        }
        try:
            logits = self.captured.run(key, batch, lambda io: self._bind_caches(io, batch), feeds)
        except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
            raise BackendError(f"{DECODER_INPLACE} graph failed: {err}") from err
        return logits[:, 0]

    def write_cross(self, rows: np.ndarray, cross: list[np.ndarray]) -> None:
        """Write the cross keys / values of new rows (each (n, H, S, D), S <= source_width)."""
        io = self.writer.io_binding()
        io.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        for name, buffer in self.cross.items():
            buffer.bind(io, name, self.rows)
            buffer.bind(io, written_name(name), self.rows, output=True)
        for name, values in zip(self.updates, cross, strict=True):
            io.bind_cpu_input(name, np.ascontiguousarray(values, dtype=self.update_dtype))
        self._run(self.writer, io, CACHE_WRITE)

    def copy_rows(self, rows: np.ndarray, source_rows: np.ndarray) -> None:
        """Make cache row ``rows[j]`` a copy of row ``source_rows[j]`` (every layer)."""
        io = self.copier.io_binding()
        io.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        io.bind_cpu_input(SOURCE_ROWS, np.ascontiguousarray(source_rows, dtype=np.int64))
        for name, buffer in self.past.items():
            buffer.bind(io, name, self.rows)
            buffer.bind(io, written_name(name), self.rows, output=True)
        self._run(self.copier, io, CACHE_COPY)

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

    @staticmethod
    def _run(session: ort.InferenceSession, io: ort.IOBinding, graph: str) -> None:
        try:
            session.run_with_iobinding(io)
        except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
            raise BackendError(f"{graph} graph failed: {err}") from err
