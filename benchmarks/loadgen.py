"""A gRPC load generator for the attnserve API and the KServe v2 / Triton protocol (grpc.aio, one
event loop; one channel, or ``connections`` channels with a TCP connection each, used in turn, so
that a server with several frontend processes on one port gets connections to spread).

Two ways to apply load:

- closed loop: ``concurrency`` clients, each sending its next request as soon as the previous one
  answered, for ``duration`` seconds (then the requests in flight finish and count);
- open loop: requests arrive as a Poisson process at ``rate`` per second for ``duration`` seconds,
  whether or not earlier ones have answered; latency counts from the scheduled arrival, so a
  client that falls behind does not hide queueing (no coordinated omission).

The ``kserve_infer`` method sends one KServe ``ModelInfer`` request (its tensors built once), so
the same load drives attnserve and a Triton server alike. Every request yields a ``Record``:
latency, time to first token (streams: the first message with tokens, as the client sees it;
unary: the server's ``timing.time_to_first_token_ms``), time per output token, tokens, the gRPC
status and the server's own timing. ``summarise`` turns records
into a load point: throughput, errors and p50 / p90 / p99 latency, TTFT and TPOT.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from serving.kserve.tensors import input_tensor
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

if TYPE_CHECKING:
    from benchmarks.loadgen_processes import ClientProcesses

METHODS = ("translate", "translate_stream", "classify", "kserve_infer")
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


@dataclass
class Record:
    """One request as the client saw it (times in seconds, perf_counter clock)."""

    start: float  # closed loop: sent; open loop: scheduled arrival
    end: float
    code: str  # gRPC status name, "OK" on success
    tokens: int = 0  # generated tokens (0 for classification)
    ttft: float | None = None
    server_total_ms: float | None = None
    server_queue_ms: float | None = None
    server_ttft_ms: float | None = None
    messages: int = 0  # streamed responses received (0 for unary calls)

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (None with fewer than 2 tokens)."""
        if self.ttft is None or self.tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.tokens - 1)


@dataclass(frozen=True)
class Workload:
    """What each request of a load point sends."""

    method: str  # translate | translate_stream | classify
    model: str
    text: str = ""
    language: str = ""
    image: bytes = b""
    new_tokens: int = 0  # min = max new tokens (EOS suppressed until then); 0 = model default
    timeout_s: float = 120.0
    tensors: tuple[tuple[str, str, Any], ...] = ()  # kserve_infer: (name, datatype, values)
    version: str = ""  # kserve_infer: the model version asked for ("": the newest served)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")


def _options(new_tokens: int) -> pb.DecodingOptions:
    if not new_tokens:
        return pb.DecodingOptions()
    return pb.DecodingOptions(max_new_tokens=new_tokens, min_new_tokens=new_tokens, beam_size=1)


def kserve_request(
    model: str, tensors: tuple[tuple[str, str, Any], ...], version: str = ""
) -> kpb.ModelInferRequest:
    """A KServe ModelInfer request of (name, datatype, values) inputs in raw contents."""
    request = kpb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, values in tensors:
        tensor, raw = input_tensor(name, datatype, values)
        request.inputs.append(tensor)
        request.raw_input_contents.append(raw or b"")
    return request


