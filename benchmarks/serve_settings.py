"""What one `attnserve bench serve` run measures: ``ServeSettings``, the models and setups.

Setups (how the server batches; ``serve_setups`` writes each one's repository):

- ``batching``: the repository's own configuration (in-flight batching for the translator,
  Triton-style dynamic batching for the ViT);
- ``no_inflight``: translator with ``InFlightBatching(in_flight=False)`` (sequences batched up to
  max_batch_size);
- ``no_batching``: translator with in_flight=False, max_batch_size=1, max_active_sequences=1;
  ViT with max_batch_size=1 (dynamic batching off);
- ``two_frontends``: ``batching``'s configuration served by ``--frontend-workers 2`` (two gRPC
  frontend processes and one engine process on the same port);
- ``instances``: ``batching``'s models with ``batching.instances: 2`` (the translator's two
  in-flight engines, the ViT's two concurrent batches, with half the intra-op threads each,
  sharing one set of sessions when that is one thread; one frontend);
- ``spinning``: ``batching``'s models with ``allow_spinning`` and ``spin_duration_us`` (the
  decoders' and classifiers' idle threads spin for that long before they sleep);
- ``stream_interval``: ``batching``'s translator alone with ``batching.stream_interval_ms``
  (``STREAM_INTERVAL_MS``): a stream's tokens leave in one message per interval, not per step.

The load generator spreads each point's calls over ``connections`` TCP connections (every setup
alike), so that the kernel has connections to hand to each frontend process.

Beside the setups (``serve_peers``): the ViT over the KServe protocol on attnserve and on a Triton
peer serving the same ONNX model, and perf_analyzer runs, at ``peer_concurrency``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

# The batching configuration under more frontend processes, measured where the machine has
# two CPUs per frontend (the load generator and the engine need cores too): the frontend count
# that serves best on a large host (issue: frontend_workers "what measures best").
# eight_frontends_overlap: eight_frontends' with the translator's batching.overlap_steps on;
# eight_frontends_block: with its batching.decode_block on (blocks of BLOCK_STEPS steps)
WIDE_FRONTENDS = {
    "four_frontends": 4,
    "eight_frontends": 8,
    "eight_frontends_overlap": 8,
    "eight_frontends_block": 8,
}
BLOCK_STEPS = 4  # the decode block the block setups' translator entry is given
# CUDA only (refused on the CPU; among the defaults on CUDA): the batching configuration with the
# translator's decode steps replayed as CUDA graphs (the default since 2026-11-26; explicit here,
# whatever an entry's config.yaml says) and without them, and the ViT with cuDNN's heuristic
# convolution search instead of the exhaustive one (the ViT's slow 32-client points on an H200),
# and the ViT's batches unpadded (``batch_buckets: off``; on CUDA they are padded by default).
CUDA_SETUPS = ("cuda_graphs", "no_cuda_graphs", "conv_heuristic", "no_batch_buckets")
SETUPS = (
    "batching",
    "no_inflight",
    "no_batching",
    "two_frontends",
    "instances",
    "spinning",
    "stream_interval",
    # batching's translator one step per run (batching.decode_block: false; on the CPU the
    # default decodes in blocks)
    "single_steps",
    # batching's translator in blocks, its waiting requests joining every BLOCK_STEPS + 1 steps
    # (batching.join_interval_steps) so that a block runs between two joins
    "block_joins",
    *WIDE_FRONTENDS,
    *CUDA_SETUPS,
)
FULL_SETUPS = ("batching", "two_frontends")  # also measured: overhead and unary Translate
OVERHEAD_SETUPS = (*FULL_SETUPS, "instances")  # the minimal request's overhead is measured in
MINIMAL_SETUPS = (*OVERHEAD_SETUPS, "spinning")  # the minimal request is timed in
SPIN_DURATION_US = 50  # the spinning setup's spin_duration_us
STREAM_INTERVAL_MS = 20  # the stream_interval setup's batching.stream_interval_ms
# Per setup, the onnxruntime fields each model's config.yaml gets (beside the benchmark's threads
# and execution providers).
ONNXRUNTIME_EDITS: dict[str, dict[str, Any]] = {
    "spinning": {"allow_spinning": True, "spin_duration_us": SPIN_DURATION_US},
    "cuda_graphs": {"cuda_graph": True},
    "no_cuda_graphs": {"cuda_graph": False},
    "conv_heuristic": {"cudnn_conv_algo_search": "heuristic"},
}
FRONTEND_WORKERS = {"two_frontends": 2, **WIDE_FRONTENDS}  # --frontend-workers (default 1)
INSTANCES = {"instances": 2}  # the models' batching.instances (default 1)
MODELS = ("translator", "vit")
GOAL_CONCURRENCY = 32  # the concurrency (and offline batch size) the throughput goals compare at
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
# On CUDA the GPU goals' loads come on top: 128 translation streams (against the offline
# batch-128 rate) and 256 ViT clients.
GPU_STREAMS = 128
GPU_VIT_CLIENTS = 256
CUDA_CONCURRENCY = (*DEFAULT_CONCURRENCY, GPU_STREAMS, GPU_VIT_CLIENTS)
# the setups every best-workers goal needs measured (the wide-frontend ones count when measured)
BASE_WORKER_SETUPS = ("batching", "two_frontends", "instances")


def machine_setups(
    setups: tuple[str, ...], cpus: int | None = None, device: str = "cpu"
) -> tuple[str, ...]:
    """``setups`` without the wide-frontend ones the machine lacks the CPUs for (two per
    frontend process), and without the CUDA-only ones off CUDA."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    return tuple(
        s
        for s in setups
        if WIDE_FRONTENDS.get(s, 0) * 2 <= cpus and (device == "cuda" or s not in CUDA_SETUPS)
    )


