"""What the OpenAI-compatible routes cost against the attnserve gRPC API: one server, both ports.

    python -m benchmarks.openai_api [--repository DIR] [--rounds 3] [--duration 4]
        [--unary 1,8] [--streams 32] [--new-tokens 16] [--warmup 0.5] [--out DIR]

One ``attnserve serve --http-port 0`` on the repository serves the translator; closed-loop
clients in this process (asyncio) send the same greedy translation of one short text into
German, exactly ``--new-tokens`` tokens each (``min`` = ``max`` new tokens), by three clients:

- ``grpc``: the attnserve API (``Translate``; ``TranslateStream`` for streams) through grpc.aio
  (``benchmarks.loadgen``, as ``bench serve`` uses it);
- ``openai``: ``POST /v1/completions`` through aiohttp (the JSON body written once; streams parse
  the server-sent events), the lightest HTTP client for the routes;
- ``openai-sdk``: the official ``openai`` package's ``AsyncOpenAI`` (httpx), what users run.

Each round runs every load point (unary at each ``--unary`` concurrency, and ``--streams``
concurrent streams) for every client, the client order rotating from round to round (this VM's
speed drifts). Writes requests/s, tokens/s, latency and time to first token percentiles of every
run with the client's and the server's CPU time per request (on a machine of few cores the
Python clients' CPU competes with the server's: the server's CPU per request is the routes' own
cost), and per round the ``openai`` / ``grpc`` and ``openai-sdk`` / ``grpc`` ratios, to
``benchmarks/results/openai-api/openai-api-*.json`` and a PNG of the ratios beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.loadgen import (
    Client,
    Record,
    Workload,
    closed_loop,
    process_cpu_seconds,
    summarise,
)
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.served_pairs import repository_of
from benchmarks.server_process import ServeProcess

CLIENTS = ("grpc", "openai", "openai-sdk")
TEXT = "three hundred and forty-seven"
LANGUAGE = "de"
MODEL = "translator"


def completion_body(new_tokens: int, stream: bool) -> dict[str, Any]:
    """The OpenAI request every call sends (greedy; exactly ``new_tokens`` tokens)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": TEXT,
        "temperature": 0,
        "max_tokens": new_tokens,
        "min_tokens": new_tokens,
        "target_language": LANGUAGE,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


class HttpClient:
    """``/v1/completions`` through aiohttp: ``call`` returns a Record as loadgen's Client does."""

    def __init__(self, base_url: str, new_tokens: int, stream: bool, concurrency: int) -> None:
        import aiohttp

        self.url = f"{base_url}/v1/completions"
        self.body = json.dumps(completion_body(new_tokens, stream)).encode()
        self.stream = stream
        connector = aiohttp.TCPConnector(limit=concurrency)
        self.session = aiohttp.ClientSession(
            connector=connector, headers={"Content-Type": "application/json"}
        )

    async def close(self) -> None:
        await self.session.close()

    async def call(self, start: float | None = None) -> Record:
        start = time.perf_counter() if start is None else start
        try:
            async with self.session.post(self.url, data=self.body) as answer:
                if answer.status != 200:
                    await answer.read()
                    return Record(start, time.perf_counter(), f"HTTP_{answer.status}")
                if not self.stream:
                    document = await answer.json()
                    tokens = document["usage"]["completion_tokens"]
                    return Record(start, time.perf_counter(), "OK", tokens)
                first, tokens, messages = None, 0, 0
                async for line in answer.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    elif chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
                        messages += 1
                        first = first or time.perf_counter()
                ttft = None if first is None else first - start
                return Record(start, time.perf_counter(), "OK", tokens, ttft, messages=messages)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a client-side failure counts as an error of this request
            return Record(start, time.perf_counter(), f"CLIENT_{type(err).__name__}")


class SdkClient:
    """The official ``openai`` client (``AsyncOpenAI``, no retries)."""

    def __init__(self, base_url: str, new_tokens: int, stream: bool, concurrency: int) -> None:
        import openai

        # its default connection pool (up to 100 kept alive) holds every concurrent call
        self.client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        body = completion_body(new_tokens, stream)
        standard = ("model", "prompt", "temperature", "max_tokens", "stream", "stream_options")
        self.arguments = {key: body[key] for key in standard if key in body}
        self.arguments["extra_body"] = {k: v for k, v in body.items() if k not in standard}
        self.stream = stream

    async def close(self) -> None:
        await self.client.close()

    async def call(self, start: float | None = None) -> Record:
        import openai

        start = time.perf_counter() if start is None else start
        try:
            answer = await self.client.completions.create(**self.arguments)
            if not self.stream:
                tokens = answer.usage.completion_tokens if answer.usage else 0
                return Record(start, time.perf_counter(), "OK", tokens)
            first, tokens, messages = None, 0, 0
            async for chunk in answer:
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
                elif chunk.choices and chunk.choices[0].finish_reason is None:
                    messages += 1
                    first = first or time.perf_counter()
            ttft = None if first is None else first - start
            return Record(start, time.perf_counter(), "OK", tokens, ttft, messages=messages)
        except openai.APIStatusError as err:
            return Record(start, time.perf_counter(), f"HTTP_{err.status_code}")
        except asyncio.CancelledError:
            raise
        except Exception as err:
            return Record(start, time.perf_counter(), f"CLIENT_{type(err).__name__}")


def make_client(
    kind: str, server: ServeProcess, new_tokens: int, stream: bool, concurrency: int
) -> Any:
    if kind == "grpc":
        method = "translate_stream" if stream else "translate"
        workload = Workload(method, MODEL, TEXT, LANGUAGE, new_tokens=new_tokens)
        return Client(server.address, workload)
    base = f"http://127.0.0.1:{server.http_port}"
    cls = HttpClient if kind == "openai" else SdkClient
    return cls(base, new_tokens, stream, concurrency)


