"""Soak run: mixed traffic against a real server process for a while; errors and memory growth.

    python -m benchmarks.soak                                   # 10 min, shipped models
    python -m benchmarks.soak --repository REPO --duration 60 --warmup 20 --out soak.json

Starts ``attnserve serve`` on ``--repository`` (the shipped models exported into
``model_repository/`` on first use, as ``make run`` does) as a child process, then drives it
from ``--concurrency`` grpc.aio workers with a mix of Translate (1-3 texts), TranslateStream,
Caption, CaptionStream, Classify and KServe ModelInfer (ViT pixels and PNG bytes, translator
text; ViT pixels in system shared memory, each call creating, registering, unregistering and
removing its own region, where the server lists the extension) calls, and, on the server's
HTTP/REST port, KServe ``/infer`` on the ViT with binary data, Triton's ``/generate_stream`` on
the translator (server-sent events), OpenAI's streamed ``/v1/chat/completions`` on the
translator and its unary one on the captioner (a server started here serves the port;
``--address`` drives gRPC only), every one with a valid request (texts the translator refuses as
too long are left out of the mix first). Every ``--interval`` seconds it samples the resident
memory of the server process and every process under it (VmRSS from /proc, summed: with
``--frontend-workers N`` the supervisor, the engine process and the N frontends), and each
process's own RSS under its name (``comm``: ``attnserve``, ``attnserve-eng``, ``attnserve-fe0``,
...), so that growth can be traced to a process.

An error is any call that does not end OK, or a greedy answer that differs from the first
answer the same input got (every input repeats). RSS growth is measured after the warm-up: the
median of the samples in the last ``--window`` seconds of the warm-up against the median of
those in the run's last ``--window`` seconds. The JSON report (stdout, and ``--out``) holds the
calls and errors per kind, latency percentiles, throughput, RSS samples and growth, the server
tree's open file descriptors at the start and the end, and the shared memory regions left
registered at the end (none: any is an error). Exit code 0
when there were no errors and the growth is at most ``--max-growth`` (default 0.05).

``--reload-every S`` starts the server with ``--model-control-mode explicit`` and reloads every
served model in turn (KServe ``RepositoryModelLoad``) every S seconds while the traffic runs: a
reload must not fail a call or change an answer, nor grow memory (``reloads`` in the report; a
failed reload is an error of kind ``reload``; ``latency_ms.reload``: how long the reloads took;
``rss_after_reload_mb``: the server tree's RSS as each reload returned).

``--reload-by folder`` (with ``--reload-every S``) reloads through the repository folder
instead: the server runs with ``--model-control-mode poll`` on a linked copy of the repository,
and every S seconds one model's ``config.yaml`` is rewritten (its ``batching.timeout_ms`` 1 ms
up or down); a reload is done when ModelConfig shows the new value (``latency_ms.reload``: the
edit to the served change, the poll interval included; not within 60 s is an error of kind
``reload``).

``--trace-rate N`` starts the server tracing one request in N (``--trace-level TIMESTAMPS``, a
trace file in a temporary folder, appended as it goes): tracing must not grow memory either
(``traces`` in the report: how many the files held at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np

from benchmarks.machine import process_tree
from benchmarks.server_process import ServeProcess
from serving.kserve.tensors import decode_outputs, input_tensor
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from serving.trace_summary import read_traces

KINDS = (
    "translate",
    "translate_stream",
    "caption",
    "caption_stream",
    "classify",
    "kserve_vit",
    "kserve_translate",
    "kserve_vit_shm",
    "http_vit",
    "http_translate_stream",
    "openai_translate_stream",
    "openai_caption",
)
# translation is most of the traffic, as in the benchmarks
WEIGHTS = (3, 3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1)
SHM = Path("/dev/shm")


# --- the server process ---------------------------------------------------------------------------
def _process_rss(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.M)
    if match is None:
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status")
    return int(match.group(1)) * 1024


def tree_rss(pid: int) -> dict[int, tuple[str, int]]:
    """Process id -> (name, resident bytes) of a process and its descendants (the supervisor,
    engine process and frontends of ``--frontend-workers N``); processes that end meanwhile are
    left out, except ``pid`` itself, whose end is an error."""
    found = {}
    for member in process_tree(pid):
        try:
            found[member] = (Path(f"/proc/{member}/comm").read_text().strip(), _process_rss(member))
        except (OSError, RuntimeError):
            if member == pid:
                raise
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of a process and its descendants, summed (see ``tree_rss``)."""
    return sum(rss for _, rss in tree_rss(pid).values())