def gpu_goal_loads(cpus: int | None = None) -> dict[str, Any]:
    """`bench serve --gpu-goals`: only the loads the GPU goals (and the 32-stream goal) are
    judged on, in the setups they compare (with 4 and 8 frontends where the machine has the
    CPUs): closed loop, no open loop, no Triton peer; fits a short GPU lease."""
    return {
        "setups": machine_setups((*BASE_WORKER_SETUPS, "stream_interval", *WIDE_FRONTENDS), cpus),
        "concurrency": (1, GOAL_CONCURRENCY, GPU_STREAMS, GPU_VIT_CLIENTS),
        "rate_fractions": (),
        "duration_s": 3.0,
        "triton": False,
    }


DEFAULT_TEXT = "three hundred and forty-seven thousand two hundred and fifty-eight"


def default_client_processes(cpus: int | None = None) -> int:
    """Load generator processes for a machine of ``cpus`` logical CPUs: one below 8 CPUs (on a
    small machine every client process takes CPU from the server it measures), else a quarter
    of them, at most 8 (one event loop issues a few thousand calls a second)."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    return 1 if cpus < 8 else min(8, cpus // 4)


@dataclass
class ServeSettings:
    """What one serve benchmark run measures."""

    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY  # CUDA_CONCURRENCY on cuda
    rates: tuple[float, ...] | None = None  # open loop requests/s; None = fractions of the peak
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
    duration_s: float = 5.0  # per load point
    warmup_s: float = 1.0  # closed-loop warm-up before each closed-loop point
    overhead_s: float = 3.0  # concurrency-1 minimal requests for the overhead figure
    new_tokens: int = 64
    models: tuple[str, ...] = MODELS
    setups: tuple[str, ...] = field(default_factory=lambda: machine_setups(SETUPS))
    connections: int = 4  # TCP connections the load generator spreads each point's calls over
    # Processes the load generator's clients run in (each with ``connections`` connections).
    client_processes: int = field(default_factory=default_client_processes)
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    device: str = "cpu"
    offline_repetitions: int = 5
    # A load point during which other processes used more than this share of the machine's CPU
    # is discarded (recorded) and measured again, at most ``noise_retries`` times. None: keep.
    max_foreign_share: float | None = 0.10
    noise_retries: int = 2
    text: str = DEFAULT_TEXT
    language: str | None = None  # default: the translator's first language
    # Same-run comparisons (serve_peers): attnserve and the Triton peer under one KServe load,
    # perf_analyzer as a second load generator, at these concurrencies.
    peer_concurrency: tuple[int, ...] = (1, 8, GOAL_CONCURRENCY)
    triton: bool = True  # run the Triton peer (PyTriton) on the ViT
    triton_python: str | None = None  # a Python with PyTriton (default: the cache's peer venv)
    perf_analyzer: bool = False  # also drive perf_analyzer
    tiny: bool = False

    @classmethod
    def tiny_settings(cls, **overrides: Any) -> ServeSettings:
        """The CI configuration: concurrency 1 and 4, half-second points, 8 new tokens."""
        base = cls(
            concurrency=(1, 4),
            rate_fractions=(0.5,),
            duration_s=0.3,
            warmup_s=0.1,
            overhead_s=0.3,
            new_tokens=8,
            setups=("batching", "no_batching", "two_frontends", "instances"),
            offline_repetitions=2,
            max_foreign_share=None,
            text="three hundred and twelve",
            peer_concurrency=(1, 4),
            tiny=True,
        )
        return replace(base, **overrides)

    def __post_init__(self) -> None:
        if self.device == "cuda" and self.concurrency == DEFAULT_CONCURRENCY:
            self.concurrency = CUDA_CONCURRENCY
        if self.device == "cuda" and self.setups == machine_setups(SETUPS):
            self.setups = machine_setups(SETUPS, device="cuda")

    def check(self) -> None:
        """Raise ValueError for settings that cannot run."""
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("--concurrency must list numbers >= 1")
        if not self.peer_concurrency or min(self.peer_concurrency) < 1:
            raise ValueError("--peer-concurrency must list numbers >= 1")
        if self.rates is not None and (not self.rates or min(self.rates) <= 0):
            raise ValueError("--rates must list rates > 0")
        if self.connections < 1:
            raise ValueError("--connections must be >= 1")
        if self.client_processes < 1:
            raise ValueError("--client-processes must be >= 1")
        if self.duration_s <= 0 or self.new_tokens < 1:
            raise ValueError("--duration must be > 0 and --new-tokens >= 1")
        unknown = sorted(set(self.models) - set(MODELS))
        if unknown:
            raise ValueError(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
        unknown = sorted(set(self.setups) - set(SETUPS))
        if unknown:
            raise ValueError(f"unknown setup(s) {unknown}; choose from {list(SETUPS)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError("--device must be cpu or cuda")
        cuda_only = [s for s in self.setups if s in CUDA_SETUPS]
        if cuda_only and self.device != "cuda":
            raise ValueError(f"setup(s) {cuda_only} run with --device cuda only")