async def load_point(
    kind: str, server: ServeProcess, stream: bool, concurrency: int, settings: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop run: a short warm-up, then ``settings.duration`` seconds measured."""
    client = make_client(kind, server, settings.new_tokens, stream, concurrency)
    try:
        await closed_loop(client, concurrency, settings.warmup)  # connections up, paths warm
        client_cpu, server_cpu = process_cpu_seconds() or 0.0, server.cpu_seconds() or 0.0
        records, begin = await closed_loop(client, concurrency, settings.duration)
        client_cpu = (process_cpu_seconds() or 0.0) - client_cpu
        server_cpu = (server.cpu_seconds() or 0.0) - server_cpu
    finally:
        await client.close()
    point = summarise(records, begin)
    requests = max(point["requests"], 1)
    # on a machine of few cores the clients' CPU competes with the server's: the server's CPU
    # time per request is the protocol's own cost
    point["client_cpu_ms_per_request"] = round(client_cpu * 1000 / requests, 3)
    point["server_cpu_ms_per_request"] = round(server_cpu * 1000 / requests, 3)
    return point


def measure(server: ServeProcess, settings: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (round, load point, client) run."""
    points = [(False, c) for c in settings.unary] + [(True, c) for c in settings.streams]
    runs = []
    for round_ in range(settings.rounds):
        shift = round_ % len(CLIENTS)
        order = CLIENTS[shift:] + CLIENTS[:shift]
        for stream, concurrency in points:
            for kind in order:
                what = f"{concurrency} {'streams' if stream else 'unary'}"
                log(f"round {round_}: {what} over {kind}")
                point = asyncio.run(load_point(kind, server, stream, concurrency, settings))
                runs.append(
                    {
                        "round": round_,
                        "client": kind,
                        "stream": stream,
                        "concurrency": concurrency,
                        **point,
                    }
                )
    return runs


def _value(run: dict[str, Any], stream: bool) -> float | None:
    return run["tokens_per_s"] if stream else run["throughput_rps"]


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load point, each OpenAI client against gRPC in the same round: throughput
    (requests/s; tokens/s for streams) and p50 latency."""
    rows = []
    keys = sorted({(r["stream"], r["concurrency"]) for r in runs})
    for stream, concurrency in keys:
        for kind in CLIENTS[1:]:
            throughput, latency, cpu = [], [], []
            for round_ in sorted({r["round"] for r in runs}):
                pair = {
                    r["client"]: r
                    for r in runs
                    if (r["round"], r["stream"], r["concurrency"]) == (round_, stream, concurrency)
                }
                base, other = pair.get("grpc"), pair.get(kind)
                if not base or not other:
                    continue
                mine, theirs = _value(other, stream), _value(base, stream)
                if not mine or not theirs:
                    continue
                throughput.append(round(mine / theirs, 3))
                latency.append(round(other["latency_ms"]["p50"] / base["latency_ms"]["p50"], 3))
                cpu.append(
                    round(other["server_cpu_ms_per_request"] / base["server_cpu_ms_per_request"], 3)
                )
            rows.append(
                {
                    "stream": stream,
                    "concurrency": concurrency,
                    "client": kind,
                    "throughput_vs_grpc": throughput,
                    "throughput_vs_grpc_median": round(statistics.median(throughput), 3)
                    if throughput
                    else None,
                    "p50_latency_vs_grpc": latency,
                    "server_cpu_per_request_vs_grpc": cpu,
                }
            )
    return rows


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """The per-round throughput ratios against gRPC, one group per load point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    labels = sorted(
        {(row["stream"], row["concurrency"]) for row in summary}, key=lambda k: (k[0], k[1])
    )
    for offset, kind in enumerate(CLIENTS[1:]):
        for x, key in enumerate(labels):
            row = next(
                r for r in summary if (r["stream"], r["concurrency"]) == key and r["client"] == kind
            )
            values = row["throughput_vs_grpc"]
            axis.scatter(
                [x + offset * 0.25] * len(values),
                values,
                color=f"C{offset}",
                label=kind if x == 0 else None,
            )
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(
        [x + 0.125 for x in range(len(labels))],
        [f"{c} {'streams' if s else 'unary'}" for s, c in labels],
    )
    axis.set_ylabel("throughput / gRPC (same round)")
    axis.set_title("OpenAI routes against the attnserve gRPC API (translator)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    def counts(text: str) -> tuple[int, ...]:
        return tuple(int(n) for n in text.split(",") if n)

    parser = argparse.ArgumentParser(prog="python -m benchmarks.openai_api")
    parser.add_argument("--repository", type=Path, help="default: the shipped models, exported")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "openai-api")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--unary", type=counts, default=(1, 8))
    parser.add_argument("--streams", type=counts, default=(32,))
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each run")
    args = parser.parse_args(argv)
    args.repository = repository_of(args)
    server = ServeProcess(
        args.repository,
        *("--host", "127.0.0.1", "--metrics-port", "-1", "--log-level", "WARNING"),
        *("--http-port", "0"),
        grace=2,
    ).start()
    try:
        runs = measure(server, args)
    finally:
        server.stop()
    summary = ratios(runs)
    path = write_probe(
        "openai-api",
        runs,
        args.out,
        False,
        args.duration,
        new_tokens=args.new_tokens,
        text=TEXT,
        ratios=summary,
    )
    plot(summary, path.with_suffix(".png"))
    for row in summary:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