# --- the traffic ----------------------------------------------------------------------------------
@dataclass
class Inputs:
    """Valid requests' ingredients, made once."""

    texts: list[tuple[str, str]]  # (source, language)
    scenes: list[bytes]  # PNG scenes for the captioner
    digits: list[bytes]  # PNG digits for the classifier
    pixels: np.ndarray  # normalised digits (N, 3, 32, 32) for KServe

    @classmethod
    def make(cls, count: int = 64) -> Inputs:
        from contract.images import encode_png, pixel_values
        from models.data import digits, shapes
        from models.data.translation import generate_pairs

        pairs = generate_pairs(count, seed=11, split="test")
        images, _ = digits.load_digits_split("test")
        return cls(
            texts=[(p.source, p.lang) for p in pairs],
            scenes=[
                encode_png(image) for image, _ in shapes.generate(count, seed=11, split="test")
            ],
            digits=[encode_png(image) for image in images[:count]],
            pixels=pixel_values(images[:count]).astype(np.float32),
        )


@dataclass
class Tally:
    """What the workers saw."""

    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    answers: dict[Any, Any] = field(default_factory=dict)
    rss_after_reload: list[int] = field(default_factory=list)  # bytes, the server tree's

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{kind}: {message[:300]}")

    def answer(self, kind: str, key: Any, value: Any) -> None:
        """The first answer for an input (whichever API gave it) is the reference; a different
        later one is an error: greedy decoding must give the same answer alone or batched."""
        first = self.answers.setdefault(key, value)
        if first != value:
            self.error(kind, f"{key}: answer {value!r} differs from the first {first!r}")