class Client:
    """Issues requests of one workload on ``connections`` grpc.aio channels (each its own TCP
    connection; calls take them in turn); ``call`` returns a Record."""

    def __init__(self, address: str, workload: Workload, connections: int = 1) -> None:
        if connections < 1:
            raise ValueError(f"connections must be >= 1, got {connections}")
        self.address = address
        self.workload = workload
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [
            grpc.aio.insecure_channel(address, options=options) for _ in range(connections)
        ]
        self._stubs = [pb_grpc.AttnServeStub(channel) for channel in self.channels]
        self._kserve = [kpb_grpc.GRPCInferenceServiceStub(channel) for channel in self.channels]
        self._turn = 0
        w = workload
        if w.method == "translate":
            self.request: Any = pb.TranslateRequest(
                texts=[w.text],
                target_language=w.language,
                model=w.model,
                options=_options(w.new_tokens),
            )
        elif w.method == "translate_stream":
            self.request = pb.TranslateStreamRequest(
                text=w.text,
                target_language=w.language,
                model=w.model,
                options=_options(w.new_tokens),
            )
        elif w.method == "kserve_infer":
            self.request = kserve_request(w.model, w.tensors, w.version)
        else:
            self.request = pb.ClassifyRequest(image=w.image, top_k=1, model=w.model)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels))

    async def wait_ready(self, timeout: float = 30.0) -> None:
        ready = (channel.channel_ready() for channel in self.channels)
        await asyncio.wait_for(asyncio.gather(*ready), timeout)

    def _next(self) -> int:
        """The channel of the next call (round robin)."""
        self._turn = (self._turn + 1) % len(self.channels)
        return self._turn

    async def call(self, start: float | None = None) -> Record:
        """Send one request; ``start`` is the scheduled time (open loop), else now."""
        start = time.perf_counter() if start is None else start
        method = self.workload.method
        timeout = self.workload.timeout_s
        turn = self._next()
        stub = self._stubs[turn]
        try:
            if method == "translate_stream":
                return await self._stream(stub, start, timeout)
            if method == "translate":
                response = await stub.Translate(self.request, timeout=timeout)
                end = time.perf_counter()
                timing = response.timing
                tokens = response.usage.output_tokens
                server_ttft = timing.time_to_first_token_ms or None
                ttft = None
                if server_ttft is not None:  # client-side estimate: the server's TTFT share
                    ttft = server_ttft / 1000.0
                return Record(
                    start,
                    end,
                    "OK",
                    tokens,
                    ttft,
                    timing.total_time_ms,
                    timing.queue_time_ms,
                    server_ttft,
                )
            if method == "kserve_infer":
                await self._kserve[turn].ModelInfer(self.request, timeout=timeout)
            else:
                await stub.Classify(self.request, timeout=timeout)
            return Record(start, time.perf_counter(), "OK")
        except grpc.aio.AioRpcError as err:
            return Record(start, time.perf_counter(), err.code().name)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a client-side failure counts as an error of this request
            return Record(start, time.perf_counter(), f"CLIENT_{type(err).__name__}")

    async def _stream(self, stub: pb_grpc.AttnServeStub, start: float, timeout: float) -> Record:
        first: float | None = None
        tokens = 0
        total_ms = queue_ms = server_ttft = None
        messages = 0
        async for message in stub.TranslateStream(self.request, timeout=timeout):
            messages += 1
            if message.token_ids:
                if first is None:
                    first = time.perf_counter()
                tokens += len(message.token_ids)
            if message.finish_reason:
                total_ms = message.timing.total_time_ms
                queue_ms = message.timing.queue_time_ms
                server_ttft = message.timing.time_to_first_token_ms
        end = time.perf_counter()
        return Record(
            start,
            end,
            "OK",
            tokens,
            None if first is None else first - start,
            total_ms,
            queue_ms,
            server_ttft,
            messages,
        )


async def closed_loop(
    client: Client, concurrency: int, duration: float
) -> tuple[list[Record], float]:
    """``concurrency`` clients back to back for ``duration`` s; returns (records, window start)."""
    records: list[Record] = []
    begin = time.perf_counter()
    stop_at = begin + duration

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            records.append(await client.call())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, begin


async def open_loop(
    client: Client, rate: float, duration: float, seed: int = 0
) -> tuple[list[Record], float]:
    """Poisson arrivals at ``rate`` per s for ``duration`` s; returns (records, window start)."""
    rng = np.random.default_rng(seed)
    begin = time.perf_counter()
    arrival = begin
    tasks: list[asyncio.Task[Record]] = []
    while True:
        arrival += float(rng.exponential(1.0 / rate))
        if arrival > begin + duration:
            break
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(client.call(start=arrival)))
    records = list(await asyncio.gather(*tasks)) if tasks else []
    return records, begin


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    array = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(array.mean()), 3),
        "max": round(float(array.max()), 3),
    }


