"""The engine benchmark's runners: what to run, and building each one here or in its own process.

``runner_specs`` turns the settings into picklable ``RunnerSpec``s (exporting our model and
converting CTranslate2's once, into the cache): attnserve per precision, CTranslate2 per
precision and inter x intra thread split, Hugging Face ``generate`` with and without the KV
cache. ``build_runners`` builds them, each in its own spawned worker process by default
(``IsolatedRunner``), so engines share no thread pools, OpenMP runtimes or allocators.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attnserve_runner import (
    CUDA_GRAPH_SUFFIX,
    KV8_SUFFIX,
    AttnServeRunner,
    attention_suffix,
    block_suffix,
    export_attnserve,
)
from benchmarks.block_entry import with_decode_block
from benchmarks.engine_settings import EngineSettings
from benchmarks.machine import cpu_model_and_flags
from benchmarks.output import log
from benchmarks.peers import (
    CT2_TYPES,
    CTranslate2Runner,
    HFGenerateRunner,
    Runner,
    Unavailable,
    convert_ctranslate2,
    ct2_forced_isas,
    ct2_name,
    ctranslate2_available,
    hf_available,
    hf_name,
    thread_splits,
)

Skipped = dict[str, str]  # {"engine": name, "reason": why it cannot run here}


@dataclass(frozen=True)
class RunnerSpec:
    """How to build one runner: picklable, so a worker process can build it."""

    name: str
    factory: str  # attnserve | attnserve-beam | ctranslate2 | hf
    kwargs: dict[str, Any]


def make_runner(spec: RunnerSpec) -> Runner:
    """Build the runner ``spec`` describes (raises Unavailable when it cannot run here)."""
    if spec.factory == "attnserve":
        return AttnServeRunner(**spec.kwargs)
    if spec.factory == "attnserve-beam":  # benchmarks.beam_search
        from benchmarks.beam_runner import AttnServeBeamRunner

        return AttnServeBeamRunner(**spec.kwargs)
    if spec.factory == "ctranslate2":
        return CTranslate2Runner(**spec.kwargs)
    if spec.factory == "hf":
        return HFGenerateRunner(**spec.kwargs)
    raise ValueError(f"unknown runner factory {spec.factory!r}")


# --- what to run --------------------------------------------------------------------------------


def runner_specs(
    settings: EngineSettings, marian_dir: Path, cache: Path
) -> tuple[list[RunnerSpec], list[Skipped]]:
    """What to run (exports and conversions done, cached), and the skipped engines with reasons."""
    specs: list[RunnerSpec] = []
    skipped: list[Skipped] = []
    if "attnserve" in settings.engines:
        specs += attnserve_specs(settings, marian_dir, cache)
    if "ctranslate2" in settings.engines:
        specs += ctranslate2_specs(settings, marian_dir, cache, skipped)
    if "hf" in settings.engines:
        specs += hf_specs(settings, marian_dir, skipped)
    return specs, skipped


def attnserve_specs(settings: EngineSettings, marian_dir: Path, cache: Path) -> list[RunnerSpec]:
    """Our ONNX Runtime runners per precision (each precision exported once into the cache):
    the in-place cache, the growing fallback, one engine per thread (CPU), CUDA graphs (CUDA),
    and for int8 the same in-place runs with an int8 KV cache."""
    specs = []
    for precision in settings.precisions:
        # what the server runs, the fallback, then the other decode attentions asked for
        first, *others = decode_attentions(settings, precision)
        variants: list[tuple[str, str, str | None]] = [
            ("float", "inplace", first),
            ("float", "growing", None),
            *(("float", "inplace", attention) for attention in others),
        ]
        if precision == "int8":
            variants.append(("int8", "inplace", None))
        for kv_dtype, kv_cache, attention in variants:
            entry = export_attnserve(
                marian_dir,
                cache,
                settings.shape,
                precision,
                settings.fast_int8,
                kv_dtype,
                attention,
            )
            kwargs = {
                "entry": entry,
                "precision": precision,
                "new_tokens": settings.new_tokens,
                "threads": settings.threads,
                "device": settings.device,
                "kv_cache": kv_cache,
                "max_batch": max(settings.batches),
                "kv8": kv_dtype == "int8",
                "decode_attention": attention,
            }
            name = f"attnserve-{precision}" + KV8_SUFFIX * (kv_dtype == "int8")
            name += attention_suffix(precision, attention)
            name += "" if kv_cache == "inplace" else "-growing"
            specs.append(RunnerSpec(name, "attnserve", kwargs))
            if kv_cache == "inplace" and settings.threads > 1 and settings.device == "cpu":
                # batching.instances: one engine per thread, as CTranslate2's N x 1 split
                split = {**kwargs, "instances": settings.threads}
                specs.append(RunnerSpec(f"{name}-{settings.threads}x1", "attnserve", split))
            if kv_cache == "inplace" and kv_dtype == "float" and settings.device == "cuda":
                graphs = {**kwargs, "cuda_graph": True}
                specs.append(RunnerSpec(name + CUDA_GRAPH_SUFFIX, "attnserve", graphs))
            if settings.decode_block and kv_cache == "inplace" and kv_dtype == "float":
                specs += block_specs(name, kwargs, settings)
    return specs


def block_specs(name: str, kwargs: dict[str, Any], settings: EngineSettings) -> list[RunnerSpec]:
    """The in-place runner ``name`` decoding in blocks of ``--decode-block`` steps (the entry
    given the block graph once), with CUDA graphs too on CUDA."""
    steps = settings.decode_block
    with_decode_block(kwargs["entry"], steps)
    block = {**kwargs, "decode_block": steps}
    specs = [RunnerSpec(name + block_suffix(steps), "attnserve", block)]
    if settings.device == "cuda":
        graphs = {**block, "cuda_graph": True}
        specs.append(
            RunnerSpec(name + CUDA_GRAPH_SUFFIX + block_suffix(steps), "attnserve", graphs)
        )
    return specs


def decode_attentions(settings: EngineSettings, precision: str) -> list[str | None]:
    """The in-place decoder's attentions to run for ``precision`` (None: its default,
    ``contract.graphs.default_decode_attention``). Unless ``--decode-attentions`` says, the
    default, and on the CPU also the other one for fp32 and int8 (int8: the fused op, as before
    matmul became its default; fp32: MatMuls, the CPU's option)."""
    from contract.graphs import default_decode_attention

    default = default_decode_attention(precision, "float")
    if settings.decode_attentions is not None:
        asked = dict.fromkeys(settings.decode_attentions)  # in order, each once
        return [None if name == default else name for name in asked]
    if settings.device == "cpu" and precision in ("fp32", "int8"):
        return [None, "fused" if precision == "int8" else "matmul"]
    return [None]


def ctranslate2_specs(
    settings: EngineSettings, marian_dir: Path, cache: Path, skipped: list[Skipped]
) -> list[RunnerSpec]:
    """CTranslate2 per precision and thread split (converted once into the cache).

    When CTranslate2 cannot run here, one entry per precision lands in ``skipped`` instead.
    """
    from benchmarks.marian import vocabulary

    reason = ctranslate2_available(settings.device)
    splits = thread_splits(settings.threads) if settings.device == "cpu" else [(1, 1)]
    isas: list[str | None] = [None]
    if settings.device == "cpu" and settings.isolate:  # the override is per process
        isas += ct2_forced_isas(*cpu_model_and_flags())
    specs = []
    for precision in settings.precisions:
        if reason is not None:
            skipped.append({"engine": f"ctranslate2-{precision}", "reason": reason})
            log(f"skipping ctranslate2-{precision}: {reason}")
            continue
        quantization = CT2_TYPES[precision]
        model_dir = convert_ctranslate2(marian_dir, cache, quantization)
        for isa, (inter, intra) in itertools.product(isas, splits):
            kwargs = {
                "model_dir": model_dir,
                "vocabulary": vocabulary(settings.shape),
                "precision": precision,
                "new_tokens": settings.new_tokens,
                "inter_threads": inter,
                "intra_threads": intra,
                "device": settings.device,
                "cpu_isa": isa,
            }
            name = ct2_name(precision, inter, intra, isa)
            specs.append(RunnerSpec(name, "ctranslate2", kwargs))
    return specs


def hf_specs(
    settings: EngineSettings, marian_dir: Path, skipped: list[Skipped]
) -> list[RunnerSpec]:
    """Hugging Face ``generate`` with and without the KV cache (or both in ``skipped``); with
    fp16 among the precisions also the half-precision model with the KV cache (the fp16 peer)."""
    reason = hf_available(settings.device)
    specs = []
    variants = [(True, "fp32"), (False, "fp32")]
    if "fp16" in settings.precisions:
        variants.append((True, "fp16"))
    for use_cache, precision in variants:
        name = hf_name(use_cache, precision)
        if reason is not None:
            skipped.append({"engine": name, "reason": reason})
            continue
        kwargs = {
            "marian_dir": marian_dir,
            "new_tokens": settings.new_tokens,
            "use_cache": use_cache,
            "threads": settings.threads,
            "device": settings.device,
            "precision": precision,
        }
        specs.append(RunnerSpec(name, "hf", kwargs))
    return specs


# --- a runner in its own process ----------------------------------------------------------------


def _worker(
    conn: Any, spec: RunnerSpec, make: Callable[[RunnerSpec], Runner] = make_runner
) -> None:
    """A worker process: build one runner (``make``: this module's runners, or another
    module's builder), then time ``run`` calls on request until "close"."""
    try:
        runner = make(spec)
    except Unavailable as err:
        conn.send(("unavailable", str(err)))
        return
    except Exception as err:  # reported to the parent as this engine's failure
        conn.send(("unavailable", f"{type(err).__name__}: {err}"))
        return
    facts = (runner.name, runner.family, runner.precision, runner.label, runner.config)
    conn.send(("ready", facts))
    while True:
        message = conn.recv()
        if message[0] == "close":
            runner.close()
            return
        try:
            elapsed, out = runner.timed_run(message[1])
            conn.send(("ok", elapsed, out))
        except Exception as err:
            conn.send(("error", f"{type(err).__name__}: {err}"))


class IsolatedRunner(Runner):
    """A runner living in its own process (only its engine loaded there); timing is done there."""

    def __init__(
        self, spec: RunnerSpec, context: Any, make: Callable[[RunnerSpec], Runner] = make_runner
    ) -> None:
        """Start the worker (``make``: what builds its runner there, a module-level function);
        ``wait_ready`` completes the construction."""
        parent, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, spec, make), daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        self.spec = spec

    def wait_ready(self) -> IsolatedRunner:
        """Wait for the worker to have built its engine (raises Unavailable if it could not)."""
        reply = self.conn.recv()
        if reply[0] != "ready":
            self.process.join(10)
            raise Unavailable(reply[1])
        name, family, precision, label, config = reply[1]
        super().__init__(name, family, precision, label, {**config, "process": "isolated"})
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def timed_run(self, ids: np.ndarray) -> tuple[float, np.ndarray]:
        self.conn.send(("run", ids))
        reply = self.conn.recv()
        if reply[0] != "ok":
            raise RuntimeError(reply[1])
        return reply[1], reply[2]

    def run(self, ids: np.ndarray) -> np.ndarray:
        return self.timed_run(ids)[1]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("close",))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def start_isolated(
    specs: list[RunnerSpec],
    context: Any,
    skipped: list[dict[str, str]],
    make: Callable[[RunnerSpec], Runner] = make_runner,
) -> list[IsolatedRunner]:
    """Each spec's runner in its own process, once all have loaded; one that cannot run here
    goes into ``skipped`` with the reason."""
    started = [IsolatedRunner(spec, context, make) for spec in specs]
    ready: list[IsolatedRunner] = []
    for runner in started:
        try:
            ready.append(runner.wait_ready())
            log(f"loaded {runner.name}")
        except Unavailable as err:
            skipped.append({"engine": runner.spec.name, "reason": str(err)})
            log(f"skipping {runner.spec.name}: {err}")
    return ready


def build_runners(
    settings: EngineSettings, marian_dir: Path, cache: Path
) -> tuple[list[Runner], list[Skipped]]:
    """Every runner the settings ask for that can run here, and the skipped ones with reasons.

    With ``settings.isolate`` each engine runs in its own (spawned) process, so engines do not
    share thread pools, OpenMP runtimes or allocators; the parent only orchestrates.
    """
    import multiprocessing

    specs, skipped = runner_specs(settings, marian_dir, cache)
    context = multiprocessing.get_context("spawn")
    # Workers load their engines in parallel; the parent then collects them in order.
    started = [IsolatedRunner(spec, context) for spec in specs] if settings.isolate else []
    runners: list[Runner] = []
    for i, spec in enumerate(specs):
        try:
            runner = started[i].wait_ready() if settings.isolate else make_runner(spec)
        except Unavailable as err:
            skipped.append({"engine": spec.name, "reason": str(err)})
            log(f"skipping {spec.name}: {err}")
            continue
        runners.append(runner)
        log(f"loaded {runner.name}" + (" (own process)" if settings.isolate else ""))
    return runners, skipped
