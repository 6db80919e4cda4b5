"""1,000 streams cancelled or expiring at random points leave no decode work and no cache behind.

A real server (grpc.aio on loopback, tiny ONNX models) gets 1,000 TranslateStream and
CaptionStream calls from a grpc.aio client, ``CONCURRENCY`` at a time. Each one, at random: is
cancelled by the client before its first token (sometimes before it even reaches the server),
is cancelled mid-stream after a random number of tokens, runs into a short deadline somewhere in
the middle, or runs to the end (control). Afterwards:

- every call ended CANCELLED, DEADLINE_EXCEEDED or OK (never UNKNOWN / INTERNAL), and the server's
  request counter saw no other code and counts the cut streams as CANCELLED / DEADLINE_EXCEEDED,
  not OK;
- the engines' active sequences, KV-cache rows and tokens and queues are back to 0, on the server
  objects and in the /metrics gauges (active sequences, KV-cache tokens and use, queue depth);
- no decode work continues: the engines' step counters and the decoder-step batch histogram stop
  moving;
- a good request still gets the answer computed before the storm.

It runs twice: against a server in this process (the engines' own objects are checked too) and
against ``attnserve serve --frontend-workers 2`` (two frontend processes and an engine process;
the client spreads its calls over four connections; the /metrics gauges and counters, which add
up every process, are checked).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from contract.images import encode_png
from models.data import shapes
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.harness import ServeProcess, sample, scrape, wait_until
from tests.serving.server_thread import ServerThread

STREAMS = 1000
CAPTION_SHARE = 0.2
CONCURRENCY = 48
MODES = {"before_first_token": 0.3, "mid_stream": 0.35, "deadline": 0.25, "complete": 0.1}
LONG = pb.DecodingOptions(max_new_tokens=32, min_new_tokens=32)  # streams long enough to cut
CAPTION_LONG = pb.DecodingOptions(max_new_tokens=24, min_new_tokens=24)  # its limit
GENERATORS = ("translator", "captioner")
GAUGES = (
    "attnserve_active_sequences",
    "attnserve_kv_cache_tokens",
    "attnserve_kv_cache_usage_ratio",
    "attnserve_queue_depth",
)
CONNECTIONS = 4  # the storm's channels (with frontend processes: connections to spread)
Server = ServerThread | ServeProcess


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-frontends"])
def server(tiny_repository: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == 1:
        with ServerThread(tiny_repository) as running:
            yield running
        return
    flags = ("--metrics-port", "0", "--frontend-workers", str(request.param))
    with ServeProcess(tiny_repository, *flags, grace=2) as process:
        yield process


def engine(server: Server, name: str) -> Any:
    assert isinstance(server, ServerThread) and server.running is not None
    return server.running.repository.get(name).engine


def decoder_steps(server: Server) -> dict[str, int] | float:
    """The engines' step counters (one process), else the decoder-step batch count of /metrics."""
    if isinstance(server, ServerThread):
        return {name: engine(server, name).steps for name in GENERATORS}
    return sample(scrape(server.metrics_url), "attnserve_batch_size_count", stage="decoder_step")


def good_tokens(address: str) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        request = pb.TranslateStreamRequest(
            text="three hundred", target_language="fr", options=LONG
        )
        return [t for m in stub.TranslateStream(request, timeout=30) for t in m.token_ids]


async def one_stream(stub: pb_grpc.AttnServeStub, rng: np.random.Generator, image: bytes) -> str:
    """One stream, cut at a random point; the status it ended with."""
    mode = rng.choice(list(MODES), p=list(MODES.values()))
    timeout = float(rng.uniform(0.005, 0.15)) if mode == "deadline" else 30.0
    if rng.random() < CAPTION_SHARE:
        call = stub.CaptionStream(
            pb.CaptionRequest(image=image, options=CAPTION_LONG), timeout=timeout
        )
    else:
        request = pb.TranslateStreamRequest(
            text=f"{int(rng.integers(1000))} three", target_language="de", options=LONG
        )
        call = stub.TranslateStream(request, timeout=timeout)
    try:
        if mode == "before_first_token":
            await asyncio.sleep(float(rng.uniform(0, 0.004)))
            call.cancel()
        elif mode == "mid_stream":
            wanted, seen = int(rng.integers(1, 9)), 0  # early: the server has tokens to go
            async for message in call:
                seen += len(message.token_ids)
                if seen >= wanted:
                    call.cancel()
                    break
        else:
            async for _ in call:
                pass
        code = await call.code()
    except grpc.aio.AioRpcError as err:
        code = err.code()
    except asyncio.CancelledError:  # reading a call the client cancelled
        code = grpc.StatusCode.CANCELLED
    return f"{mode}:{code.name}"