class Traffic:
    """One connection's stubs and the calls of the mix."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        inputs: Inputs,
        tally: Tally,
        http: aiohttp.ClientSession | None = None,
        http_url: str = "",
    ) -> None:
        self.stub = pb_grpc.AttnServeStub(channel)
        self.kserve = kpb_grpc.GRPCInferenceServiceStub(channel)
        self.inputs = inputs
        self.tally = tally
        self.http = http  # KServe v2 over HTTP/REST at http_url (None: not served)
        self.http_url = http_url

    async def translate(self, i: int) -> None:
        picked = [self.inputs.texts[(i + k) % len(self.inputs.texts)] for k in range(1 + i % 3)]
        language = picked[0][1]
        request = pb.TranslateRequest(texts=[s for s, _ in picked], target_language=language)
        reply = await self.stub.Translate(request, timeout=60)
        if len(reply.translations) != len(picked):
            raise ValueError(f"{len(reply.translations)} translations for {len(picked)} texts")
        for (source, _), translation in zip(picked, reply.translations, strict=True):
            self.tally.answer("translate", ("text", source, language), translation.text)

    async def translate_stream(self, i: int) -> None:
        source, language = self.inputs.texts[i % len(self.inputs.texts)]
        request = pb.TranslateStreamRequest(text=source, target_language=language)
        text = "".join([m.delta async for m in self.stub.TranslateStream(request, timeout=60)])
        self.tally.answer("translate_stream", ("text", source, language), text)

    async def caption(self, i: int) -> None:
        index = i % len(self.inputs.scenes)
        reply = await self.stub.Caption(
            pb.CaptionRequest(image=self.inputs.scenes[index]), timeout=60
        )
        self.tally.answer("caption", ("scene", index), reply.text)

    async def caption_stream(self, i: int) -> None:
        index = i % len(self.inputs.scenes)
        call = self.stub.CaptionStream(
            pb.CaptionRequest(image=self.inputs.scenes[index]), timeout=60
        )
        self.tally.answer(
            "caption_stream", ("scene", index), "".join([m.delta async for m in call])
        )

    async def classify(self, i: int) -> None:
        index = i % len(self.inputs.digits)
        reply = await self.stub.Classify(
            pb.ClassifyRequest(image=self.inputs.digits[index], top_k=3), timeout=60
        )
        self.tally.answer("classify", ("digit", index), reply.labels[0].label)

    async def kserve_vit(self, i: int) -> None:
        index = i % len(self.inputs.pixels)
        request = kpb.ModelInferRequest(model_name="vit", id=str(i))
        if i % 2:
            tensor, raw = input_tensor(
                "pixel_values", "FP32", self.inputs.pixels[index : index + 1]
            )
        else:
            tensor, raw = input_tensor("image", "BYTES", [self.inputs.digits[index]])
        request.inputs.append(tensor)
        request.raw_input_contents.append(raw)
        outputs = decode_outputs(await self.kserve.ModelInfer(request, timeout=60))
        self.tally.answer("kserve_vit", ("digit", index), outputs["label"][0].decode())

    async def kserve_vit_shm(self, i: int) -> None:
        """The pixels from a region of a new shared memory object, the probabilities into it at
        offset 16384, the label in the message; the region unregistered, the object removed."""
        index = i % len(self.inputs.pixels)
        pixels = self.inputs.pixels[index : index + 1]
        key, name = f"attnserve-soak-{os.getpid()}-{i}", f"soak-{i}"
        (SHM / key).write_bytes(pixels.tobytes().ljust(16384 + 1024, b"\0"))
        try:
            await self.kserve.SystemSharedMemoryRegister(
                kpb.SystemSharedMemoryRegisterRequest(name=name, key="/" + key, byte_size=17408),
                timeout=60,
            )
            request = kpb.ModelInferRequest(model_name="vit", id=str(i))
            tensor, _ = input_tensor("pixel_values", "FP32", pixels)
            _in_region(tensor.parameters, name, pixels.nbytes, 0)
            request.inputs.append(tensor)
            _in_region(request.outputs.add(name="probabilities").parameters, name, 1024, 16384)
            request.outputs.add(name="label")
            try:
                reply = await self.kserve.ModelInfer(request, timeout=60)
                size = reply.outputs[0].parameters["shared_memory_byte_size"].int64_param
                written = (SHM / key).read_bytes()[16384 : 16384 + size]
            finally:
                await self.kserve.SystemSharedMemoryUnregister(
                    kpb.SystemSharedMemoryUnregisterRequest(name=name), timeout=60
                )
        finally:
            (SHM / key).unlink(missing_ok=True)
        probabilities = np.frombuffer(written, dtype=np.float32)
        if reply.raw_output_contents[0] or abs(float(probabilities.sum()) - 1) > 1e-3:
            raise ValueError(f"probabilities in shared memory: {probabilities}")
        label = reply.raw_output_contents[1][4:].decode()  # one length-prefixed BYTES element
        self.tally.answer("kserve_vit_shm", ("digit", index), label)

    async def kserve_translate(self, i: int) -> None:
        source, language = self.inputs.texts[i % len(self.inputs.texts)]
        request = kpb.ModelInferRequest(model_name="translator", id=str(i))
        tensor, raw = input_tensor("text", "BYTES", [source.encode()])
        request.inputs.append(tensor)
        request.raw_input_contents.append(raw)
        request.parameters["target_language"].string_param = language
        outputs = decode_outputs(await self.kserve.ModelInfer(request, timeout=60))
        text = outputs["translation"][0].decode()
        self.tally.answer("kserve_translate", ("text", source, language), text)

    async def http_vit(self, i: int) -> None:
        """KServe ``/infer`` over HTTP/REST with binary data: a PNG (BYTES) or normalised
        pixels (FP32); the label back as JSON."""
        assert self.http is not None
        index = i % len(self.inputs.pixels)
        values: Any = self.inputs.pixels[index : index + 1]
        name, datatype = "pixel_values", "FP32"
        if i % 2 == 0:
            name, datatype, values = "image", "BYTES", [self.inputs.digits[index]]
        tensor, raw = input_tensor(name, datatype, values)
        assert raw is not None  # raw contents by default
        header = json.dumps(
            {
                "id": str(i),
                "inputs": [
                    {
                        "name": name,
                        "datatype": datatype,
                        "shape": list(tensor.shape),
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "outputs": [{"name": "label"}],
            }
        ).encode()
        url = f"{self.http_url}/v2/models/vit/infer"
        headers = {"Inference-Header-Content-Length": str(len(header))}
        async with self.http.post(url, data=header + raw, headers=headers) as answer:
            body = await answer.read()
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}: {body[:300]!r}")
        (label,) = json.loads(body)["outputs"][0]["data"]
        self.tally.answer("http_vit", ("digit", index), label)

    async def http_translate_stream(self, i: int) -> None:
        """Triton's ``/generate_stream`` over HTTP/REST: server-sent events, the text deltas
        joined, the last event final."""
        assert self.http is not None
        source, language = self.inputs.texts[i % len(self.inputs.texts)]
        body = {"text": source, "target_language": language}
        route = "/v2/models/translator/generate_stream"
        events = [json.loads(e) for e in await self._post(route, body, stream=True)]
        if not events or "error" in events[-1] or not events[-1]["parameters"]["final"]:
            raise ValueError(f"stream did not end with a final event: {events[-1:]}")
        text = "".join(event["translation"] for event in events)
        self.tally.answer("http_translate_stream", ("text", source, language), text)

    async def openai_translate_stream(self, i: int) -> None:
        """OpenAI's ``/v1/chat/completions`` streamed (greedy): the content deltas joined,
        ``[DONE]`` last."""
        assert self.http is not None
        source, language = self.inputs.texts[i % len(self.inputs.texts)]
        body = {
            "model": "translator",
            "messages": [{"role": "user", "content": source}],
            "temperature": 0,
            "stream": True,
            "target_language": language,
        }
        events = await self._post("/v1/chat/completions", body, stream=True)
        if events[-1] != "[DONE]" or json.loads(events[-2])["choices"][0]["finish_reason"] is None:
            raise ValueError(f"stream did not end with a finish reason and [DONE]: {events[-2:]}")
        chunks = [json.loads(event)["choices"][0]["delta"] for event in events[:-1]]
        text = "".join(delta.get("content") or "" for delta in chunks)
        self.tally.answer("openai_translate_stream", ("text", source, language), text)

    async def openai_caption(self, i: int) -> None:
        """OpenAI's ``/v1/chat/completions`` (greedy) on the captioner: a PNG as a data URL."""
        index = i % len(self.inputs.scenes)
        url = "data:image/png;base64," + base64.b64encode(self.inputs.scenes[index]).decode()
        part = {"type": "image_url", "image_url": {"url": url}}
        body = {
            "model": "captioner",
            "messages": [{"role": "user", "content": [part]}],
            "temperature": 0,
        }
        (answer,) = await self._post("/v1/chat/completions", body)
        text = json.loads(answer)["choices"][0]["message"]["content"]
        self.tally.answer("openai_caption", ("scene", index), text)

    async def _post(self, route: str, body: dict[str, Any], stream: bool = False) -> list[str]:
        """A JSON POST to the HTTP/REST port: the answer's body, or (``stream``) its
        server-sent events' ``data:``."""
        assert self.http is not None
        async with self.http.post(f"{self.http_url}{route}", json=body) as answer:
            text = (await answer.read()).decode()
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}: {text[:300]!r}")
        if not stream:
            return [text]
        return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]


