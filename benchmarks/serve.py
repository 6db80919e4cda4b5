"""`attnserve bench serve`: the gRPC server under load, batching on and off.

For each server *setup* (``serve_settings``: ``batching``, ``no_inflight``, ``no_batching``,
``two_frontends``, ``instances``) the benchmark writes a copy of the repository whose config.yaml
files carry that setup's batching (and, for ``instances``, the threads split between the engine
instances), starts ``attnserve serve`` on it in a child process (``serve_setups``;
``--frontend-workers 2`` for ``two_frontends``), and drives it with ``benchmarks.loadgen``
(``serve_workloads``): closed loop at each concurrency (translator unary and streaming, ViT
classify) and open loop with Poisson arrivals at set rates (by default fractions of the setup's
closed-loop peak). Translations decode exactly ``new_tokens`` tokens (min = max new tokens).

Measured offline in the same run, in this process, with the server's ONNX Runtime settings and
no server running, before and after the load (``serve_offline``): the translator's fixed-length
greedy throughput per batch size, its minimal request's engine time (encode + one decoder step),
and the ViT's ONNX Runtime rate at batch 1 and 32. Also in the same run (``serve_peers``): the
ViT over the KServe protocol on attnserve and on a Triton peer serving the same ONNX model, and
perf_analyzer as a second load generator. The goals (``serve_goals``, ``serve_peer_goals``)
compare served figures against these, and land in the JSON with the measured value and
pass / fail.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_snapshot, foreign_cpu_share, load_average, machine_metadata
from benchmarks.marian import default_cache
from benchmarks.output import log, timestamp, write_result
from benchmarks.schema import SERVE_SCHEMA_ID, BenchError
from benchmarks.serve_goals import evaluate_goals
from benchmarks.serve_offline import measure_offline, merge_offline
from benchmarks.serve_peers import SameRun
from benchmarks.serve_settings import FRONTEND_WORKERS, ServeSettings
from benchmarks.serve_setups import server_process, setup_repository, shipped_repository
from benchmarks.serve_workloads import drive_setup, sample_image


def run_serve_bench(
    settings: ServeSettings, cache: Path | None = None, repository: Path | None = None
) -> dict[str, Any]:
    """Run the serve benchmark and return its result document (not yet written)."""
    settings.check()
    started = time.perf_counter()
    snapshot = cpu_snapshot()
    cache = Path(cache) if cache is not None else default_cache()
    machine = machine_metadata(settings.device)
    if settings.device == "cuda":
        _require_cuda()
    repository = Path(repository) if repository is not None else shipped_repository(cache)
    models = _served_models(repository, settings.models)
    language = _language(repository, models, settings.language)
    image = sample_image()
    log("offline references (no server running)")
    before = measure_offline(repository, models, settings, language or "", image)
    with tempfile.TemporaryDirectory(prefix="attnserve-bench-peers-") as scratch:
        same_run = SameRun(settings, repository, cache, language or "", image, Path(scratch))
        points, variants = drive_setups(
            repository, models, settings, language or "", image, same_run
        )
        if "vit" in models:
            points += same_run.triton()
    log("offline references again (after the load)")
    after = measure_offline(repository, models, settings, language or "", image)
    offline = _merged_offline(before, after)
    machine["load_average_end"] = load_average()
    machine["foreign_cpu_share"] = foreign_cpu_share(snapshot)
    return {
        "schema": SERVE_SCHEMA_ID,
        "kind": "serve",
        "run_id": timestamp(),
        "machine": machine,
        "settings": _settings_record(settings, models, repository, language),
        "variants": variants,
        "offline": offline,
        "points": points,
        **same_run.sections(),
        "goals": evaluate_goals(points, offline, same_run.sections(), settings.device),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def drive_setups(
    repository: Path,
    models: tuple[str, ...],
    settings: ServeSettings,
    language: str,
    image: bytes,
    same_run: SameRun | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each setup's server started, loaded and stopped in turn: (load points, variant records).
    ``same_run`` measures the ``batching`` setup's server over KServe and with perf_analyzer."""
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
                workers = FRONTEND_WORKERS.get(setup, 1)
                server = server_process(setup_repo, workers).start()
            except RuntimeError as err:
                raise BenchError(f"the server for {setup_repo} did not start: {err}") from err
            try:
                points += asyncio.run(drive_setup(server, setup, settings, language, image))
                if same_run is not None and setup == "batching":
                    points += same_run.attnserve(server, models)
            finally:
                server.stop()
    return points, variants


def _require_cuda() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise BenchError(
            "--device cuda: CUDA is not available here (onnxruntime has no "
            "CUDAExecutionProvider; the server runs ONNX Runtime)"
        )


def _served_models(repository: Path, wanted: tuple[str, ...]) -> tuple[str, ...]:
    """The ``wanted`` models that ``repository`` holds (BenchError when none)."""
    from contract.repository import CONFIG_FILE

    models = tuple(m for m in wanted if (repository / m / CONFIG_FILE).is_file())
    if not models:
        raise BenchError(f"{repository} holds none of the models {list(wanted)}")
    return models


def _language(repository: Path, models: tuple[str, ...], language: str | None) -> str | None:
    """The target language asked for, else the translator's first one ("" when it has none)."""
    from contract.model_config import GeneratorConfig
    from contract.repository import read_model_config

    if "translator" in models and language is None:
        config = read_model_config(repository / "translator")
        assert isinstance(config, GeneratorConfig)
        language = config.languages[0] if config.languages else ""
    return language


def _merged_offline(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    offline: dict[str, Any] = {}
    if "translator" in before:
        offline["translator"] = merge_offline(
            before["translator"], after["translator"], "tokens_per_s"
        )
    if "vit" in before:
        offline["vit"] = merge_offline(before["vit"], after["vit"], "images_per_s")
    return offline


def _settings_record(
    settings: ServeSettings, models: tuple[str, ...], repository: Path, language: str | None
) -> dict[str, Any]:
    record = asdict(settings)
    record["concurrency"] = list(settings.concurrency)
    record["rates"] = list(settings.rates) if settings.rates is not None else None
    record["models"] = list(models)
    record["setups"] = list(settings.setups)
    record["repository"] = str(repository)
    record["language"] = language
    return record


def main(
    settings: ServeSettings,
    out_dir: Path,
    cache: Path | None,
    repository: Path | None = None,
    plots: bool = True,
) -> Path:
    """Run, validate, write the JSON (and PNGs); return the JSON path."""
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