async def storm(address: str, image: bytes) -> Counter[str]:
    rng = np.random.default_rng(2024)
    outcomes: Counter[str] = Counter()
    options = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(CONNECTIONS)]
    pending = iter(range(STREAMS))

    async def worker(stub: pb_grpc.AttnServeStub) -> None:
        for _ in pending:
            outcomes[await one_stream(stub, rng, image)] += 1

    try:
        stubs = [pb_grpc.AttnServeStub(channel) for channel in channels]
        await asyncio.gather(*(worker(stubs[i % CONNECTIONS]) for i in range(CONCURRENCY)))
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return outcomes


def idle(server: Server) -> bool:
    if isinstance(server, ServeProcess):
        families = scrape(server.metrics_url)
        return all(
            sample(families, gauge, model=name) == 0 for gauge in GAUGES for name in GENERATORS
        )
    return all(
        not engine(server, name).sequences
        and engine(server, name).active_rows == 0
        and engine(server, name).cache.tokens == 0
        and len(engine(server, name).queue) == 0
        for name in GENERATORS
    )


def test_cancelled_and_expired_streams_free_everything(
    server: Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = good_tokens(server.address)
    assert len(reference) == 32
    image = encode_png(shapes.generate(1, seed=3, split="test")[0][0])
    before = scrape(server.metrics_url)
    started = time.monotonic()
    outcomes = asyncio.run(storm(server.address, image))
    seconds = time.monotonic() - started

    assert sum(outcomes.values()) == STREAMS
    codes = Counter(key.split(":")[1] for key in outcomes.elements())
    assert set(codes) <= {"CANCELLED", "DEADLINE_EXCEEDED", "OK"}, outcomes
    assert outcomes["mid_stream:CANCELLED"] > 0 and outcomes["deadline:DEADLINE_EXCEEDED"] > 0
    assert all(code == "OK" for key, code in (k.split(":") for k in outcomes) if key == "complete")

    # Everything is freed, on the engines (one process) and in the gauges.
    assert wait_until(lambda: idle(server), timeout=10), scrape(server.metrics_url)
    families = scrape(server.metrics_url)
    for name in GENERATORS:
        for gauge in GAUGES:
            assert sample(families, gauge, model=name) == 0, (gauge, name)
    server_codes = {
        s.labels["code"]
        for s in families.get("attnserve_requests", [])
        if s.name == "attnserve_requests_total" and s.labels["method"].endswith("Stream")
    }
    assert server_codes <= {"CANCELLED", "DEADLINE_EXCEEDED", "OK"}, server_codes
    streamed = sum(
        sample(families, "attnserve_requests_total", method=method, code=code)
        - sample(before, "attnserve_requests_total", method=method, code=code)
        for method in ("TranslateStream", "CaptionStream")
        for code in ("CANCELLED", "DEADLINE_EXCEEDED", "OK")
    )
    assert streamed <= STREAMS  # calls cancelled before reaching the server are not counted
    counted = {
        code: sum(
            sample(families, "attnserve_requests_total", method=method, code=code)
            - sample(before, "attnserve_requests_total", method=method, code=code)
            for method in ("TranslateStream", "CaptionStream")
        )
        for code in ("CANCELLED", "DEADLINE_EXCEEDED", "OK")
    }
    # A stream cut short is counted as such, not as OK. Some race: the server had sent every
    # message and ended OK while the client, reading behind, gave up (38% of the cut streams in
    # one clean-clone CI run, two frontends on 2 busy cores, when streams were cut as late as
    # their 23rd token; they are now cut by the 8th), hence the 50% margins. A server that
    # counted every cut stream OK fails both. Calls cut before reaching the handler are not
    # counted at all.
    client_ok = outcomes["complete:OK"] + outcomes["deadline:OK"]
    cut = outcomes["mid_stream:CANCELLED"]  # every one of these reached the handler
    assert counted["OK"] <= client_ok + 0.5 * cut, (counted, outcomes)
    assert counted["CANCELLED"] + counted["DEADLINE_EXCEEDED"] >= 0.5 * cut, (counted, outcomes)

    # No decode work continues for them.
    steps = decoder_steps(server)
    histogram = sample(families, "attnserve_batch_size_count", stage="decoder_step")
    time.sleep(0.5)
    assert decoder_steps(server) == steps
    later = scrape(server.metrics_url)
    assert sample(later, "attnserve_batch_size_count", stage="decoder_step") == histogram

    assert good_tokens(server.address) == reference
    summary = {
        "streams": STREAMS,
        "seconds": round(seconds, 1),
        "outcomes": dict(outcomes),
        "server_counted": counted,
        "final_active_sequences": {
            n: sample(later, "attnserve_active_sequences", model=n) for n in GENERATORS
        },
        "final_kv_cache_tokens": {
            n: sample(later, "attnserve_kv_cache_tokens", model=n) for n in GENERATORS
        },
        "decoder_steps": steps,
        "server_processes": "one" if isinstance(server, ServerThread) else "two frontends",
    }
    text = json.dumps(summary, indent=2)
    suffix = "" if isinstance(server, ServerThread) else "-two-frontends"
    (tmp_path_factory.getbasetemp() / f"cancellation_summary{suffix}.json").write_text(text)
    print(f"\ncancellation summary: {text}")