def summarise(records: list[Record], begin: float) -> dict[str, Any]:
    """Throughput, errors and latency / TTFT / TPOT percentiles (ms) of one load point."""
    ok = [r for r in records if r.code == "OK"]
    end = max((r.end for r in records), default=begin)
    span = max(end - begin, 1e-9)
    tokens = sum(r.tokens for r in ok)
    messages = sum(r.messages for r in ok)
    server_total = [r.server_total_ms / 1000 for r in ok if r.server_total_ms]
    return {
        "requests": len(ok),
        "errors": len(records) - len(ok),
        "error_codes": dict(Counter(r.code for r in records if r.code != "OK")),
        "duration_s": round(span, 3),
        "throughput_rps": round(len(ok) / span, 3),
        "tokens_per_s": round(tokens / span, 2) if tokens else None,
        "tokens_per_request": round(tokens / len(ok), 2) if ok and tokens else None,
        # streams: responses per request (a message per decode step, fewer when tokens share one)
        "messages_per_request": round(messages / len(ok), 2) if ok and messages else None,
        "latency_ms": _percentiles([r.latency for r in ok]),
        "ttft_ms": _percentiles([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _percentiles([r.tpot for r in ok if r.tpot is not None]),
        "server_total_ms": _percentiles(server_total),
    }


def process_cpu_seconds(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) of this process, or of ``pid`` from /proc (Linux)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every process (Linux)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                yield int(entry.name), handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue


def session_cpu_seconds(session: int) -> float:
    """CPU seconds (user + system) of the live processes of a session (Linux /proc)."""
    ticks = sum(int(f[11]) + int(f[12]) for _, f in proc_stats() if int(f[3]) == session)
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


async def measure(
    client: Client,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    duration: float,
    warmup: float = 0.0,
    server_pid: int | None = None,
    seed: int = 0,
    server_cpu: Callable[[], float | None] | None = None,
    processes: ClientProcesses | None = None,
) -> dict[str, Any]:
    """One load point (closed loop when ``concurrency`` is given, else open loop at ``rate``).

    A closed-loop warm-up of ``warmup`` seconds at the same concurrency runs first (its records
    are dropped). The result adds the client's and server's CPU seconds over the measured phase
    (the server's: of ``server_pid``, or what ``server_cpu`` returns for a server of several
    processes). With ``processes`` the clients run there, ``client``'s address, workload and
    connections each (``client_processes`` in the result; ``client_cpu_s`` sums them).
    """
    if server_cpu is None and server_pid:
        server_cpu = functools.partial(process_cpu_seconds, server_pid)
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
    if warmup > 0 and processes is None:
        await closed_loop(client, concurrency or max(1, math.ceil(rate or 1)), warmup)
    client_cpu = process_cpu_seconds()
    server_before = server_cpu() if server_cpu else None
    busy = machine_busy_seconds()
    wall = time.perf_counter()
    children_cpu = 0.0
    used_processes = 1
    if processes is not None:
        spread = await processes.run(
            client.address,
            client.workload,
            len(client.channels),
            concurrency=concurrency,
            rate=rate,
            duration=duration,
            warmup=warmup,
            seed=seed,
        )
        records, begin = spread.records, spread.begin
        children_cpu, used_processes = spread.cpu_seconds, len(spread.pids)
    elif concurrency is not None:
        records, begin = await closed_loop(client, concurrency, duration)
    else:
        assert rate is not None
        records, begin = await open_loop(client, rate, duration, seed)
    point = summarise(records, begin)
    wall = time.perf_counter() - wall
    busy_after = machine_busy_seconds()
    own_cpu = (process_cpu_seconds() or 0) - (client_cpu or 0)
    point["client_cpu_s"] = round(own_cpu + children_cpu, 3)
    point["client_processes"] = used_processes
    if server_cpu is not None and server_before is not None:
        after = server_cpu()
        point["server_cpu_s"] = round(after - server_before, 3) if after is not None else None
    point["foreign_cpu_share"] = None
    if busy is not None and busy_after is not None and wall > 0:
        own = point["client_cpu_s"] + (point.get("server_cpu_s") or 0.0)
        foreign = max(0.0, busy_after - busy - own)
        point["foreign_cpu_share"] = round(foreign / (wall * (os.cpu_count() or 1)), 3)
    return point


def run(coroutine_factory: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine on a fresh event loop (the CLI's synchronous entry)."""
    return asyncio.run(coroutine_factory())  # type: ignore[arg-type]
