"""``batching.instances``: several in-flight engines of one model behind one gRPC server.

A real server on loopback serves the tiny translator twice: with one engine and with two
instances. The instances answer token for token what one engine answers, share the load,
free their rows, and the model's gauges are summed over them.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from contract.repository import read_model_config
from serving.engine.gauges import GaugeBoard
from serving.engine.pool import EnginePool
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.harness import copy_repository, sample, scrape, wait_until
from tests.serving.server_thread import ServerThread

TEXTS = [f"{n} three hundred and {n}" for n in range(24)]
OPTIONS = pb.DecodingOptions(max_new_tokens=12)
LIMITS = {"max_active_sequences": 4, "max_batch_size": 4}


@pytest.fixture(scope="module")
def servers(
    tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerThread, ServerThread]]:
    one = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("one") / "repository",
        translator={"batching": LIMITS},
    )
    two = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("two") / "repository",
        translator={"batching": {**LIMITS, "instances": 2}},
        vit={"batching": {"instances": 2}},
    )
    with ServerThread(one) as first, ServerThread(two) as second:
        yield first, second


def translate_all(server: ServerThread) -> list[list[int]]:
    """Every text of TEXTS at once (one call each), token ids in TEXTS' order."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)

        def one(text: str) -> list[int]:
            request = pb.TranslateRequest(texts=[text], target_language="de", options=OPTIONS)
            return list(stub.Translate(request, timeout=60).translations[0].token_ids)

        with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
            return list(pool.map(one, TEXTS))


def pool_of(server: ServerThread) -> EnginePool:
    assert server.running is not None
    engine = server.running.repository.get("translator").engine
    assert isinstance(engine, EnginePool)
    return engine


def test_two_instances_answer_what_one_engine_answers(
    servers: tuple[ServerThread, ServerThread],
) -> None:
    one, two = servers
    assert translate_all(two) == translate_all(one)
    pool = pool_of(two)
    assert len(pool.engines) == 2
    assert all(engine.steps > 0 for engine in pool.engines)  # both took a share of the load
    assert wait_until(lambda: pool.active_rows == 0, timeout=10)
    assert all(engine.waiting_rows == 0 and not engine.sequences for engine in pool.engines)