def _in_region(parameters: Any, region: str, byte_size: int, offset: int) -> None:
    parameters["shared_memory_region"].string_param = region
    parameters["shared_memory_byte_size"].int64_param = byte_size
    parameters["shared_memory_offset"].int64_param = offset


async def usable_texts(address: str, inputs: Inputs) -> Inputs:
    """``inputs`` without the texts the served translator refuses as too long (the tiny test
    models' tokenizer makes many of them too long); any other refusal is a real error."""
    keep = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        for source, language in inputs.texts:
            request = pb.TranslateRequest(texts=[source], target_language=language)
            try:
                await stub.Translate(request, timeout=60)
                keep.append((source, language))
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
    if not keep:
        raise RuntimeError("the translator refuses every text of the mix as too long")
    return dataclasses.replace(inputs, texts=keep)


async def drive(
    address: str,
    inputs: Inputs,
    tally: Tally,
    concurrency: int,
    stop_at: float,
    seed: int = 0,
    kinds: tuple[str, ...] = KINDS,
    reload_every: float = 0.0,
    pid: int | None = None,
    folder: Path | None = None,
    http_url: str = "",
) -> None:
    """``concurrency`` workers calling the mix (``kinds``) until ``stop_at`` (monotonic s); with
    ``reload_every``, the served models reloaded in turn that often meanwhile (by RPC, or through
    the polled repository ``folder``; and the server tree's RSS after each, where ``pid`` is
    given); the ``http_*`` and ``openai_*`` kinds go to ``http_url`` (the HTTP/REST port)."""
    rng = np.random.default_rng(seed)
    weights = np.asarray([WEIGHTS[KINDS.index(kind)] for kind in kinds], dtype=float)
    probabilities = weights / weights.sum()
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        grpc.aio.insecure_channel(address) as channel,
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        traffic = Traffic(channel, inputs, tally, http, http_url)
        calls: dict[str, Callable[[int], Awaitable[None]]] = {k: getattr(traffic, k) for k in kinds}
        counter = iter(range(1 << 62))

        async def worker() -> None:
            while time.monotonic() < stop_at:
                kind = str(rng.choice(kinds, p=probabilities))
                i = next(counter)
                started = time.perf_counter()
                try:
                    await calls[kind](i)
                except grpc.aio.AioRpcError as err:
                    tally.error(kind, f"{err.code().name}: {err.details()}")
                except Exception as err:  # a malformed answer is an error too
                    tally.error(kind, f"{type(err).__name__}: {err}")
                tally.calls[kind] += 1
                tally.latency[kind].append(time.perf_counter() - started)

        reloads = (
            [reload_models(channel, tally, reload_every, stop_at, pid, folder)]
            if reload_every
            else []
        )
        await asyncio.gather(*(worker() for _ in range(concurrency)), *reloads)


