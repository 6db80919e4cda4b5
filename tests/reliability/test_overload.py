"""10x overload of a real server process: fast RESOURCE_EXHAUSTED for the excess, every admitted
request answered, nothing lost.

The server is ``attnserve serve`` (its own process) on a copy of the tiny repository whose
translator (in-flight engine) and ViT (dynamic batcher) have small limits; a grpc.aio client fires
bursts of ten times more concurrent requests than the model's capacity plus queue, all at once on
one connection, and measures per call, client side, the time from sending to the final status.
Every eighth call of a burst is a control: a request the servicer refuses at once as invalid
(INVALID_ARGUMENT), so it measures the transport's own floor in that very burst (grpc.aio takes
new calls in one at a time, so the k-th call of a burst waits for the k-1 before it to be read,
whatever the servicer does). Asserted:

- every request ends exactly once, OK or RESOURCE_EXHAUSTED (with a message), and the server's
  ``attnserve_requests_total`` counts the same numbers;
- rejections are fast: their p99 (and median) is within ``REJECT_BOUND_S`` (10 ms) of the control
  calls' p99 (median)
  (a full queue costs no more than a malformed request: the servicer refuses at once, it never
  waits for capacity); the absolute figures are reported: they are mostly the transport's floor,
  which grows with the burst and with whatever else holds the machine's cores. With separate
  frontend processes a control is refused in the frontend but a rejection comes from the engine
  process (it owns the queues), one IPC round trip to a process whose cores are busy decoding:
  ``IPC_HOP_S`` more is allowed there (a 2-core CI run measured 12 ms over the floor at p99);
- paced overload (then one call every 2 ms, 500/s, several times what the model serves, so no
  call waits behind a burst; controls mixed in as in the bursts): rejections arrive within the
  same bound of the paced controls at the median, p99 within ``PACED_P99_S`` of theirs (slack
  for a busy machine; the figures are reported). Absolute bounds (10 ms, 35 ms with two
  frontends) failed on a 2-core VM in a slow spell, with medians of 11.2 and 36.4 ms: the
  controls measure the floor under the same load;
- admitted requests all complete, their p99 under ``ADMITTED_P99_S`` (a liveness bound), and
  each burst admits at least a full queue;
- a request that could never fit (beam wider than the KV-cache capacity) is refused at once.

The figures go to ``overload_summary.json`` in pytest's base temp directory and are printed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from contract.images import encode_png
from models.data import digits
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.harness import ServeProcess, copy_repository, percentile, sample, scrape

REJECT_BOUND_S = 0.010  # the bound: a rejection arrives within 10 ms (over the floor)
IPC_HOP_S = 0.025  # multi-process: the engine process's answer, on cores busy decoding
ADMITTED_P99_S = 30.0  # liveness: admitted requests finish (generous: CI machines are slow)
BURSTS = 4
PACED_CALLS = 150  # then one call every PACED_GAP_S: several times what the model serves
PACED_GAP_S = 0.002
PACED_P99_S = 0.050  # over the paced controls' p99: slack for a scheduling hiccup
CONTROL_EVERY = 8  # every 8th call of a burst is an invalid request (the transport's floor)
TRANSLATOR = {"max_active_sequences": 2, "max_queue_size": 2, "max_batch_size": 2}
# The tiny ViT classifies faster than requests come in: batches wait up to 100 ms for batch-mates
# (Triton's max_queue_delay), so 3 waiting requests fill the queue.
VIT = {"max_batch_size": 4, "max_queue_size": 3, "max_queue_delay_us": 100_000}
SUMMARY: dict[str, Any] = {}
Call = Callable[[pb_grpc.AttnServeStub, int], Awaitable[Any]]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-frontends"])
def server(
    request: pytest.FixtureRequest,
    tiny_repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServeProcess]:
    root = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("overload") / "repository",
        translator={"batching": TRANSLATOR},
        vit={"batching": VIT},
    )
    frontends = ("--frontend-workers", str(request.param))
    with ServeProcess(root, "--metrics-port", "0", *frontends, grace=2) as process:
        yield process
    text = json.dumps(SUMMARY, indent=2)
    name = f"overload_summary-{request.param}-frontends.json"
    (tmp_path_factory.getbasetemp() / name).write_text(text)
    print(f"\noverload summary: {text}")


Outcome = tuple[str, str, float, str]  # kind (work | control), status, seconds, details


async def fire(address: str, calls: list[tuple[str, Call]], gap: float = 0.0) -> list[Outcome]:
    """``calls`` on one connection, all at once (``gap`` 0) or one every ``gap`` seconds: each
    one's kind, status and client-side latency."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        await stub.ListModels(pb.ListModelsRequest(), timeout=10)  # connected before the calls

        async def one(i: int) -> Outcome:
            kind, call = calls[i]
            started = time.perf_counter()
            try:
                await call(stub, i)
                return kind, "OK", time.perf_counter() - started, ""
            except grpc.aio.AioRpcError as err:
                return kind, err.code().name, time.perf_counter() - started, err.details() or ""

        tasks = []
        for i in range(len(calls)):
            tasks.append(asyncio.ensure_future(one(i)))
            if gap:
                await asyncio.sleep(gap)
        return list(await asyncio.gather(*tasks))