def test_instances_divide_the_cores_and_keep_their_limits(
    servers: tuple[ServerThread, ServerThread],
) -> None:
    pool = pool_of(servers[1])
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    for engine in pool.engines:
        options = engine.runner.backend.session("encoder").get_session_options()
        assert options.intra_op_num_threads == threads
    # One-thread instances share their sessions (one copy of the weights); wider ones do not.
    first, second = (engine.runner.backend for engine in pool.engines)
    assert (first is second) == (threads == 1)
    assert pool.engines[0].cache is not pool.engines[1].cache  # each its own KV cache
    assert pool.max_rows == LIMITS["max_active_sequences"]  # a request runs in one instance
    with grpc.insecure_channel(servers[1].address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        with pytest.raises(grpc.RpcError) as error:  # 5 beams never fit one instance's 4 rows
            stub.Translate(
                pb.TranslateRequest(
                    texts=["three"], target_language="de", options=pb.DecodingOptions(beam_size=5)
                ),
                timeout=20,
            )
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def slowed(run: Any) -> Any:
    def slow(*args: Any) -> Any:
        time.sleep(0.02)
        return run(*args)

    return slow


def test_the_model_gauges_add_up_over_the_instances(
    servers: tuple[ServerThread, ServerThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = servers[1]
    pool = pool_of(server)
    # 20 ms per decode step: the streams stay in flight a while. Every way the engine runs a
    # step is slowed: with 4 or more rows an instance takes the greedy pass, not ``step``.
    for engine in pool.engines:
        for name in ("step", "step_greedy", "start_greedy", "step_block"):
            if hasattr(engine.cache, name):
                monkeypatch.setattr(engine.cache, name, slowed(getattr(engine.cache, name)))
    long = pb.DecodingOptions(max_new_tokens=32, min_new_tokens=32)
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        streams = [
            stub.TranslateStream(
                pb.TranslateStreamRequest(text=text, target_language="de", options=long),
                timeout=60,
            )
            for text in TEXTS[:6]
        ]
        firsts = [next(stream) for stream in streams]  # all six are decoding now
        assert all(first.token_ids for first in firsts)
        families = scrape(server.metrics_url)
        active = sample(families, "attnserve_active_sequences", model="translator")
        assert active == sum(len(engine.sequences) for engine in pool.engines) == 6
        assert all(engine.sequences for engine in pool.engines)  # spread, not piled on one
        for stream in streams:
            stream.cancel()
    assert wait_until(lambda: pool.active_rows == 0, timeout=10)  # cancellation freed the rows
    assert wait_until(
        lambda: (
            sample(scrape(server.metrics_url), "attnserve_active_sequences", model="translator")
            == 0
        ),
        timeout=10,
    )


def test_gauge_board_sums_and_averages_the_usage() -> None:
    board = GaugeBoard(2)
    assert board.update(0, "active_sequences", 3) == 3
    assert board.update(1, "active_sequences", 2) == 5
    assert board.update(0, "active_sequences", 0) == 2
    assert board.update(0, "kv_cache_usage", 0.5) == 0.25
    assert board.update(1, "kv_cache_usage", 0.25) == 0.375


@pytest.mark.parametrize("model", ["translator", "vit"])
def test_instances_are_checked_in_config_yaml(tiny_repository: Path, model: str) -> None:
    config = read_model_config(tiny_repository / model)
    with pytest.raises(ValueError, match="instances must be >= 1"):
        type(config.batching)(instances=0)
    with pytest.raises(ValueError, match="needs backend onnxruntime"):
        replace(config, backend="tensorrt", batching=replace(config.batching, instances=2))


def test_triton_model_config_counts_the_instances(
    servers: tuple[ServerThread, ServerThread],
) -> None:
    from serving.proto_gen.inference import grpc_service_pb2 as kpb
    from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

    counts = []
    for server in servers:
        with grpc.insecure_channel(server.address) as channel:
            stub = kpb_grpc.GRPCInferenceServiceStub(channel)
            for model in ("translator", "vit"):
                reply = stub.ModelConfig(kpb.ModelConfigRequest(name=model), timeout=10)
                counts.append([group.count for group in reply.config.instance_group])
    assert counts == [[1], [1], [2], [2]]


def classify_all(server: ServerThread, images: list[bytes]) -> list[list[float]]:
    """Every image at once (one Classify call each): the top-3 scores in the images' order."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)

        def one(image: bytes) -> list[float]:
            reply = stub.Classify(pb.ClassifyRequest(image=image, top_k=3), timeout=60)
            return [label.score for label in reply.labels]

        with concurrent.futures.ThreadPoolExecutor(len(images)) as pool:
            return list(pool.map(one, images))


def test_two_classifier_instances_answer_what_one_answers(
    servers: tuple[ServerThread, ServerThread],
) -> None:
    """The ViT with ``batching.instances: 2`` runs two batches at once, same answers."""
    from contract.images import encode_png
    from models.data import digits

    pixels = digits.load_digits_split("test")[0][:24]
    images = [encode_png(image) for image in pixels]
    one, two = (classify_all(server, images) for server in servers)
    np.testing.assert_allclose(one, two, atol=1e-5)
    assert two[0] and all(len(scores) == 3 for scores in two)


@pytest.mark.parametrize("model", ["translator", "vit"])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_thread_instances_share_their_sessions(
    tiny_repository: Path, threads: int, model: str
) -> None:
    from contract.repository import resolve_version
    from serving.repository import make_backends

    entry = tiny_repository / model
    config = read_model_config(entry)
    config = replace(
        config,
        batching=replace(config.batching, instances=3),
        onnxruntime=replace(config.onnxruntime, intra_op_threads=threads),
    )
    backends = make_backends(config, resolve_version(entry))
    assert len(backends) == 3
    assert len({id(b) for b in backends}) == (1 if threads == 1 else 3)
    # CUDA graphs belong to their session: instances that capture them never share one (the
    # option, on by default, captures only with the CUDA provider listed; here it runs on the CPU)
    cuda = ("CUDAExecutionProvider", "CPUExecutionProvider")
    graphs = replace(
        config,
        onnxruntime=replace(config.onnxruntime, cuda_graph=True, execution_providers=cuda),
    )
    assert len({id(b) for b in make_backends(graphs, resolve_version(entry))}) == 3
