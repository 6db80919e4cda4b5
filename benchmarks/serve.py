"""`attnserve bench serve`: the gRPC server under load, batching on and off.

For each server *setup* the benchmark writes a copy of the repository whose config.yaml files
carry that setup's batching (the version folders are symlinked), starts ``attnserve serve`` on a
free loopback port in a child process (so the load generator does not share its interpreter),
and drives it with ``benchmarks.loadgen``:

- ``batching``: the repository's own configuration (in-flight batching for the translator,
  Triton-style dynamic batching for the ViT);
- ``no_inflight``: translator with ``Batching(in_flight=False)`` (sequences batched up to
  max_batch_size);
- ``no_batching``: translator with in_flight=False, max_batch_size=1, max_active_sequences=1;
  ViT with max_batch_size=1 (dynamic batching off).

Load points: closed loop at each concurrency (translator unary and streaming, ViT classify) and
open loop with Poisson arrivals at set rates (by default fractions of the setup's closed-loop
peak). Translations decode exactly ``new_tokens`` tokens (min = max new tokens).

Measured offline in the same run, in this process, with the server's ONNX Runtime settings (and
no server running): the translator's fixed-length greedy throughput at batch 1 and 32, its
minimal request's engine time (encode + one decoder step), and the ViT's ONNX Runtime rate at
batch 1 and 32. The goals compare served figures against them (and against FACTS.md's Triton
figures) and land in the JSON with the measured value and pass / fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine import (
    _load_average,
    cpu_snapshot,
    fixed_greedy,
    foreign_cpu_share,
    log,
    machine_metadata,
    timestamp,
    wait_for_quiet,
)
from benchmarks.marian import default_cache
from benchmarks.schema import SERVE_SCHEMA_ID, BenchError
from benchmarks.server_process import ServeProcess

SETUPS = ("batching", "no_inflight", "no_batching")
MODELS = ("translator", "vit")
ROOT = Path(__file__).resolve().parent.parent
# FACTS.md: a real Triton server (PyTriton 0.7, dynamic batcher, python backend calling
# onnxruntime) serving the small ViT, one image per gRPC request, on these 2 cores.
TRITON_VIT_C1 = (84.0, 141.0)
TRITON_VIT_C32 = (446.0, 570.0)
VIT_C1_FACTOR = 2.5  # goal: >= 2.5x Triton at concurrency 1
VIT_C32_OF_ORT = 0.90  # goal: >= 90% of onnxruntime's batch-32 rate at concurrency 32
SERVED_OF_OFFLINE = 0.85  # goal: 32 streams >= 85% of the engine's offline batch-32 rate
OVERHEAD_MS = 1.0  # goal: per-request gRPC + scheduling overhead <= 1 ms p50
GOAL_CONCURRENCY = 32
DEFAULT_TEXT = "three hundred and forty-seven thousand two hundred and fifty-eight"


@dataclass
class ServeSettings:
    """What one serve benchmark run measures."""

    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    rates: tuple[float, ...] | None = None  # open loop requests/s; None = fractions of the peak
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
    duration_s: float = 5.0  # per load point
    warmup_s: float = 1.0  # closed-loop warm-up before each closed-loop point
    overhead_s: float = 3.0  # concurrency-1 minimal requests for the overhead figure
    new_tokens: int = 64
    models: tuple[str, ...] = MODELS
    setups: tuple[str, ...] = SETUPS
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    device: str = "cpu"
    offline_repetitions: int = 5
    # A load point during which other processes used more than this share of the machine's CPU
    # is discarded (recorded) and measured again, at most ``noise_retries`` times. None: keep.
    max_foreign_share: float | None = 0.10
    noise_retries: int = 2
    text: str = DEFAULT_TEXT
    language: str | None = None  # default: the translator's first language
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
            setups=("batching", "no_batching"),
            offline_repetitions=2,
            max_foreign_share=None,
            text="three hundred and twelve",
            tiny=True,
        )
        return replace(base, **overrides)

    def check(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("--concurrency must list numbers >= 1")
        if self.rates is not None and (not self.rates or min(self.rates) <= 0):
            raise ValueError("--rates must list rates > 0")
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


# --- repositories -------------------------------------------------------------------------------


def shipped_repository(cache: Path) -> Path:
    """The shipped translator and ViT, exported into the cache (fp32, as plans/shipped.yaml)."""
    from serving.model_config import CONFIG_FILE

    repository = Path(cache) / "shipped-repository"
    missing = [m for m in MODELS if not (repository / m / CONFIG_FILE).is_file()]
    if missing:
        from export.exporter import ExportOptions, export

        for kind in missing:
            log(f"exporting the shipped {kind} into {repository} (first use)")
            export(kind, repository, ExportOptions(force=True))
    return repository


BATCHING_EDITS: dict[str, dict[str, dict[str, Any]]] = {
    "batching": {"translator": {}, "vit": {}},
    "no_inflight": {"translator": {"in_flight": False}},
    "no_batching": {
        "translator": {"in_flight": False, "max_batch_size": 1, "max_active_sequences": 1},
        "vit": {"max_batch_size": 1, "max_queue_delay_us": 0},
    },
}


def setup_repository(
    source: Path, setup: str, models: tuple[str, ...], threads: int, device: str, root: Path
) -> tuple[Path, list[dict[str, Any]]]:
    """ROOT/SETUP: the models' entries with edited config.yaml, version folders symlinked.

    Returns:
        The repository and one variant record per model (name, model, batching, onnxruntime).
    """
    from serving.model_config import read_model_config, version_dirs, write_model_config

    target = root / setup
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    variants = []
    for model in models:
        edits = BATCHING_EDITS[setup].get(model)
        if edits is None:
            continue
        entry = source / model
        config = read_model_config(entry)
        providers = ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)
        config = replace(
            config,
            batching=replace(config.batching, **edits),
            onnxruntime=replace(
                config.onnxruntime, intra_op_threads=threads, execution_providers=providers
            ),
        )
        (target / model).mkdir()
        write_model_config(config, target / model)
        for version in version_dirs(entry):
            os.symlink((entry / str(version)).resolve(), target / model / str(version))
        variants.append(
            {
                "name": setup,
                "model": model,
                "batching": asdict(config.batching),
                "onnxruntime": {
                    "intra_op_threads": threads,
                    "execution_providers": list(providers),
                },
                "edits": edits,
            }
        )
    return target, variants


# --- the server process -------------------------------------------------------------------------


def server_process(repository: Path) -> ServeProcess:
    """``attnserve serve`` for the load generator: loopback, no metrics port, warnings only."""
    return ServeProcess(
        repository,
        "--host",
        "127.0.0.1",
        "--metrics-port",
        "-1",
        "--log-level",
        "WARNING",
        grace=2,
        keep_lines=200,
    )


# --- offline references -------------------------------------------------------------------------


def _median_rate(fn: Any, work: float, repetitions: int) -> tuple[float, list[float]]:
    fn()  # warm-up
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return work / statistics.median(times), times


def _served_model(entry: Path, threads: int, device: str) -> Any:
    """A ServedModel of ``entry`` with the server's ONNX Runtime settings (not started)."""
    from serving.model_config import read_model_config, resolve_version
    from serving.repository import make_backend
    from serving.runtime import ServedModel

    config = read_model_config(entry)
    providers = ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)
    config = replace(
        config,
        onnxruntime=replace(
            config.onnxruntime, intra_op_threads=threads, execution_providers=providers
        ),
    )
    version_dir = resolve_version(entry)
    return ServedModel(config, version_dir, make_backend(config, version_dir))