async def reload_models(
    channel: grpc.aio.Channel,
    tally: Tally,
    every: float,
    stop_at: float,
    pid: int | None,
    folder: Path | None = None,
) -> None:
    """Reload the served models in turn every ``every`` seconds until ``stop_at`` (KServe
    ``RepositoryModelLoad``, or an edit of the entry in the polled repository ``folder``); the
    RSS of ``pid``'s tree after each reload goes into ``tally.rss_after_reload``."""
    stub = kpb_grpc.GRPCInferenceServiceStub(channel)
    index = await stub.RepositoryIndex(kpb.RepositoryIndexRequest(ready=True), timeout=60)
    names = [model.name for model in index.models]
    turn = 0
    due = time.monotonic() + every  # a reload starts every ``every`` s, however long one takes
    while due < stop_at:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        due += every
        name = names[turn % len(names)]
        started = time.perf_counter()
        try:
            if folder is None:
                await stub.RepositoryModelLoad(kpb.RepositoryModelLoadRequest(model_name=name))
            else:
                await edit_and_wait(stub, folder / name, odd=turn // len(names) % 2 == 0)
        except grpc.aio.AioRpcError as err:
            tally.error("reload", f"{name}: {err.code().name}: {err.details()}")
        except TimeoutError as err:
            tally.error("reload", f"{name}: {err}")
        tally.calls["reload"] += 1
        tally.latency["reload"].append(time.perf_counter() - started)
        if pid is not None:
            tally.rss_after_reload.append(rss_bytes(pid))
        turn += 1


async def edit_and_wait(
    stub: kpb_grpc.GRPCInferenceServiceStub, entry: Path, odd: bool, limit: float = 60.0
) -> None:
    """Rewrite ``entry``'s config.yaml with ``batching.timeout_ms`` at its start value rounded
    down to even (+ 1 ms when ``odd``: the first round), then wait until the server's
    ModelConfig shows it (TimeoutError after ``limit`` seconds). A model without a default
    deadline (0) gets 30 s."""
    from benchmarks.repository_copy import rewrite_config
    from contract.repository import read_model_config

    config = read_model_config(entry)
    base = (config.batching.timeout_ms or 30_000) // 2 * 2
    wanted = base + int(odd)
    rewrite_config(entry, batching={"timeout_ms": wanted})
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        reply = await stub.ModelConfig(kpb.ModelConfigRequest(name=entry.name), timeout=60)
        policy = reply.config.dynamic_batching.default_queue_policy
        if policy.default_timeout_microseconds == wanted * 1000:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the server did not load the edited config.yaml within {limit:g} s")


# --- the run --------------------------------------------------------------------------------------
def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def _median_between(samples: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [rss for t, rss in samples if start <= t <= end]
    if not inside:  # fall back to the nearest sample
        inside = [min(samples, key=lambda s: abs(s[0] - end))[1]]
    return float(statistics.median(inside))


@dataclass
class ProcessSamples:
    """One server process's name and its (seconds, RSS bytes) samples."""

    name: str
    samples: list[tuple[float, int]] = field(default_factory=list)


class RssSampler:
    """A thread sampling a process's resident memory every ``interval`` seconds until stopped.

    ``samples``: (seconds since ``started``, RSS bytes of the whole tree); ``by_process``: per
    process id, its name and its own samples.
    """

    def __init__(self, pid: int, interval: float, started: float) -> None:
        self.pid = pid
        self.interval = interval
        self.started = started
        self.samples: list[tuple[float, int]] = []
        self.by_process: dict[int, ProcessSamples] = {}
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._finished.is_set():
            now = time.monotonic() - self.started
            tree = tree_rss(self.pid)
            self.samples.append((now, sum(rss for _, rss in tree.values())))
            for member, (name, rss) in tree.items():
                self.by_process.setdefault(member, ProcessSamples(name)).samples.append((now, rss))
            self._finished.wait(self.interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._finished.set()
        self._thread.join(timeout=10)


@dataclass
class SoakRun:
    """How a finished soak ran (what its report states besides the tally and the samples)."""

    repository: str | None  # None when driving a server started elsewhere
    address: str
    elapsed: float
    warmup: float
    window: float
    concurrency: int
    processes: int
    max_growth: float
    distinct_texts: int
    exit_code: int | None


def soak(
    repository: Path,
    duration: float,
    warmup: float,
    concurrency: int = 8,
    interval: float = 1.0,
    window: float | None = None,
    max_growth: float = 0.05,
    address: str | None = None,
    pid: int | None = None,
    frontend_workers: int = 1,
    reload_every: float = 0.0,
    trace_rate: int = 0,
    reload_by: str = "rpc",
) -> dict[str, Any]:
    """Run the soak; the report (see the module docstring).

    Args:
        repository: the model repository the server process serves (unless ``address``).
        duration: seconds of traffic in all, warm-up included.
        warmup: seconds before the memory baseline.
        concurrency: concurrent workers.
        interval: seconds between RSS samples.
        window: seconds of samples whose median is a baseline / end figure (default: 10% of
            the time after the warm-up, at least 3 samples' worth).
        max_growth: the largest RSS growth that passes.
        address, pid: drive an already running server instead (its process id for RSS).
        frontend_workers: the server's ``--frontend-workers`` (RSS sums all its processes).
        reload_every: seconds between two model reloads (0: none; the server runs with model
            control on).
        trace_rate: the server traces one request in this many (0: no tracing).
        reload_by: "rpc" (model control explicit, RepositoryModelLoad) or "folder" (model
            control poll on a linked copy of the repository, its config.yaml files edited).
    """
    if warmup >= duration:
        raise ValueError(f"warmup ({warmup} s) must be shorter than duration ({duration} s)")
    window = window or max(3 * interval, 0.1 * (duration - warmup))
    inputs = Inputs.make()
    server = None
    http_url = ""  # the server's HTTP/REST port (a server started here serves one)
    traces_folder = Path(tempfile.mkdtemp(prefix="attnserve-soak-traces-"))
    polled = None
    if reload_every and reload_by == "folder" and address is None:
        from benchmarks.repository_copy import linked_copy

        polled = linked_copy(repository, traces_folder / "repository")
    if address is None:
        flags: tuple[str, ...] = ("--metrics-port", "-1")
        flags += ("--frontend-workers", str(frontend_workers))
        flags += ("--system-shared-memory",) * SHM.is_dir()
        if polled is not None:
            poll_s = f"{min(0.5, reload_every / 4):g}"
            flags += ("--model-control-mode", "poll", "--repository-poll-secs", poll_s)
        elif reload_every:
            flags += ("--model-control-mode", "explicit")
        if trace_rate:
            flags += ("--trace-file", str(traces_folder / "trace.json"))
            flags += ("--trace-level", "TIMESTAMPS", "--trace-rate", str(trace_rate))
        flags += ("--http-port", "0")
        server = ServeProcess(polled or repository, *flags, keep_lines=200).start()
        address, pid = f"127.0.0.1:{server.port}", server.pid
        http_url = f"http://127.0.0.1:{server.http_port}"
    assert pid is not None
    inputs = asyncio.run(usable_texts(address, inputs))
    shm = SHM.is_dir() and asyncio.run(_serves_shared_memory(address))
    kinds = tuple(
        kind
        for kind in KINDS
        if (shm or kind != "kserve_vit_shm")
        and (http_url or not kind.startswith(("http_", "openai_")))
    )
    processes = len(process_tree(pid))
    fds = {"start": open_fds(pid)}
    tally = Tally()
    started = time.monotonic()
    sampler = RssSampler(pid, interval, started).start()
    exit_code = None
    try:
        asyncio.run(
            drive(
                address,
                inputs,
                tally,
                concurrency,
                started + duration,
                kinds=kinds,
                reload_every=reload_every,
                pid=pid,
                folder=polled,
                http_url=http_url,
            )
        )
        fds["end"] = open_fds(pid)
        if shm and (left := asyncio.run(_regions_left(address))):
            tally.error("kserve_vit_shm", f"{left} shared memory regions left registered")
    finally:
        sampler.stop()
        if server is not None:
            exit_code = server.stop()
    run = SoakRun(
        repository=str(repository) if server is not None else None,
        address=address,
        elapsed=time.monotonic() - started,
        warmup=warmup,
        window=window,
        concurrency=concurrency,
        processes=processes,
        max_growth=max_growth,
        distinct_texts=len(inputs.texts),
        exit_code=exit_code,
    )
    reloads = {
        "reload_every_s": reload_every,
        "reload_by": reload_by if reload_every else None,
        "reloads": tally.calls.pop("reload", 0),
        # the tree's RSS once each reload has returned (its old version stopped and released)
        "rss_after_reload_mb": [round(rss / 2**20, 1) for rss in tally.rss_after_reload],
    }
    report = soak_report(run, tally, sampler.samples, sampler.by_process)
    traces = len(read_traces(sorted(traces_folder.glob("trace.json*"))))
    shutil.rmtree(traces_folder, ignore_errors=True)
    tracing = {"trace_rate": trace_rate, "traces": traces}
    return {**report, "open_fds": fds, "kinds": list(kinds), **reloads, **tracing}


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid`` and every process under it (a leak shows as growth)."""
    count = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):  # a process gone meanwhile
            count += len(os.listdir(f"/proc/{member}/fd"))
    return count


async def _serves_shared_memory(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        meta = await kpb_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(
            kpb.ServerMetadataRequest(), timeout=60
        )
    return "system_shared_memory" in meta.extensions


async def _regions_left(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        status = await kpb_grpc.GRPCInferenceServiceStub(channel).SystemSharedMemoryStatus(
            kpb.SystemSharedMemoryStatusRequest(), timeout=60
        )
    return len(status.regions)


def soak_report(
    run: SoakRun,
    tally: Tally,
    samples: list[tuple[float, int]],
    by_process: dict[int, ProcessSamples] | None = None,
) -> dict[str, Any]:
    """The JSON report: calls, errors, latency, RSS figures and growth (of the whole tree, and
    per process when ``by_process`` is given), pass / fail."""
    elapsed = run.elapsed
    baseline, end, growth = _growth(samples, run)
    errors = sum(tally.errors.values())
    calls = sum(tally.calls.values())
    step = max(1, len(samples) // 120)
    return {
        "repository": run.repository,
        "address": run.address,
        "duration_s": round(elapsed, 1),
        "warmup_s": run.warmup,
        "window_s": round(run.window, 1),
        "concurrency": run.concurrency,
        "server_processes": run.processes,
        "distinct_texts": run.distinct_texts,
        "calls": calls,
        "calls_per_s": round(calls / elapsed, 1),
        "calls_by_kind": dict(tally.calls),
        "errors": errors,
        "errors_by_kind": dict(tally.errors),
        "error_samples": tally.error_samples,
        "latency_ms": _latency_ms(tally),
        "rss_mb": {
            "start": round(samples[0][1] / 2**20, 1),
            "after_warmup": round(baseline / 2**20, 1),
            "end": round(end / 2**20, 1),
            "max": round(max(rss for _, rss in samples) / 2**20, 1),
        },
        "rss_growth_after_warmup": round(growth, 4),
        "max_growth": run.max_growth,
        "rss_samples_mb": [(round(t, 1), round(rss / 2**20, 1)) for t, rss in samples[::step]],
        "rss_by_process": [
            _process_figures(member, process, run) for member, process in (by_process or {}).items()
        ],
        "server_exit_code": run.exit_code,
        "passed": errors == 0 and growth <= run.max_growth,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _growth(samples: list[tuple[float, int]], run: SoakRun) -> tuple[float, float, float]:
    """(after the warm-up, at the end, growth) of RSS samples: medians over ``run.window``."""
    baseline = _median_between(samples, run.warmup - run.window, run.warmup)
    end = _median_between(samples, run.elapsed - run.window, run.elapsed)
    return baseline, end, (end - baseline) / baseline


def _process_figures(pid: int, process: ProcessSamples, run: SoakRun) -> dict[str, Any]:
    """One process's RSS after the warm-up and at the end (MB) and its growth."""
    baseline, end, growth = _growth(process.samples, run)
    return {
        "pid": pid,
        "name": process.name,
        "after_warmup_mb": round(baseline / 2**20, 1),
        "end_mb": round(end / 2**20, 1),
        "growth_mb": round((end - baseline) / 2**20, 1),
        "growth": round(growth, 4),
    }


def _latency_ms(tally: Tally) -> dict[str, dict[str, float]]:
    return {
        kind: {
            "p50": round(_percentile(values, 50) * 1000, 2),
            "p99": round(_percentile(values, 99) * 1000, 2),
        }
        for kind, values in sorted(tally.latency.items())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds (default 120)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--window", type=float, default=None, help="seconds of samples per figure")
    parser.add_argument("--max-growth", type=float, default=0.05)
    parser.add_argument("--address", help="drive a running server instead (with --pid)")
    parser.add_argument("--pid", type=int, help="the running server's process id (RSS)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    parser.add_argument(
        "--frontend-workers", type=int, default=1, help="the server's gRPC frontend processes"
    )
    parser.add_argument(
        "--reload-every",
        type=float,
        default=0.0,
        help="reload the served models in turn this often (s; model control on; default 0: no)",
    )
    parser.add_argument(
        "--reload-by",
        choices=("rpc", "folder"),
        default="rpc",
        help="with --reload-every: RepositoryModelLoad (default), or edits of the entries in a "
        "linked copy of the repository that the server polls (--model-control-mode poll)",
    )
    parser.add_argument(
        "--trace-rate",
        type=int,
        default=0,
        help="the server traces one request in N (default 0: no tracing)",
    )
    args = parser.parse_args(argv)
    if args.address is None and args.repository == Path("model_repository"):
        from serving.cli import ensure_shipped_repository

        ensure_shipped_repository(args.repository)  # first run: export the shipped models
    if args.address is not None and args.pid is None:
        parser.error("--address needs --pid (the server process whose memory to sample)")
    report = soak(
        args.repository,
        args.duration,
        args.warmup,
        concurrency=args.concurrency,
        interval=args.interval,
        window=args.window,
        max_growth=args.max_growth,
        address=args.address,
        pid=args.pid,
        frontend_workers=args.frontend_workers,
        reload_every=args.reload_every,
        trace_rate=args.trace_rate,
        reload_by=args.reload_by,
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
