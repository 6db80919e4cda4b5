"""Same-run comparisons of `attnserve bench serve`: attnserve and a Triton peer under one KServe
load, and perf_analyzer as a second load generator.

While the ``batching`` setup's attnserve server runs, ``SameRun.attnserve`` drives its ViT over
the KServe protocol (``kserve_infer``: one decoded RGB image per ModelInfer request, the input
both servers declare) at each of ``peer_concurrency``, then (``--perf-analyzer``) lets
perf_analyzer measure the ViT with no flags and the translator with ``--streaming``, its text and
target language from input data and the benchmark's fixed length as request parameters. After
the setups, ``SameRun.triton`` starts the Triton peer (``benchmarks.triton_peer``) on the same
ViT ONNX model with attnserve's batching settings and measures it with the same load and the
same perf_analyzer runs. A peer that cannot run is recorded as skipped, with the reason. Each
perf_analyzer run sits between two points of the load generator at its concurrency (the ViT over
KServe, the translator's stream), which its throughput is compared with.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.loadgen import Client, Workload, measure
from benchmarks.machine import wait_for_quiet
from benchmarks.output import log
from benchmarks.perf_analyzer import (
    VERSION,
    PerfAnalyzer,
    find_perf_analyzer,
    install_perf_analyzer,
)
from benchmarks.serve_settings import ServeSettings
from benchmarks.server_process import ServeProcess
from benchmarks.server_statistics import model_statistics, server_side
from benchmarks.triton_peer import (
    PeerUnavailable,
    TritonPeer,
    peer_python,
    probe,
    session_processes,
    vit_spec,
)

METHOD = "kserve_infer"
TRITON = "triton"  # the variant (and server) name of the peer's points


def rgb_image(png: bytes, entry: Path) -> np.ndarray:
    """The benchmark's sample image decoded at the entry's image size: UINT8 [1, S, S, 3]."""
    from contract.images import decode_image
    from contract.model_config import ClassifierConfig
    from contract.repository import read_model_config

    config = read_model_config(entry)
    size = config.image.size if isinstance(config, ClassifierConfig) else 32
    return decode_image(png, size)[None]


@dataclass
class SameRun:
    """The KServe points and perf_analyzer runs of one benchmark run, and their JSON sections."""

    settings: ServeSettings
    repository: Path
    cache: Path
    language: str
    png: bytes  # the benchmark's sample image
    scratch: Path
    perf: PerfAnalyzer | None = None
    perf_section: dict[str, Any] = field(default_factory=dict)
    triton_section: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.perf_section = {"status": "not requested", "version": VERSION, "runs": []}
        self.perf_section["reason"] = "run with --perf-analyzer to drive perf_analyzer too"
        self.triton_section = {"status": "not run", "reason": "no ViT in this run", "server": {}}
        if self.settings.perf_analyzer:
            found = find_perf_analyzer()
            if isinstance(found, str):
                log(f"perf_analyzer: {found}; installing it with pip")
                found = install_perf_analyzer()
            if isinstance(found, str):
                self.perf_section.update(status="skipped", reason=found)
            else:
                self.perf = found
                self.perf_section.update(status="measured", reason=None)

    def attnserve(self, server: ServeProcess, models: tuple[str, ...]) -> list[dict[str, Any]]:
        """The attnserve server's KServe ViT points and perf_analyzer runs; the points."""
        points = []
        if "vit" in models:
            load = self._points(
                server.address, "batching", "attnserve", server.cpu_seconds, server.processes
            )
            points = asyncio.run(load)
        for model in models:
            self._perf_runs(server.address, "attnserve", model)
        return points

    def triton(self) -> list[dict[str, Any]]:
        """Start the Triton peer on the ViT, measure it like attnserve, stop it; the points."""
        if not self.settings.triton:
            self.triton_section.update(status="skipped", reason="--no-triton")
            return []
        try:
            python = peer_python(
                self.cache,
                Path(self.settings.triton_python) if self.settings.triton_python else None,
                install=not self.settings.tiny,
            )
            spec = vit_spec(self.repository / "vit", self.settings.threads)
            peer = TritonPeer(python, spec)
            log(f"Triton peer: starting PyTriton {probe(python)} on the ViT ({python})")
            peer.start()
        except PeerUnavailable as err:
            log(f"Triton peer skipped: {err}")
            self.triton_section.update(status="skipped", reason=str(err))
            return []
        try:
            self.triton_section.update(status="measured", reason=None, server=_server(peer))
            assert peer.process is not None  # started above
            pids = functools.partial(session_processes, peer.process.pid)
            load = self._points(peer.address, TRITON, TRITON, peer.cpu_seconds, pids)
            points = asyncio.run(load)
            self._perf_runs(peer.address, TRITON, "vit")
        finally:
            peer.stop()
        return points

    async def _points(
        self,
        address: str,
        variant: str,
        server: str,
        server_cpu: Callable[[], float | None],
        pids: Callable[[], list[int]],
    ) -> list[dict[str, Any]]:
        """Closed-loop KServe ViT points at each peer concurrency."""
        client = Client(address, self._loadgen_workload("vit"))
        points = []
        try:
            await client.wait_ready()
            for concurrency in self.settings.peer_concurrency:
                before = await model_statistics(address, "vit")
                result = await self._measure_quietly(client, concurrency, server_cpu, pids)
                result["server_side"] = server_side(before, await model_statistics(address, "vit"))
                points.append(_point(variant, server, concurrency, result))
                log(
                    f"{server} vit {METHOD} c={concurrency}: {result['throughput_rps']:.1f} "
                    f"img/s, p50 {result['latency_ms']['p50']} ms, p99 "
                    f"{result['latency_ms']['p99']} ms, errors {result['errors']}"
                )
        finally:
            await client.close()
        return points

    async def _measure_quietly(
        self,
        client: Client,
        concurrency: int,
        server_cpu: Callable[[], float | None],
        pids: Callable[[], list[int]],
    ) -> dict[str, Any]:
        """One point, measured again while other processes were busy (as the setups' points)."""
        limit = self.settings.max_foreign_share
        discarded: list[dict[str, Any]] = []
        for attempt in range(self.settings.noise_retries + 1):
            result = await measure(
                client,
                concurrency=concurrency,
                duration=self.settings.duration_s,
                warmup=self.settings.warmup_s,
                server_cpu=server_cpu,
            )
            share = result.get("foreign_cpu_share")
            if limit is None or share is None or share <= limit:
                break
            if attempt == self.settings.noise_retries:
                result["noisy"] = True
                break
            discarded.append(
                {"throughput_rps": result["throughput_rps"], "foreign_cpu_share": share}
            )
            log(f"kserve c={concurrency}: other processes used {share:.0%}; repeating")
            await asyncio.to_thread(wait_for_quiet, limit, pids())
        return {**result, "discarded": discarded}

    def _perf_runs(self, address: str, server: str, model: str) -> None:
        """perf_analyzer on ``model`` at each peer concurrency (recorded in the section)."""
        if self.perf is None or model not in ("vit", "translator"):
            return
        options: dict[str, Any] = {"window_ms": max(200, int(self.settings.duration_s * 500))}
        if model == "translator":
            tokens = str(self.settings.new_tokens)
            options.update(
                streaming=True,
                input_data=self._text_data(),
                parameters={"max_new_tokens": (tokens, "int"), "min_new_tokens": (tokens, "int")},
            )
        workload = self._loadgen_workload(model)
        for concurrency in self.settings.peer_concurrency:
            before = self._loadgen_rps(address, workload, concurrency)
            record = self.perf.run(address, model, concurrency, **options)
            after = self._loadgen_rps(address, workload, concurrency)
            record["loadgen_rps_around"] = [before, after]
            self.perf_section["runs"].append({"server": server, **record})
            figure = record.get("throughput_rps")
            log(f"perf_analyzer {server} {model} c={concurrency}: {figure} req/s, {record}")

    def _loadgen_workload(self, model: str) -> Workload:
        """The load generator's requests that perf_analyzer's runs on ``model`` are compared
        with: the ViT over KServe, the translator's stream of the benchmark's fixed length."""
        if model == "vit":
            image = rgb_image(self.png, self.repository / "vit")
            return Workload(METHOD, "vit", tensors=(("image", "UINT8", image),))
        return Workload(
            "translate_stream",
            model,
            text=self.settings.text,
            language=self.language,
            new_tokens=self.settings.new_tokens,
        )

    def _loadgen_rps(self, address: str, workload: Workload, concurrency: int) -> float:
        """The load generator's requests/s at ``concurrency``, one point right before or after a
        perf_analyzer run: a machine whose speed drifts during a run moves both alike."""

        async def point() -> float:
            client = Client(address, workload)
            try:
                await client.wait_ready()
                result = await measure(
                    client,
                    concurrency=concurrency,
                    duration=self.settings.duration_s,
                    warmup=self.settings.warmup_s,
                )
            finally:
                await client.close()
            return result["throughput_rps"]

        return round(asyncio.run(point()), 3)

    def _text_data(self) -> Path:
        """perf_analyzer's input data for the translator: the benchmark's text and language, and
        no target prefix (an empty one: perf_analyzer fills every declared input)."""
        path = self.scratch / "translator.json"
        item = {
            "text": [self.settings.text],
            "target_language": [self.language],
            "target_prefix": [""],
        }
        path.write_text(json.dumps({"data": [item]}))
        return path

    def sections(self) -> dict[str, Any]:
        """The result document's ``perf_analyzer`` and ``triton`` sections."""
        return {"perf_analyzer": self.perf_section, "triton": self.triton_section}


def _point(variant: str, server: str, concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "vit",
        "variant": variant,
        "server": server,
        "method": METHOD,
        "workload": "fixed",
        "loop": "closed",
        "concurrency": concurrency,
        "rate": None,
        **result,
    }


def _server(peer: TritonPeer) -> dict[str, Any]:
    """What the peer is: Triton's name and version (ServerMetadata) and its batching."""
    import grpc

    from serving.proto_gen.inference import grpc_service_pb2 as kpb
    from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

    with grpc.insecure_channel(peer.address) as channel:
        meta = kpb_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(
            kpb.ServerMetadataRequest(), timeout=30
        )
    spec = peer.spec
    return {
        "name": meta.name,
        "version": meta.version,
        "runs": "PyTriton python backend calling onnxruntime (CPU)",
        "max_batch_size": spec["max_batch_size"],
        "max_queue_delay_us": spec["delay_us"],
        "intra_op_threads": spec["threads"],
    }