def offline_translator(entry: Path, settings: ServeSettings, language: str) -> dict[str, Any]:
    """Fixed-length greedy tokens/s at batch 1 and 32, and the minimal request's engine time."""
    model = _served_model(entry, settings.threads, settings.device)
    assert model.engine is not None
    runner = model.engine.runner
    eos = model.config.decoder.eos_id
    ids = model.source_ids(settings.text, language)[None, :]
    result: dict[str, Any] = {
        "source_tokens": int(ids.shape[1]),
        "new_tokens": settings.new_tokens,
        "tokens_per_s": {},
        "runs_s": {},
    }
    for batch in sorted({1, GOAL_CONCURRENCY, *[c for c in settings.concurrency if c <= 64]}):
        batch_ids = np.repeat(ids, batch, axis=0)

        def decode(batch_ids: np.ndarray = batch_ids) -> None:
            encoded = runner.encode(
                {"input_ids": batch_ids, "attention_mask": np.ones_like(batch_ids)}
            )
            fixed_greedy(runner, encoded, settings.new_tokens, [eos])

        rate, times = _median_rate(
            decode, batch * settings.new_tokens, settings.offline_repetitions
        )
        result["tokens_per_s"][str(batch)] = round(rate, 2)
        result["runs_s"][str(batch)] = [round(t, 5) for t in times]

    def minimal() -> None:
        encoded = runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        fixed_greedy(runner, encoded, 1, [eos])

    minimal()
    samples: list[float] = []
    stop = time.perf_counter() + max(0.5, settings.overhead_s / 2)
    while time.perf_counter() < stop or len(samples) < 20:
        t0 = time.perf_counter()
        minimal()
        samples.append(time.perf_counter() - t0)
    result["minimal_request_ms"] = {
        "p50": round(float(np.percentile(samples, 50)) * 1000, 4),
        "mean": round(float(np.mean(samples)) * 1000, 4),
        "samples": len(samples),
        "what": "encode + one decoder step at batch 1 (Seq2SeqRunner, server's ORT options)",
    }
    return result


