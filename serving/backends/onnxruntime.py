"""ONNX Runtime backend: one InferenceSession per graph file of a model version."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.graphs import CLASSIFIER, DECODER, DECODER_BLOCK, DECODER_INPLACE
from contract.model_config import OnnxRuntimeOptions
from serving.backends.base import BackendError
from serving.backends.captured_steps import CUDA_GRAPH_OPTION

# The graphs that run back to back (decode steps, classifier batches) and so gain from idle
# threads that spin. The others (the encoder, the cache helper graphs) run between them and never
# spin: each session has its own thread pool, and their idle workers, spinning on the cores the
# next decode step needs, slowed every step after an encode by 20% (2 threads, batch 8).
SPINNING_GRAPHS = (DECODER, DECODER_INPLACE, DECODER_BLOCK, CLASSIFIER)

_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(options: OnnxRuntimeOptions, spin: bool = True) -> ort.SessionOptions:
    """SessionOptions for the configured threads, spinning (``allow_spinning``, unless ``spin``
    is False) and optimisation level."""
    so = ort.SessionOptions()
    so.graph_optimization_level = _OPTIMIZATION[options.graph_optimization]
    if options.intra_op_threads:
        so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3  # errors only: warnings about unused initialisers are noise
    spinning = "1" if options.allow_spinning and spin else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    so.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    if spinning == "1" and options.spin_duration_us > 0:
        so.add_session_config_entry(
            "session.intra_op.spin_duration_us", str(options.spin_duration_us)
        )
    so.enable_cpu_mem_arena = options.cpu_memory_arena
    return so


# the CUDA provider's option: EXHAUSTIVE, HEURISTIC or DEFAULT
CONV_ALGO_SEARCH = "cudnn_conv_algo_search"


def available_providers(requested: tuple[str, ...]) -> list[str]:
    """The requested execution providers this ONNX Runtime build has, CPU always last.

    Raises:
        BackendError: when none of the requested providers is available.
    """
    present = set(ort.get_available_providers())
    chosen = [p for p in requested if p in present]
    if not chosen:
        raise BackendError(
            f"none of the execution providers {list(requested)} is available in this "
            f"onnxruntime build (it has {sorted(present)}); install onnxruntime-gpu for CUDA / "
            "TensorRT or list CPUExecutionProvider in config.yaml"
        )
    if "CPUExecutionProvider" in present and "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def graph_provider_options(
    graph: str,
    options: OnnxRuntimeOptions,
    providers: list[str],
    provider_options: Mapping[str, dict] | None = None,
) -> list[dict]:
    """Per provider in ``providers``, the options of ``graph``'s session: ``provider_options``;
    for CUDA the convolution algorithm search (``options.cudnn_conv_algo_search``, unless
    ``provider_options`` name one), and CUDA graph capture for the in-place decoder when
    ``options.cuda_graph`` (the only graph whose runs keep their shapes and addresses:
    ``captured_steps``)."""
    per_provider = [dict((provider_options or {}).get(p, {})) for p in providers]
    for provider, chosen in zip(providers, per_provider, strict=True):
        if provider == "CUDAExecutionProvider":
            chosen.setdefault(CONV_ALGO_SEARCH, options.cudnn_conv_algo_search.upper())
            if options.cuda_graph and graph == DECODER_INPLACE:
                chosen[CUDA_GRAPH_OPTION] = "1"
    return per_provider


class OnnxRuntimeBackend:
    """Loads ``{graph}.onnx`` files of a version folder into ONNX Runtime sessions."""

    def __init__(
        self,
        version_dir: str | Path,
        graph_files: Mapping[str, str],
        options: OnnxRuntimeOptions | None = None,
        provider_options: Mapping[str, dict] | None = None,
    ) -> None:
        """Create one session per graph.

        Args:
            version_dir: REPOSITORY/NAME/VERSION.
            graph_files: graph name -> file name, e.g. {"encoder": "encoder.onnx"}.
            options: threads, providers, optimisation level.
            provider_options: per-provider options (e.g. TensorRT engine cache settings).

        Raises:
            BackendError: a missing or invalid graph file.
        """
        options = options or OnnxRuntimeOptions()
        providers = available_providers(options.execution_providers)
        self.providers = providers
        self._sessions: dict[str, ort.InferenceSession] = {}
        for graph, filename in graph_files.items():
            path = Path(version_dir) / filename
            if not path.is_file():
                raise BackendError(f"graph file {path} is missing; re-export the model")
            try:
                self._sessions[graph] = ort.InferenceSession(
                    str(path),
                    session_options(options, spin=graph in SPINNING_GRAPHS),
                    providers=providers,
                    provider_options=graph_provider_options(
                        graph, options, providers, provider_options
                    ),
                )
            except Exception as err:  # onnxruntime raises its own untyped exceptions
                raise BackendError(f"cannot load {path}: {err}") from err
        self._inputs = {g: [i.name for i in s.get_inputs()] for g, s in self._sessions.items()}
        self._outputs = {g: [o.name for o in s.get_outputs()] for g, s in self._sessions.items()}

    def graphs(self) -> list[str]:
        return list(self._sessions)

    def input_names(self, graph: str) -> list[str]:
        return self._inputs[graph]

    def output_names(self, graph: str) -> list[str]:
        return self._outputs[graph]

    def session(self, graph: str) -> ort.InferenceSession:
        """The session of ``graph`` (for IO-bound runs, ``serving.backends.onnxruntime_io``)."""
        return self._sessions[graph]

    def input_types(self, graph: str) -> dict[str, str]:
        """ONNX type strings ("tensor(float)") of a graph's inputs."""
        return {i.name: i.type for i in self._sessions[graph].get_inputs()}

    def run(self, graph: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._sessions[graph]
        try:
            outputs = session.run(None, dict(feeds))
        except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
            raise BackendError(f"{graph} graph failed: {err}") from err
        return dict(zip(self._outputs[graph], outputs, strict=True))

    def run_on_device(
        self,
        graph: str,
        feeds: Mapping[str, np.ndarray],
        names: list[str],
        device: tuple[str, int],
    ) -> list[ort.OrtValue]:
        """``run``'s outputs ``names``, left on ``device`` (e.g. ("cuda", 0)) as OrtValues: IO
        binding, nothing copied to the host."""
        session = self._sessions[graph]
        io = session.io_binding()
        for name, value in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in names:
            io.bind_output(name, device[0], device[1])
        run_bound(session, io, graph)
        return list(io.get_outputs())  # in the order bound


def run_bound(session: ort.InferenceSession, io: ort.IOBinding, graph: str) -> None:
    """``session.run_with_iobinding(io)``, its failure a ``BackendError`` naming ``graph``."""
    try:
        session.run_with_iobinding(io)
    except Exception as err:  # onnxruntime's exceptions are not a public hierarchy
        raise BackendError(f"{graph} graph failed: {err}") from err