def burst_calls(n: int, work: Call, control: Call) -> list[tuple[str, Call]]:
    """``n`` work calls and, among them, every CONTROL_EVERY-th call a control."""
    calls: list[tuple[str, Call]] = []
    while sum(kind == "work" for kind, _ in calls) < n:
        calls.append(("control", control) if len(calls) % CONTROL_EVERY == 3 else ("work", work))
    return calls


def _ms(values: list[float]) -> dict[str, float]:
    return {
        q: round(percentile(values, p) * 1000, 2)
        for q, p in (("p50", 50), ("p99", 99), ("max", 100))
    }


def overload(
    server: ServeProcess, model: str, method: str, capacity: int, work: Call, control: Call
) -> dict[str, Any]:
    """Bursts of 10x ``capacity`` work calls (plus controls), then paced calls; checks and
    returns the figures."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    before = scrape(url)
    n = 10 * capacity  # the controls come on top
    outcomes: list[Outcome] = []
    for _ in range(BURSTS):
        outcomes += asyncio.run(fire(server.address, burst_calls(n, work, control)))
    paced_mix = [("paced" if kind == "work" else "paced-control", call)
                 for kind, call in burst_calls(PACED_CALLS, work, control)]  # fmt: skip
    paced = asyncio.run(fire(server.address, paced_mix, PACED_GAP_S))
    outcomes += paced
    works = [o for o in outcomes if o[0] == "work"]
    controls = [o for o in outcomes if o[0] == "control"]
    codes = Counter(code for _, code, _, _ in works)
    rejected = [o for o in works if o[1] == "RESOURCE_EXHAUSTED"]
    admitted = [o for o in works if o[1] == "OK"]
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert {code for _, code, _, _ in controls} == {"INVALID_ARGUMENT"}
    assert len(admitted) + len(rejected) == len(works) == BURSTS * n  # none lost
    assert rejected, f"no request was rejected: {codes}"
    assert all("max_queue_size" in details for *_, details in rejected), rejected[:3]
    paced_work = [o for o in paced if o[0] == "paced"]
    paced_controls = [o for o in paced if o[0] == "paced-control"]
    paced_codes = Counter(code for _, code, _, _ in paced_work)
    paced_rejected = [o[2] for o in paced_work if o[1] == "RESOURCE_EXHAUSTED"]
    assert set(paced_codes) <= {"OK", "RESOURCE_EXHAUSTED"}, paced_codes
    assert sum(paced_codes.values()) == PACED_CALLS and paced_rejected, paced_codes
    assert {code for _, code, _, _ in paced_controls} == {"INVALID_ARGUMENT"}
    after = scrape(url)
    invalid = Counter({"INVALID_ARGUMENT": len(controls) + len(paced_controls)})
    server_codes = codes + paced_codes + invalid
    for code, count in server_codes.items():
        labels = {"model": model, "method": method, "code": code}
        seen = sample(after, "attnserve_requests_total", **labels) - sample(
            before, "attnserve_requests_total", **labels
        )
        assert seen == count, (code, seen, count)  # the server saw exactly these outcomes
    reject_s = [o[2] for o in rejected]
    control_s = [o[2] for o in controls]
    paced_control_s = [o[2] for o in paced_controls]
    admitted_s = [o[2] for o in admitted]
    figures = {
        "capacity_plus_queue": capacity,
        "burst": n,
        "sent": len(works),
        "ok": len(admitted),
        "rejected": len(rejected),
        "reject_ms": _ms(reject_s),
        "control_ms": _ms(control_s),
        "admitted_ms": _ms(admitted_s),
        "paced": {
            "gap_ms": PACED_GAP_S * 1000,
            "sent": PACED_CALLS,
            "ok": paced_codes["OK"],
            "rejected": len(paced_rejected),
            "reject_ms": _ms(paced_rejected),
            "control_ms": _ms(paced_control_s),
        },
    }
    SUMMARY[model] = figures
    frontends = int(server.command[server.command.index("--frontend-workers") + 1])
    bound = REJECT_BOUND_S + (IPC_HOP_S if frontends > 1 else 0.0)
    assert percentile(reject_s, 99) <= percentile(control_s, 99) + bound, figures
    assert percentile(reject_s, 50) <= percentile(control_s, 50) + bound, figures
    assert percentile(paced_rejected, 50) <= percentile(paced_control_s, 50) + bound, figures
    assert percentile(paced_rejected, 99) <= percentile(paced_control_s, 99) + PACED_P99_S, figures
    assert percentile(admitted_s, 99) <= ADMITTED_P99_S, figures
    return figures


def test_translator_overload(server: ServeProcess) -> None:
    """In-flight engine: 2 decode rows + 2 waiting = 4; bursts of 40 translations (24 tokens)."""
    options = pb.DecodingOptions(max_new_tokens=24, min_new_tokens=24)

    async def translate(stub: pb_grpc.AttnServeStub, i: int) -> None:
        request = pb.TranslateRequest(texts=[f"{i} three"], target_language="de", options=options)
        reply = await stub.Translate(request, timeout=60)
        assert len(reply.translations[0].token_ids) == 24

    async def invalid(stub: pb_grpc.AttnServeStub, i: int) -> None:
        await stub.Translate(pb.TranslateRequest(texts=[""], target_language="de"), timeout=60)

    capacity = TRANSLATOR["max_active_sequences"] + TRANSLATOR["max_queue_size"]
    figures = overload(server, "translator", "Translate", capacity, translate, invalid)
    # Each burst fills the queue at least; whether the decode rows also fill during the burst
    # depends on the engine thread running while the burst arrives (a 2-core CI run once
    # admitted 15 of 4 x 4: one burst came in entirely before the engine took its first two).
    assert figures["ok"] >= BURSTS * TRANSLATOR["max_queue_size"]


def test_vit_overload(server: ServeProcess) -> None:
    """Dynamic batcher: a batch of 3 running + 3 waiting = 6; bursts of 60 classifications."""
    images = [encode_png(image) for image in digits.load_digits_split("test")[0][:16]]

    async def classify(stub: pb_grpc.AttnServeStub, i: int) -> None:
        reply = await stub.Classify(pb.ClassifyRequest(image=images[i % 16], top_k=3), timeout=60)
        assert len(reply.labels) == 3

    async def invalid(stub: pb_grpc.AttnServeStub, i: int) -> None:
        await stub.Classify(pb.ClassifyRequest(image=b""), timeout=60)

    capacity = 2 * VIT["max_queue_size"]  # one batch dispatched, the next one waiting
    figures = overload(server, "vit", "Classify", capacity, classify, invalid)
    assert figures["ok"] >= BURSTS * VIT["max_queue_size"]


def test_a_request_wider_than_the_cache_is_refused_at_once(server: ServeProcess) -> None:
    """Beam 4 needs 4 decode rows; the cache has 2: waiting would never end, so it is refused."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        started = time.perf_counter()
        with pytest.raises(grpc.RpcError) as error:
            stub.Translate(
                pb.TranslateRequest(
                    texts=["three"], target_language="de", options=pb.DecodingOptions(beam_size=4)
                ),
                timeout=20,
            )
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.value.details()
        assert "max_active_sequences" in error.value.details()
        assert time.perf_counter() - started < 5
        reply = stub.Translate(
            pb.TranslateRequest(
                texts=["three"], target_language="de", options=pb.DecodingOptions(beam_size=2)
            ),
            timeout=20,
        )
        assert reply.translations[0].token_ids