def offline_vit(entry: Path, settings: ServeSettings, image: bytes) -> dict[str, Any]:
    """onnxruntime images/s at batch 1 and 32 on the server's preprocessed pixels."""
    model = _served_model(entry, settings.threads, settings.device)
    pixels = model.image_pixels(image)
    result: dict[str, Any] = {"images_per_s": {}, "runs_s": {}}
    for batch in (1, GOAL_CONCURRENCY):
        batch_pixels = np.repeat(pixels[None], batch, axis=0)

        def call(batch_pixels: np.ndarray = batch_pixels) -> None:
            model.backend.run("model", {"pixel_values": batch_pixels})

        call()
        times: list[float] = []
        stop = time.perf_counter() + (0.3 if settings.tiny else 2.0)
        while time.perf_counter() < stop or len(times) < 5:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        result["images_per_s"][str(batch)] = round(batch / statistics.median(times), 2)
        result["runs_s"][str(batch)] = len(times)
        if batch == 1:
            result["batch1_ms"] = {
                "p50": round(float(np.percentile(times, 50)) * 1000, 4),
                "mean": round(float(np.mean(times)) * 1000, 4),
            }
    return result


def _merge_offline(first: dict[str, Any], second: dict[str, Any], key: str) -> dict[str, Any]:
    """Offline figures measured before and after the load: the mean of the two medians."""
    merged = dict(first)
    merged[key] = {
        b: round((first[key][b] + second[key][b]) / 2, 2) for b in first[key] if b in second[key]
    }
    merged["before"] = first[key]
    merged["after"] = second[key]
    for name in ("minimal_request_ms", "batch1_ms"):
        if name in first and name in second:
            merged[name] = dict(first[name])
            merged[name]["p50"] = round((first[name]["p50"] + second[name]["p50"]) / 2, 4)
            merged[name]["before_p50"] = first[name]["p50"]
            merged[name]["after_p50"] = second[name]["p50"]
    return merged


# --- workloads ----------------------------------------------------------------------------------


def sample_image(size: int = 32, seed: int = 0) -> bytes:
    """A deterministic random RGB PNG (the classifier's answer does not matter here)."""
    from models.data.images import encode_png

    rng = np.random.default_rng(seed)
    return encode_png(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8))


