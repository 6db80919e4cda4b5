"""Priority levels on a real server, one process and ``--frontend-workers 2``: a request of
priority 1 sent while the queue is deep is served before the queued requests of the default
level; sent without a priority it waits behind them. KServe's ``priority`` parameter (as
tritonclient sends it) for the ViT's dynamic batcher, the attnserve API's ``priority`` field for
the translator's in-flight admission; both levels read back from ModelConfig and GetModel."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from benchmarks.server_process import ServeProcess
from contract.model_config import QueuePolicy
from serving.kserve.tensors import input_tensor
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from tests.reliability.harness import copy_repository, sample, scrape, wait_until

TIMEOUT = 60
LOW_REQUESTS = 8  # each fills the queue with many items of the default level
LEVELS = {"priority_levels": 2, "default_priority_level": 2}
# level 1 of the ViT has a queue of its own (reported by ModelConfig as Triton reports it)
URGENT_QUEUE = (QueuePolicy(level=1, max_queue_size=64, timeout_ms=5000),)


@pytest.fixture(scope="module", params=["one process", "two frontends"])
def server(request: pytest.FixtureRequest, tiny_repository: Path, tmp_path_factory) -> Iterator:
    root = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("priority") / "repository",
        # one image or one sequence at a time, so requests queue
        vit={
            "batching": {
                **{"max_batch_size": 1, "max_queue_size": 1024, **LEVELS},
                "priority_queue_policy": URGENT_QUEUE,
            }
        },
        translator={
            "batching": {"max_batch_size": 1, "max_active_sequences": 1, **LEVELS},
        },
    )
    workers = ["--frontend-workers", "2"] if request.param == "two frontends" else []
    process = ServeProcess(root, "--metrics-port", "0", *workers).start()
    try:
        yield process
    finally:
        process.stop()


def queue_depth(server: ServeProcess, model: str) -> float:
    return sample(scrape(server.metrics_url), "attnserve_queue_depth", model=model)


def finishing_order(
    server: ServeProcess, model: str, low: Callable[[], None], high: Callable[[], None], deep: int
) -> int:
    """Start LOW_REQUESTS ``low`` calls; once ``deep`` items queue, one ``high`` call. How many
    of the low calls ended after the high one."""
    ended: dict[str, float] = {}
    lock = threading.Lock()

    def timed(name: str, call: Callable[[], None]) -> None:
        call()
        with lock:
            ended[name] = time.monotonic()

    with ThreadPoolExecutor(LOW_REQUESTS + 1) as pool:
        lows = [pool.submit(timed, f"low{i}", low) for i in range(LOW_REQUESTS)]
        assert wait_until(lambda: queue_depth(server, model) >= deep, timeout=30, interval=0.002)
        timed("high", high)
        for future in lows:
            future.result()
    return sum(ended[f"low{i}"] > ended["high"] for i in range(LOW_REQUESTS))


def infer_vit(stub: kpb_grpc.GRPCInferenceServiceStub, images: int, priority: int | None) -> None:
    request = kpb.ModelInferRequest(model_name="vit")
    pixels = np.random.default_rng(images).integers(0, 256, (images, 32, 32, 3), np.uint8)
    header, raw = input_tensor("image", "UINT8", pixels)
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    if priority is not None:
        request.parameters["priority"].uint64_param = priority  # as tritonclient sends it
    reply = stub.ModelInfer(request, timeout=TIMEOUT)
    assert reply.outputs[0].shape[0] == images


def check_order(later: int, urgent: bool) -> None:
    """Priority 1 went first: most low calls ended after it; the default level: behind them."""
    if urgent:
        assert later >= LOW_REQUESTS // 2
    else:
        assert later <= 1


@pytest.mark.parametrize(("priority", "urgent"), [(1, True), (0, False)])
def test_the_vit_serves_priority_1_before_the_queued_default_level(
    server: ServeProcess, priority: int, urgent: bool
) -> None:
    """(Priority 0 is the default level: behind every image queued before it.)"""
    with grpc.insecure_channel(server.address) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        later = finishing_order(
            server,
            "vit",
            lambda: infer_vit(stub, 32, None),
            lambda: infer_vit(stub, 1, priority),
            deep=64,
        )
    check_order(later, urgent)


def translate(stub: pb_grpc.AttnServeStub, texts: int, priority: int) -> None:
    options = pb.DecodingOptions(max_new_tokens=24, min_new_tokens=24)
    request = pb.TranslateRequest(
        texts=["three hundred and twelve"] * texts,
        target_language="de",
        options=options,
        priority=priority,
    )
    reply = stub.Translate(request, timeout=TIMEOUT)
    assert all(len(t.token_ids) == 24 for t in reply.translations)


@pytest.mark.parametrize(("priority", "urgent"), [(1, True), (2, False)])
def test_the_translator_admits_priority_1_first(
    server: ServeProcess, priority: int, urgent: bool
) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        later = finishing_order(
            server,
            "translator",
            lambda: translate(stub, 4, 0),
            lambda: translate(stub, 1, priority),
            deep=16,
        )
    check_order(later, urgent)


def test_the_levels_are_reported(server: ServeProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        kserve = kpb_grpc.GRPCInferenceServiceStub(channel)
        attnserve = pb_grpc.AttnServeStub(channel)
        for model in ("vit", "translator"):
            config = kserve.ModelConfig(kpb.ModelConfigRequest(name=model), timeout=TIMEOUT)
            batching = config.config.dynamic_batching
            assert (batching.priority_levels, batching.default_priority_level) == (2, 2)
            info = attnserve.GetModel(pb.GetModelRequest(name=model), timeout=TIMEOUT)
            assert (info.batching.priority_levels, info.batching.default_priority_level) == (2, 2)
            own = {
                level: (p.max_queue_size, p.default_timeout_microseconds)
                for level, p in batching.priority_queue_policy.items()
            }
            assert own == ({1: (64, 5_000_000)} if model == "vit" else {})
            listed = [
                (p.level, p.max_queue_size, p.timeout_ms)
                for p in info.batching.priority_queue_policy
            ]
            assert listed == ([(1, 64, 5000)] if model == "vit" else [])
        metadata = kserve.ServerMetadata(kpb.ServerMetadataRequest(), timeout=TIMEOUT)
        assert "schedule_policy" in metadata.extensions


def test_a_negative_priority_is_invalid(server: ServeProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        request = kpb.ModelInferRequest(model_name="vit")
        header, raw = input_tensor("image", "UINT8", np.zeros((1, 32, 32, 3), np.uint8))
        request.inputs.append(header)
        request.raw_input_contents.append(raw)
        request.parameters["priority"].int64_param = -1
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request, timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "priority" in (error.value.details() or "")
