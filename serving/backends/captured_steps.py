"""Decode steps at fixed addresses, which ONNX Runtime can capture and replay as CUDA graphs.

A CUDA graph replays the kernels of one captured run on the same device memory, so a step that
is to be replayed may not bind anything new: its token ids, lengths and logits live in tensors
made once per step shape (batch rows and cache widths), and each step overwrites its inputs in
place before ONNX Runtime runs the graph of that shape. The three inputs are bound as the rows of
one (3, batch) int64 tensor, which a step fills with one copy (``OrtValue.update_inplace``, from
page-locked memory on CUDA): each copy to a GPU is a synchronous call of its own, three per step
before. The run option ``gpu_graph_id`` names the graph; ONNX Runtime's CUDA provider
(``enable_cuda_graph``) captures a graph id's run after its warm-up runs and replays it from then
on. The KV cache buffers are fixed already (``cache_buffers.CacheBuffer``).

The same bindings run on the CPU, where there is nothing to capture; the tests check them there.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from contract.graphs import LOGITS
from serving.backends.host_memory import CudaHost, pinned_empty

log = logging.getLogger(__name__)

GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run option: the graph a run captures or replays
# the step's int64 inputs in the rows of its packed tensor: name -> rank ((batch, 1) or (batch,))
STEP_INPUTS = {"input_ids": 2, "cache_lengths": 1, "cross_lengths": 1}
CUDA_GRAPH_OPTION = "enable_cuda_graph"  # the CUDA provider's option that turns capture on
# Graph ids are unique in the process (from 1: 0 is ONNX Runtime's own, -1 means "no graph"), so
# that two decoders on one session could never replay each other's graphs.
_GRAPH_IDS = itertools.count(1)
NO_GRAPH = -1  # the run option value that runs without capturing or replaying
MAX_GRAPHS = 64  # captured graphs per decoder; each holds its step's device memory


def captures_cuda_graphs(session: ort.InferenceSession) -> bool:
    """Whether ``session`` runs on the CUDA provider with CUDA graph capture on."""
    options = session.get_provider_options().get("CUDAExecutionProvider", {})
    first = session.get_providers()[0]
    return first == "CUDAExecutionProvider" and options.get(CUDA_GRAPH_OPTION) == "1"


@dataclass
class _Shape:
    """One step shape's binding: its inputs and outputs, and the graph id it runs as."""

    io: ort.IOBinding
    packed: ort.OrtValue  # the inputs, one row of the step's inputs each: (inputs, batch) int64
    staging: np.ndarray  # the host side of ``packed`` (page-locked where ``CudaHost`` can)
    outputs: list[ort.OrtValue]  # the first is the logits of a plain step
    host_outputs: list[np.ndarray] | None  # the CPU outputs' memory (read without a copy)
    run_options: ort.RunOptions
    graph_id: int
    pinned: list[np.ndarray] | None = None  # page-locked host copies of device outputs

    @property
    def logits(self) -> ort.OrtValue:
        return self.outputs[0]