def _plan(setup: str, models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(model, method) pairs measured in closed loop for a setup."""
    plan = []
    if "translator" in models:
        plan.append(("translator", "translate_stream"))
        if setup == "batching":
            plan.append(("translator", "translate"))
    if "vit" in models and "vit" in BATCHING_EDITS[setup]:
        plan.append(("vit", "classify"))
    return plan


def _open_plan(setup: str, models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(model, method) pairs measured in open loop for a setup."""
    plan = []
    if "translator" in models and setup in ("batching", "no_inflight"):
        plan.append(("translator", "translate_stream"))
    if "vit" in models and "vit" in BATCHING_EDITS[setup]:
        plan.append(("vit", "classify"))
    return plan


async def _drive_setup(
    server: ServeProcess,
    setup: str,
    settings: ServeSettings,
    language: str,
    image: bytes,
) -> list[dict[str, Any]]:
    from benchmarks.loadgen import Client, Workload, measure

    points: list[dict[str, Any]] = []

    def workload(model: str, method: str, new_tokens: int | None = None) -> Workload:
        if method == "classify":
            return Workload(method, model, image=image)
        return Workload(
            method,
            model,
            text=settings.text,
            language=language,
            new_tokens=settings.new_tokens if new_tokens is None else new_tokens,
        )

    async def point(
        model: str,
        method: str,
        name: str = "fixed",
        new_tokens: int | None = None,
        **load: Any,
    ) -> dict[str, Any]:
        client = Client(server.address, workload(model, method, new_tokens))
        discarded = []
        try:
            await client.wait_ready()
            for attempt in range(settings.noise_retries + 1):
                result = await measure(client, server_pid=server.pid, **load)
                share = result.get("foreign_cpu_share")
                limit = settings.max_foreign_share
                if limit is None or share is None or share <= limit:
                    break
                if attempt == settings.noise_retries:
                    result["noisy"] = True
                    break
                discarded.append(
                    {"throughput_rps": result["throughput_rps"], "foreign_cpu_share": share}
                )
                log(f"{setup} {model} {method}: other processes used {share:.0%}; repeating")
                pids = [server.pid] if server.pid else []
                await asyncio.to_thread(wait_for_quiet, limit, pids)
        finally:
            await client.close()
        result["discarded"] = discarded
        record = {
            "model": model,
            "variant": setup,
            "method": method,
            "workload": name,
            "loop": "closed" if load.get("concurrency") else "open",
            "concurrency": load.get("concurrency"),
            "rate": load.get("rate"),
            **result,
        }
        tokens = f", {record['tokens_per_s']:.0f} tok/s" if record.get("tokens_per_s") else ""
        where = (
            f"c={record['concurrency']}"
            if record["concurrency"]
            else f"rate={record['rate']:.1f}/s"
        )
        log(
            f"{setup} {model} {method} {name} {where}: "
            f"{record['throughput_rps']:.1f} req/s{tokens}, "
            f"p50 {record['latency_ms']['p50']} ms, p99 {record['latency_ms']['p99']} ms, "
            f"errors {record['errors']}"
        )
        points.append(record)
        return record

    # Minimal requests at concurrency 1: the per-request overhead figure.
    if setup == "batching" and "translator" in settings.models:
        await point(
            "translator",
            "translate",
            "minimal",
            new_tokens=1,
            concurrency=1,
            duration=settings.overhead_s,
            warmup=settings.warmup_s,
        )
    peaks: dict[tuple[str, str], float] = {}
    for model, method in _plan(setup, settings.models):
        for concurrency in settings.concurrency:
            record = await point(
                model,
                method,
                concurrency=concurrency,
                duration=settings.duration_s,
                warmup=settings.warmup_s,
            )
            peaks[(model, method)] = max(peaks.get((model, method), 0.0), record["throughput_rps"])
    for model, method in _open_plan(setup, settings.models):
        if settings.rates is not None:
            rates = list(settings.rates)
        else:
            peak = peaks.get((model, method), 0.0)
            rates = [round(peak * f, 2) for f in settings.rate_fractions if peak * f > 0]
        for i, rate in enumerate(rates):
            await point(model, method, rate=rate, duration=settings.duration_s, seed=i)
    return points


# --- goals --------------------------------------------------------------------------------------


def _find(points: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for p in points:
        if all(p.get(k) == v for k, v in match.items()):
            return p
    return None


def _goal(
    name: str,
    goal: str,
    measured: float | None,
    target: float,
    at_least: bool,
    unit: str,
    **details: Any,
) -> dict[str, Any]:
    if measured is None:
        return {
            "name": name,
            "goal": goal,
            "measured": None,
            "target": target,
            "unit": unit,
            "passed": None,
            "gap": None,
            "margin": None,
            "note": "not measured in this run",
            **details,
        }
    margin = measured - target if at_least else target - measured
    return {
        "name": name,
        "goal": goal,
        "measured": round(measured, 4),
        "target": round(target, 4),
        "unit": unit,
        "passed": margin >= 0,
        "margin": round(margin, 4),
        "gap": round(max(0.0, -margin), 4),
        **details,
    }


def evaluate_goals(points: list[dict[str, Any]], offline: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each with the measured figure, the target and pass / fail."""
    goals = []
    translator = offline.get("translator")
    if translator is not None:
        offline_rate = translator["tokens_per_s"].get(str(GOAL_CONCURRENCY))
        for setup in SETUPS:
            served = _find(
                points,
                model="translator",
                variant=setup,
                method="translate_stream",
                loop="closed",
                concurrency=GOAL_CONCURRENCY,
            )
            if served is None and setup != "batching":
                continue
            measured = (
                served["tokens_per_s"] / offline_rate
                if served and served.get("tokens_per_s") and offline_rate
                else None
            )
            goals.append(
                _goal(
                    f"translator_served_vs_offline_c{GOAL_CONCURRENCY}[{setup}]",
                    f"{GOAL_CONCURRENCY} concurrent translation streams: served new tokens/s "
                    f">= {SERVED_OF_OFFLINE:.0%} of the engine's offline batch-"
                    f"{GOAL_CONCURRENCY} rate",
                    measured,
                    SERVED_OF_OFFLINE,
                    True,
                    "fraction",
                    variant=setup,
                    served_tokens_per_s=served.get("tokens_per_s") if served else None,
                    offline_tokens_per_s=offline_rate,
                )
            )
        minimal = _find(points, model="translator", workload="minimal")
        engine_ms = translator["minimal_request_ms"]["p50"]
        client_ms = minimal["latency_ms"]["p50"] if minimal else None
        server_ms = (minimal.get("server_total_ms") or {}).get("p50") if minimal else None
        goals.append(
            _goal(
                "overhead_p50_ms[translate]",
                f"per-request gRPC + scheduling overhead <= {OVERHEAD_MS:g} ms p50: unary "
                "Translate of one text with 1 new token at concurrency 1, client latency minus "
                "the engine's own time for it (encode + one decoder step)",
                client_ms - engine_ms if client_ms is not None else None,
                OVERHEAD_MS,
                False,
                "ms",
                variant="batching",
                client_p50_ms=client_ms,
                engine_p50_ms=engine_ms,
                server_total_p50_ms=server_ms,
                grpc_p50_ms=round(client_ms - server_ms, 4) if client_ms and server_ms else None,
                scheduling_p50_ms=round(server_ms - engine_ms, 4) if server_ms else None,
            )
        )
    vit = offline.get("vit")
    if vit is not None:
        batch1_ms = vit["batch1_ms"]["p50"]
        ort32 = vit["images_per_s"].get(str(GOAL_CONCURRENCY))
        for setup in ("batching", "no_batching"):
            c1 = _find(
                points, model="vit", variant=setup, method="classify", loop="closed", concurrency=1
            )
            c32 = _find(
                points,
                model="vit",
                variant=setup,
                method="classify",
                loop="closed",
                concurrency=GOAL_CONCURRENCY,
            )
            if c1 is None and c32 is None and setup != "batching":
                continue
            client_ms = c1["latency_ms"]["p50"] if c1 else None
            goals.append(
                _goal(
                    f"overhead_p50_ms[classify,{setup}]",
                    f"per-request overhead <= {OVERHEAD_MS:g} ms p50: Classify at concurrency 1, "
                    "client latency minus onnxruntime's batch-1 call (includes image decoding "
                    "and, with dynamic batching, the queue delay)",
                    client_ms - batch1_ms if client_ms is not None else None,
                    OVERHEAD_MS,
                    False,
                    "ms",
                    variant=setup,
                    client_p50_ms=client_ms,
                    engine_p50_ms=batch1_ms,
                )
            )
            goals.append(
                _goal(
                    f"vit_c1_images_per_s[{setup}]",
                    f"ViT at concurrency 1 >= {VIT_C1_FACTOR}x FACTS' Triton figure "
                    f"({TRITON_VIT_C1[0]:g}-{TRITON_VIT_C1[1]:g} img/s; target from the top "
                    "of the range)",
                    c1["throughput_rps"] if c1 else None,
                    VIT_C1_FACTOR * TRITON_VIT_C1[1],
                    True,
                    "images/s",
                    variant=setup,
                    triton_images_per_s=list(TRITON_VIT_C1),
                    ratio_to_triton=[round(c1["throughput_rps"] / t, 3) for t in TRITON_VIT_C1]
                    if c1
                    else None,
                    ort_batch1_images_per_s=vit["images_per_s"].get("1"),
                )
            )
            goals.append(
                _goal(
                    f"vit_c{GOAL_CONCURRENCY}_vs_ort_b{GOAL_CONCURRENCY}[{setup}]",
                    f"ViT at concurrency {GOAL_CONCURRENCY} >= {VIT_C32_OF_ORT:.0%} of "
                    f"onnxruntime's own batch-{GOAL_CONCURRENCY} images/s (same run)",
                    c32["throughput_rps"] / ort32 if c32 and ort32 else None,
                    VIT_C32_OF_ORT,
                    True,
                    "fraction",
                    variant=setup,
                    served_images_per_s=c32["throughput_rps"] if c32 else None,
                    ort_images_per_s=ort32,
                    triton_images_per_s=list(TRITON_VIT_C32),
                )
            )
    return goals


# --- the run ------------------------------------------------------------------------------------


def run_serve_bench(
    settings: ServeSettings, cache: Path | None = None, repository: Path | None = None
) -> dict[str, Any]:
    """Run the serve benchmark and return its result document (not yet written)."""
    from serving.model_config import CONFIG_FILE, read_model_config

    settings.check()
    started = time.perf_counter()
    snapshot = cpu_snapshot()
    cache = Path(cache) if cache is not None else default_cache()
    machine = machine_metadata(settings.device)
    if settings.device == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise BenchError(
                "--device cuda: CUDA is not available here (onnxruntime has no "
                "CUDAExecutionProvider; the server runs ONNX Runtime)"
            )
    if repository is None:
        repository = shipped_repository(cache)
    repository = Path(repository)
    models = tuple(m for m in settings.models if (repository / m / CONFIG_FILE).is_file())
    if not models:
        raise BenchError(f"{repository} holds none of the models {list(settings.models)}")
    language = settings.language
    if "translator" in models and language is None:
        languages = read_model_config(repository / "translator").languages
        language = languages[0] if languages else ""
    image = sample_image()

    offline: dict[str, Any] = {}

    def measure_offline() -> dict[str, Any]:
        figures: dict[str, Any] = {}
        if "translator" in models:
            figures["translator"] = offline_translator(
                repository / "translator", settings, language or ""
            )
        if "vit" in models:
            figures["vit"] = offline_vit(repository / "vit", settings, image)
        return figures

    log("offline references (no server running)")
    before = measure_offline()
    points: list[dict[str, Any]] = []
    variants: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnserve-bench-serve-") as scratch:
        for setup in settings.setups:
            setup_repo, setup_variants = setup_repository(
                repository, setup, models, settings.threads, settings.device, Path(scratch)
            )
            if not setup_variants:
                continue
            variants += setup_variants
            log(f"setup {setup}: starting the server")
            try:
                server = server_process(setup_repo).start()
            except RuntimeError as err:
                raise BenchError(f"the server for {setup_repo} did not start: {err}") from err
            try:
                points += asyncio.run(_drive_setup(server, setup, settings, language or "", image))
            finally:
                server.stop()
    log("offline references again (after the load)")
    after = measure_offline()
    if "translator" in before:
        offline["translator"] = _merge_offline(
            before["translator"], after["translator"], "tokens_per_s"
        )
    if "vit" in before:
        offline["vit"] = _merge_offline(before["vit"], after["vit"], "images_per_s")
    machine["load_average_end"] = _load_average()
    machine["foreign_cpu_share"] = foreign_cpu_share(snapshot)
    record = asdict(settings)
    record["concurrency"] = list(settings.concurrency)
    record["rates"] = list(settings.rates) if settings.rates is not None else None
    record["models"] = list(models)
    record["setups"] = list(settings.setups)
    record["repository"] = str(repository)
    record["language"] = language
    return {
        "schema": SERVE_SCHEMA_ID,
        "kind": "serve",
        "run_id": timestamp(),
        "machine": machine,
        "settings": record,
        "variants": variants,
        "offline": offline,
        "points": points,
        "goals": evaluate_goals(points, offline),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def main(
    settings: ServeSettings,
    out_dir: Path,
    cache: Path | None,
    repository: Path | None = None,
    plots: bool = True,
) -> Path:
    """Run, validate, write the JSON (and PNGs); return the JSON path."""
    from benchmarks.engine import write_result

    result = run_serve_bench(settings, cache, repository)
    if plots:
        from benchmarks.plots import serve_plots

        result["plots"] = [p.name for p in serve_plots(result, out_dir)]
    path = write_result(result, out_dir, "serve")
    for goal in result["goals"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[goal["passed"]]
        log(f"goal {goal['name']}: {verdict} measured {goal['measured']} target {goal['target']}")
    log(f"wrote {path}")
    return path
