"""`attnserve bench engine`: fixed-length greedy decoding of one random Marian model, every engine.

The model (``benchmarks.marian``: Marian-base shape, random weights, Hugging Face format) is built
once into the cache; every engine loads those weights:

- attnserve: our ONNX export of it (``export.exporter.export`` of ``load_hf_directory``), fp32 and
  int8, driven by ``Seq2SeqRunner.encode`` / ``step`` with EOS suppressed (``fixed_greedy``);
- CTranslate2 fp32 and int8, converted from the same directory, at each inter x intra thread
  split that uses the thread budget (the best split is what ratios compare against);
- Hugging Face ``generate`` with and without the KV cache.

Every engine decodes the same (batch, source) token ids into exactly ``new_tokens`` tokens. Per
batch size: one warm-up run per engine, then ``repetitions`` rounds in which every engine runs once
(interleaved, the starting engine rotating), so machine noise hits all engines alike. Medians of
the rounds give new tokens/s, ms per decode step (whole batch, encoder time amortised), achieved
GFLOP/s and the fraction of the fp32 matmul peak measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marian import BASE, EOS_ID, TINY, MarianShape, build_marian, default_cache
from benchmarks.peers import (
    CTranslate2Runner,
    HFGenerateRunner,
    Runner,
    Unavailable,
    convert_ctranslate2,
    ctranslate2_available,
    hf_available,
    thread_splits,
)
from benchmarks.schema import ENGINE_SCHEMA_ID, BenchError, validate

FAMILIES = ("attnserve", "ctranslate2", "hf")
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"


# --- settings -----------------------------------------------------------------------------------


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
        bad = sorted(set(self.precisions) - {"fp32", "int8"})
        if bad:
            raise ValueError(f"unknown precision(s) {bad}; choose from fp32, int8")
        if self.device not in ("cpu", "cuda"):
            raise ValueError("--device must be cpu or cuda")


# --- machine facts ------------------------------------------------------------------------------


def machine_metadata(device: str) -> dict[str, Any]:
    """CPU model, cores, memory, library versions, date and device of this run."""
    cpu_model, flags = "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu_model == "unknown":
                cpu_model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        cpu_model = platform.processor() or "unknown"
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        affinity = os.cpu_count()
    return {
        "cpu_model": cpu_model,
        "cpu_flags": sorted(
            f for f in flags if f.startswith(("avx512", "avx2", "avx_vnni", "amx", "fma"))
        ),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "device": device,
        "gpu": gpu_name() if device == "cuda" else None,
        "load_average_start": _load_average(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries the benchmarks use (None when missing)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in (
        "onnxruntime",
        "onnxruntime-gpu",
        "ctranslate2",
        "torch",
        "transformers",
        "numpy",
        "grpcio",
        "attnserve",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover - broken CUDA installs
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: Sequence[int] = ()) -> tuple[float, float, float] | None:
    """(wall clock, busy CPU seconds of the machine, CPU seconds of this process, its finished
    children and the live processes ``pids``)."""
    import resource

    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:  # pragma: no cover - not Linux
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in fields]
    busy = (sum(values) - values[3] - (values[4] if len(values) > 4 else 0)) / ticks
    own = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    own += sum(process_cpu_seconds(pid) or 0.0 for pid in pids)
    return time.time(), busy, own


def foreign_cpu_share(
    start: tuple[float, float, float] | None, pids: Sequence[int] = ()
) -> float | None:
    """Share of the machine's CPU time used by other processes since ``start`` (noise gauge).

    0.0: nothing else ran; 0.5 on 2 CPUs: another process kept one core busy throughout.
    """
    end = cpu_snapshot(pids)
    if start is None or end is None:
        return None
    wall = end[0] - start[0]
    if wall < 0.1:  # /proc/stat counts 10 ms ticks: too coarse for shorter intervals
        return None
    foreign = (end[1] - start[1]) - (end[2] - start[2])
    return round(max(0.0, foreign) / (wall * (os.cpu_count() or 1)), 3)


def wait_for_quiet(
    limit: float, pids: Sequence[int] = (), max_wait_s: float = 300.0, window_s: float = 2.0
) -> float | None:
    """Wait until other processes use at most ``limit`` of the CPU over ``window_s``.

    Returns the last measured share (still above ``limit`` when ``max_wait_s`` ran out).
    """
    deadline = time.monotonic() + max_wait_s
    share = None
    waited = False
    while True:
        snapshot = cpu_snapshot(pids)
        time.sleep(window_s)
        share = foreign_cpu_share(snapshot, pids)
        if share is None or share <= limit or time.monotonic() >= deadline:
            if waited:
                shown = "n/a" if share is None else f"{share:.0%}"
                log(f"stopped waiting: other processes use {shown} of the CPU")
            return share
        if not waited:
            log(f"other processes use {share:.0%} of the CPU; waiting (up to {max_wait_s:.0f} s)")
            waited = True


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def write_result(result: dict[str, Any], out_dir: Path, kind: str) -> Path:
    """Validate ``result`` against its schema and write OUT/KIND-<timestamp>.json."""
    validate(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-tiny" if result["settings"].get("tiny") else ""
    path = out_dir / f"{kind}-{result['run_id']}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- our engine ---------------------------------------------------------------------------------


def fixed_greedy(runner: Any, encoded: Any, new_tokens: int, suppress: Sequence[int]) -> np.ndarray:
    """Greedy decoding of exactly ``new_tokens`` tokens per row, ``suppress`` ids never chosen.

    The benchmark counterpart of ``Seq2SeqRunner.greedy`` (which stops rows at EOS): the same
    ``runner.step`` calls with the KV cache, every row decoding to the fixed length.

    Returns:
        (batch, new_tokens) int64 token ids.
    """
    batch = encoded.batch
    tokens = np.full((batch, 1), runner.spec.decoder_start_id, dtype=np.int64)
    past = runner.empty_past(batch)
    out = np.empty((batch, new_tokens), dtype=np.int64)
    banned = np.asarray(list(suppress), dtype=np.int64)
    for step in range(new_tokens):
        positions = np.full((batch, 1), step, dtype=np.int64)
        self_mask = np.ones((batch, step + 1), dtype=np.int64)
        logits, past = runner.step(tokens, positions, self_mask, past, encoded)
        last = np.array(logits[:, -1], dtype=np.float32)
        last[:, banned] = -np.inf
        next_ids = last.argmax(-1)
        out[:, step] = next_ids
        tokens = next_ids[:, None].astype(np.int64)
    return out


class AttnServeRunner(Runner):
    """Our exported graphs in ONNX Runtime, through ``Seq2SeqRunner``."""

    def __init__(
        self, entry: Path, precision: str, new_tokens: int, threads: int, device: str = "cpu"
    ) -> None:
        import onnxruntime

        from serving.backends.base import BackendError
        from serving.backends.onnxruntime import OnnxRuntimeBackend
        from serving.model_config import OnnxRuntimeOptions, read_model_config, resolve_version
        from serving.repository import graph_files
        from serving.seq2seq import Seq2SeqRunner

        providers = ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)
        config = read_model_config(entry)
        super().__init__(
            name=f"attnserve-{precision}",
            family="attnserve",
            precision=precision,
            label=f"attnserve ONNX Runtime {precision}",
            config={
                "onnxruntime": onnxruntime.__version__,
                "intra_op_threads": threads,
                "allow_spinning": True,
                "providers": list(providers),
                "entry": str(entry),
            },
        )
        if (
            device == "cuda"
            and "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
        ):
            raise Unavailable("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
        # The engine alone on the machine: idle threads may spin and the arena may keep its
        # buffers (the server turns both off).
        options = OnnxRuntimeOptions(
            intra_op_threads=threads,
            execution_providers=providers,
            allow_spinning=True,
            cpu_memory_arena=True,
        )
        try:
            backend = OnnxRuntimeBackend(resolve_version(entry), graph_files(config), options)
        except BackendError as err:
            raise Unavailable(str(err)) from err
        assert config.decoder is not None
        self.runner = Seq2SeqRunner(backend, config.decoder)
        self.new_tokens = new_tokens
        self.eos_id = config.decoder.eos_id

    def run(self, ids: np.ndarray) -> np.ndarray:
        encoded = self.runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return fixed_greedy(self.runner, encoded, self.new_tokens, [self.eos_id])

    def close(self) -> None:
        del self.runner


def export_attnserve(
    marian_dir: Path, cache: Path, shape: MarianShape, precision: str, fast_int8: bool
) -> Path:
    """Our repository entry for ``precision`` (exported once into the cache, then reused).

    fp32 and int8 go through ``export()`` with its parity checks. With ``fast_int8`` the int8
    entry is the fp32 one with its graphs quantised by ``export.precision.quantize_int8`` (what
    ``export(precision="int8")`` does after a second trace), to keep CI runs short.
    """
    from serving.model_config import CONFIG_FILE

    repository = Path(cache) / f"repo-{shape.key()}"
    name = f"marian-{precision}"
    entry = repository / name
    if (entry / CONFIG_FILE).is_file() and (entry / "1" / "manifest.json").is_file():
        return entry
    if precision == "int8" and fast_int8:
        return _quantised_copy(export_attnserve(marian_dir, cache, shape, "fp32", False), entry)
    from export.exporter import ExportOptions, export
    from export.hf_import import load_hf_directory

    log(f"exporting {marian_dir.name} to ONNX ({precision}) into {repository}")
    options = ExportOptions(name=name, precision=precision, parity_examples=100, force=True)
    export(load_hf_directory(marian_dir), repository, options)
    return entry


def _quantised_copy(fp32_entry: Path, entry: Path) -> Path:
    from export.precision import quantize_int8
    from serving.model_config import (
        DECODER_FILE,
        ENCODER_FILE,
        read_model_config,
        write_model_config,
    )

    scratch = entry.with_name(entry.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "1").mkdir(parents=True)
    for path in (fp32_entry / "1").iterdir():
        if path.name not in (ENCODER_FILE, DECODER_FILE):
            shutil.copy2(path, scratch / "1" / path.name)
    for graph in (ENCODER_FILE, DECODER_FILE):
        quantize_int8(fp32_entry / "1" / graph, scratch / "1" / graph)
    config = replace(read_model_config(fp32_entry), name=entry.name, precision="int8")
    write_model_config(config, scratch)
    manifest = json.loads((scratch / "1" / "manifest.json").read_text())
    manifest.update(name=entry.name, precision="int8", derived_from=str(fp32_entry))
    (scratch / "1" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(entry, ignore_errors=True)
    scratch.rename(entry)
    return entry


# --- building the runners -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerSpec:
    """How to build one runner: picklable, so a worker process can build it."""

    name: str
    factory: str  # attnserve | ctranslate2 | hf
    kwargs: dict[str, Any]


def make_runner(spec: RunnerSpec) -> Runner:
    """Build the runner ``spec`` describes (raises Unavailable when it cannot run here)."""
    if spec.factory == "attnserve":
        return AttnServeRunner(**spec.kwargs)
    if spec.factory == "ctranslate2":
        return CTranslate2Runner(**spec.kwargs)
    if spec.factory == "hf":
        return HFGenerateRunner(**spec.kwargs)
    raise ValueError(f"unknown runner factory {spec.factory!r}")


def runner_specs(
    settings: EngineSettings, marian_dir: Path, cache: Path
) -> tuple[list[RunnerSpec], list[dict[str, str]]]:
    """What to run (exports and conversions done, cached), and the skipped engines with reasons."""
    from benchmarks.marian import vocabulary

    specs: list[RunnerSpec] = []
    skipped: list[dict[str, str]] = []
    shape, device, threads = settings.shape, settings.device, settings.threads
    new_tokens = settings.new_tokens
    if "attnserve" in settings.engines:
        for precision in settings.precisions:
            entry = export_attnserve(marian_dir, cache, shape, precision, settings.fast_int8)
            specs.append(
                RunnerSpec(
                    f"attnserve-{precision}",
                    "attnserve",
                    {
                        "entry": entry,
                        "precision": precision,
                        "new_tokens": new_tokens,
                        "threads": threads,
                        "device": device,
                    },
                )
            )
    if "ctranslate2" in settings.engines:
        reason = ctranslate2_available(device)
        splits = thread_splits(threads) if device == "cpu" else [(1, 1)]
        for precision in settings.precisions:
            if reason is not None:
                skipped.append({"engine": f"ctranslate2-{precision}", "reason": reason})
                log(f"skipping ctranslate2-{precision}: {reason}")
                continue
            quantization = {"fp32": "float32", "int8": "int8"}[precision]
            model_dir = convert_ctranslate2(marian_dir, cache, quantization)
            for inter, intra in splits:
                specs.append(
                    RunnerSpec(
                        f"ctranslate2-{precision}-{inter}x{intra}",
                        "ctranslate2",
                        {
                            "model_dir": model_dir,
                            "vocabulary": vocabulary(shape),
                            "precision": precision,
                            "new_tokens": new_tokens,
                            "inter_threads": inter,
                            "intra_threads": intra,
                            "device": device,
                        },
                    )
                )
    if "hf" in settings.engines:
        reason = hf_available(device)
        for use_cache in (True, False):
            name = f"hf-generate-{'kv' if use_cache else 'nokv'}"
            if reason is not None:
                skipped.append({"engine": name, "reason": reason})
                continue
            specs.append(
                RunnerSpec(
                    name,
                    "hf",
                    {
                        "marian_dir": marian_dir,
                        "new_tokens": new_tokens,
                        "use_cache": use_cache,
                        "threads": threads,
                        "device": device,
                    },
                )
            )
    return specs, skipped


def _worker(conn: Any, spec: RunnerSpec) -> None:
    """A worker process: build one runner, then time ``run`` calls on request until "close"."""
    try:
        runner = make_runner(spec)
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

    def __init__(self, spec: RunnerSpec, context: Any) -> None:
        """Start the worker; ``wait_ready`` completes the construction."""
        parent, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, spec), daemon=True)
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


def build_runners(
    settings: EngineSettings, marian_dir: Path, cache: Path
) -> tuple[list[Runner], list[dict[str, str]]]:
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


def source_ids(rng: np.random.Generator, batch: int, length: int, shape: MarianShape) -> np.ndarray:
    """(batch, length) random token ids ending in EOS; no special tokens elsewhere."""
    ids = rng.integers(2, shape.vocab_size - 1, size=(batch, length), dtype=np.int64)
    ids[:, -1] = EOS_ID
    return ids


# --- the run ------------------------------------------------------------------------------------


def run_engine_bench(settings: EngineSettings, cache: Path | None = None) -> dict[str, Any]:
    """Run the engine benchmark and return its result document (not yet written)."""
    from benchmarks import roofline

    settings.check()
    cache = Path(cache) if cache is not None else default_cache()
    started = time.perf_counter()
    snapshot = cpu_snapshot()
    machine = machine_metadata(settings.device)
    if settings.device == "cuda":
        _require_some_cuda(settings)
    log(f"building the random Marian model ({settings.shape.key()}) in {cache}")
    marian_dir = build_marian(cache, settings.shape)
    runners, skipped = build_runners(settings, marian_dir, cache)
    if not runners:
        raise BenchError(
            "no engine can run here: " + "; ".join(f"{s['engine']}: {s['reason']}" for s in skipped)
        )
    log("measuring the fp32 matmul peak and memory bandwidth")
    peak_before = roofline.measure(settings.threads, settings.device, settings.tiny)
    rng = np.random.default_rng(settings.seed)
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for batch in settings.batches:
        ids = source_ids(rng, batch, settings.source_length, settings.shape)
        rows += _bench_batch(settings, runners, ids, failed)
    peak_after = roofline.measure(settings.threads, settings.device, settings.tiny)
    for runner in runners:
        runner.close()
    peak = max(peak_before["matmul"]["gflops"], peak_after["matmul"]["gflops"])
    _derive(rows, settings, peak)
    machine["load_average_end"] = _load_average()
    machine["foreign_cpu_share"] = foreign_cpu_share(snapshot)
    result = {
        "schema": ENGINE_SCHEMA_ID,
        "kind": "engine",
        "run_id": timestamp(),
        "machine": machine,
        "settings": _settings_record(settings),
        "model": {
            "hf_directory": str(marian_dir),
            "shape": asdict(settings.shape),
            "shape_key": settings.shape.key(),
            "flops_per_sequence": settings.shape.flops_per_sequence(
                settings.source_length, settings.new_tokens
            ),
            "decoder_flops_per_token": settings.shape.decoder_flops_per_token(),
            "decoder_weight_bytes_fp32": settings.shape.weight_bytes_fp32(),
        },
        "roofline": {
            "matmul_peak_gflops": peak,
            "before": peak_before,
            "after": peak_after,
        },
        "engines": [
            {
                "name": r.name,
                "family": r.family,
                "precision": r.precision,
                "label": r.label,
                "config": r.config,
                "error": failed.get(r.name),
            }
            for r in runners
        ],
        "skipped": skipped,
        "results": rows,
        "summary": _summary(rows, settings),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    return result


def _require_some_cuda(settings: EngineSettings) -> None:
    reasons = []
    try:
        import torch

        if torch.cuda.is_available():
            return
        reasons.append("torch.cuda.is_available() is False")
    except ImportError:
        reasons.append("torch is not installed")
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return
    reasons.append("onnxruntime has no CUDAExecutionProvider")
    reason = ctranslate2_available("cuda")
    if reason is None:
        return
    reasons.append(reason)
    raise BenchError(
        "--device cuda: CUDA is not available on this machine (" + "; ".join(reasons) + ")"
    )


def _settings_record(settings: EngineSettings) -> dict[str, Any]:
    record = asdict(settings)
    record.pop("shape")
    record["batches"] = list(settings.batches)
    record["engines"] = list(settings.engines)
    record["precisions"] = list(settings.precisions)
    return record


def _bench_batch(
    settings: EngineSettings, runners: list[Runner], ids: np.ndarray, failed: dict[str, str]
) -> list[dict[str, Any]]:
    batch = len(ids)
    live = [r for r in runners if r.name not in failed]
    outputs: dict[str, np.ndarray] = {}
    pids = [pid for r in runners if (pid := getattr(r, "pid", None))]

    def timed(runner: Runner) -> tuple[float, float | None] | None:
        """(seconds, share of the CPU other processes used meanwhile), None on failure."""
        if runner.name in failed:
            return None
        if settings.pause_s:
            time.sleep(settings.pause_s)
        snapshot = cpu_snapshot(pids)
        try:
            elapsed, out = runner.timed_run(ids)
        except Exception as err:  # one engine's failure is recorded, the others go on
            failed[runner.name] = f"{type(err).__name__}: {err}"
            log(f"{runner.name} failed at batch {batch}: {failed[runner.name]}")
            return None
        if out.shape != (batch, settings.new_tokens):
            failed[runner.name] = (
                f"produced shape {tuple(out.shape)}, expected {(batch, settings.new_tokens)}"
            )
            log(f"{runner.name}: {failed[runner.name]}")
            return None
        outputs[runner.name] = out
        return elapsed, foreign_cpu_share(snapshot, pids)

    for runner in live:
        for _ in range(settings.warmup):
            timed(runner)
    times: dict[str, list[float]] = {r.name: [] for r in live}
    shares: dict[str, list[float | None]] = {r.name: [] for r in live}
    discarded: dict[str, list[dict[str, float | None]]] = {r.name: [] for r in live}
    limit = settings.max_foreign_share
    for rep in range(settings.repetitions):
        if limit is not None:  # start every round on a quiet machine
            wait_for_quiet(limit, pids)
        order = live[rep % len(live) :] + live[: rep % len(live)]
        for runner in order:
            for attempt in range(settings.noise_retries + 1):
                measured = timed(runner)
                if measured is None:
                    break
                elapsed, share = measured
                tokens_s = batch * settings.new_tokens / elapsed
                noisy = limit is not None and share is not None and share > limit
                if noisy and attempt < settings.noise_retries:
                    discarded[runner.name].append({"seconds": round(elapsed, 6), "share": share})
                    log(
                        f"batch {batch} round {rep + 1}: {runner.name} {elapsed:.3f} s discarded: "
                        f"other processes used {share:.0%} of the CPU; repeating"
                    )
                    wait_for_quiet(limit or 0.0, pids)
                    continue
                times[runner.name].append(elapsed)
                shares[runner.name].append(share)
                log(
                    f"batch {batch} round {rep + 1}: {runner.name} {elapsed:.3f} s "
                    f"({tokens_s:.0f} tok/s, foreign CPU "
                    f"{'n/a' if share is None else f'{share:.0%}'})"
                )
                break
    reference = outputs.get("hf-generate-kv")
    rows = []
    for runner in live:
        runs = times[runner.name]
        row: dict[str, Any] = {
            "engine": runner.name,
            "family": runner.family,
            "precision": runner.precision,
            "batch": batch,
            "runs_s": [round(t, 6) for t in runs],
            "median_s": round(statistics.median(runs), 6) if runs else None,
            "error": failed.get(runner.name),
            "foreign_cpu_share_runs": shares[runner.name],
            "discarded_runs": discarded[runner.name],
        }
        if reference is not None and runner.name in outputs:
            row["agreement_with_hf"] = round(float((outputs[runner.name] == reference).mean()), 4)
        rows.append(row)
    return rows


def _derive(rows: list[dict[str, Any]], settings: EngineSettings, peak_gflops: float) -> None:
    """tokens/s, ms per step, GFLOP/s, fraction of peak and ratios, per row."""
    flops = settings.shape.flops_per_sequence(settings.source_length, settings.new_tokens)
    for row in rows:
        median = row["median_s"]
        if not median:
            row.update(tokens_per_s=None, ms_per_step=None, gflops=None, fraction_of_peak=None)
            continue
        batch = row["batch"]
        gflops = batch * flops / median / 1e9
        row["tokens_per_s"] = round(batch * settings.new_tokens / median, 2)
        row["ms_per_step"] = round(median / settings.new_tokens * 1000, 4)
        row["gflops"] = round(gflops, 2)
        row["fraction_of_peak"] = round(gflops / peak_gflops, 4) if peak_gflops else None
    for batch in settings.batches:
        same = [r for r in rows if r["batch"] == batch and r["tokens_per_s"]]
        hf = next((r["tokens_per_s"] for r in same if r["engine"] == "hf-generate-kv"), None)
        best_ct2 = {
            precision: max(
                (
                    r["tokens_per_s"]
                    for r in same
                    if r["family"] == "ctranslate2" and r["precision"] == precision
                ),
                default=None,
            )
            for precision in ("fp32", "int8")
        }
        for row in (r for r in rows if r["batch"] == batch):
            rate = row["tokens_per_s"]
            ct2 = best_ct2.get(row["precision"]) or best_ct2.get("fp32")
            row["ratio_to_ctranslate2"] = round(rate / ct2, 3) if rate and ct2 else None
            row["ratio_to_hf"] = round(rate / hf, 3) if rate and hf else None


def _summary(rows: list[dict[str, Any]], settings: EngineSettings) -> dict[str, Any]:
    """Per batch: tokens/s per engine; best CTranslate2 split per precision; ours vs peers."""
    by_batch: dict[str, Any] = {}
    for batch in settings.batches:
        same = [r for r in rows if r["batch"] == batch and r["tokens_per_s"]]
        entry: dict[str, Any] = {"tokens_per_s": {r["engine"]: r["tokens_per_s"] for r in same}}
        for precision in ("fp32", "int8"):
            ct2 = [r for r in same if r["family"] == "ctranslate2" and r["precision"] == precision]
            if ct2:
                best = max(ct2, key=lambda r: r["tokens_per_s"])
                entry[f"best_ctranslate2_{precision}"] = {
                    "engine": best["engine"],
                    "tokens_per_s": best["tokens_per_s"],
                }
            ours = next((r for r in same if r["engine"] == f"attnserve-{precision}"), None)
            if ours is not None:
                entry[f"attnserve_{precision}"] = {
                    "tokens_per_s": ours["tokens_per_s"],
                    "ratio_to_ctranslate2": ours.get("ratio_to_ctranslate2"),
                    "ratio_to_hf": ours.get("ratio_to_hf"),
                    "fraction_of_peak": ours.get("fraction_of_peak"),
                }
        by_batch[str(batch)] = entry
    return {"by_batch": by_batch}


# --- entry point used by the CLI ----------------------------------------------------------------


def main(settings: EngineSettings, out_dir: Path, cache: Path | None, plots: bool = True) -> Path:
    """Run, validate, write the JSON (and PNGs); return the JSON path."""
    result = run_engine_bench(settings, cache)
    if plots:
        from benchmarks.plots import engine_plots

        result["plots"] = [p.name for p in engine_plots(result, out_dir)]
    path = write_result(result, out_dir, "engine")
    log(f"wrote {path}")
    return path