class CapturedSteps:
    """Per step shape, a binding whose every tensor keeps its address from step to step.

    Args:
        session: the in-place decoder's session.
        device: ``cpu`` or ``cuda``, and the device index.
        vocab_size: the logits' last dimension.
        max_graphs: shapes beyond this many still run at fixed addresses, but without a graph
            (batch buckets x cache widths can make hundreds of shapes on a large model).
        host: the CUDA runtime's page-locked host buffers, which device logits are copied into
            (None: copied into a new pageable array every step).
        inputs: the step's int64 inputs, name -> rank ((batch, 1) or (batch,)), bound as the
            rows of one tensor (default ``STEP_INPUTS``).
        outputs: the step's outputs, name -> (shape per row, dtype) (default the logits,
            ((1, vocab_size), float32)).
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        device: tuple[str, int],
        vocab_size: int,
        max_graphs: int = MAX_GRAPHS,
        host: CudaHost | None = None,
        inputs: Mapping[str, int] | None = None,
        outputs: Mapping[str, tuple[tuple[int, ...], type]] | None = None,
    ):
        self.session = session
        self.inputs = dict(STEP_INPUTS if inputs is None else inputs)
        self.outputs = dict({LOGITS: ((1, vocab_size), np.float32)} if outputs is None else outputs)
        self.host = host
        self.kind, self.index = device
        self.vocab_size = vocab_size
        self.max_graphs = max_graphs
        self._shapes: dict[tuple[int, ...], _Shape] = {}
        self._last: _Shape | None = None  # the latest step's shape

    @property
    def graphs(self) -> int:
        """Step shapes bound so far (on CUDA, one captured graph each up to ``max_graphs``)."""
        return len(self._shapes)

    def run(
        self,
        key: tuple[int, ...],
        batch: int,
        bind_caches: Callable[[ort.IOBinding], None],
        feeds: Mapping[str, np.ndarray],
    ) -> np.ndarray:
        """One step of shape ``key`` (``batch`` rows first): write ``feeds`` into its inputs, run,
        return the logits (batch, 1, vocab). ``bind_caches`` binds the cache buffers of that
        shape the first time it runs."""
        self._step(key, batch, bind_caches, feeds)
        return self.last_logits()

    def run_on_device(
        self,
        key: tuple[int, ...],
        batch: int,
        bind_caches: Callable[[ort.IOBinding], None],
        feeds: Mapping[str, np.ndarray],
    ) -> ort.OrtValue:
        """``run``, leaving the logits where the step wrote them: returns their tensor (on the
        device, finished), which ``last_logits`` copies to the host if asked to."""
        shape = self._step(key, batch, bind_caches, feeds)
        if shape.host_outputs is None:
            shape.io.synchronize_outputs()  # what reads them next may run on another stream
        return shape.logits

    def _step(
        self,
        key: tuple[int, ...],
        batch: int,
        bind_caches: Callable[[ort.IOBinding], None],
        feeds: Mapping[str, np.ndarray],
    ) -> _Shape:
        shape = self._shapes.get(key)
        if shape is None:
            graph_id = next(_GRAPH_IDS) if len(self._shapes) < self.max_graphs else NO_GRAPH
            shape = self._shapes[key] = self._bind(batch, bind_caches, graph_id)
        staging = shape.staging
        for row, name in enumerate(self.inputs):
            staging[row] = feeds[name].reshape(-1)
        shape.packed.update_inplace(staging)
        try:
            self.session.run_with_iobinding(shape.io, shape.run_options)
        except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
            if shape.graph_id == NO_GRAPH:
                raise
            self._without_graphs(key, shape, err)
            self.session.run_with_iobinding(shape.io, shape.run_options)
        self._last = shape
        return shape

    def last_logits(self) -> np.ndarray:
        """The latest step's logits (batch, 1, vocab) on the host (its first output)."""
        return self.last_outputs(1)[0]

    def last_outputs(self, count: int | None = None) -> list[np.ndarray]:
        """The latest step's outputs (the first ``count``; None: all) on the host."""
        shape = self._last
        assert shape is not None, "no step has run"
        if shape.host_outputs is not None:
            return shape.host_outputs[:count]
        if shape.pinned is not None and self.host is not None:
            shape.io.synchronize_outputs()  # the copy runs on another stream than ORT's
            for pinned, value in zip(shape.pinned[:count], shape.outputs, strict=False):
                self.host.copy_to_host(pinned, value.data_ptr())
            return shape.pinned[:count]
        return [value.numpy() for value in shape.outputs[:count]]

    def _without_graphs(self, key: tuple[int, ...], shape: _Shape, err: Exception) -> None:
        """A graph that cannot be captured or replayed: its shape, and every shape not bound yet,
        run without one from now on (the graphs captured before keep replaying)."""
        log.warning(
            "CUDA graph %d (step of %d rows, cache widths %s) failed: %s; decoding on without "
            "CUDA graphs for this shape and new ones (set onnxruntime.cuda_graph: false to turn "
            "them off)",
            shape.graph_id,
            key[0],
            list(key[1:]),
            err,
        )
        self.max_graphs = 0  # no new captures
        shape.graph_id = NO_GRAPH
        shape.run_options = ort.RunOptions()
        shape.run_options.add_run_config_entry(GRAPH_ID, str(NO_GRAPH))

    def _bind(
        self, batch: int, bind_caches: Callable[[ort.IOBinding], None], graph_id: int
    ) -> _Shape:
        io = self.session.io_binding()
        bind_caches(io)
        staging = pinned_empty((len(self.inputs), batch), self.host, np.int64)
        packed = ort.OrtValue.ortvalue_from_shape_and_type(
            list(staging.shape), np.int64, self.kind, self.index
        )
        row_bytes = batch * staging.itemsize
        for row, (name, rank) in enumerate(self.inputs.items()):
            pointer = packed.data_ptr() + row * row_bytes
            io.bind_input(name, self.kind, self.index, np.int64, [batch, 1][:rank], pointer)
        # the outputs: on the CPU numpy arrays read in place; on a device its tensors, copied
        # into page-locked arrays where ``CudaHost`` can
        hosts: list[np.ndarray] = [
            np.zeros((batch, *per_row), dtype) for per_row, dtype in self.outputs.values()
        ]
        if self.kind == "cpu":
            values = [ort.OrtValue.ortvalue_from_numpy(host) for host in hosts]
        else:
            values = [
                ort.OrtValue.ortvalue_from_shape_and_type(
                    list(host.shape), host.dtype.type, self.kind, self.index
                )
                for host in hosts
            ]
        for name, value in zip(self.outputs, values, strict=True):
            io.bind_ortvalue_output(name, value)
        run_options = ort.RunOptions()
        run_options.add_run_config_entry(GRAPH_ID, str(graph_id))
        pinned = None
        if self.kind != "cpu" and self.host is not None:
            pinned = [pinned_empty(host.shape, self.host, host.dtype.type) for host in hosts]
        host = hosts if self.kind == "cpu" else None
        return _Shape(io, packed, staging, values, host, run_options, graph_id, pinned)
