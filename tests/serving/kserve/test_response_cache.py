"""Triton's response cache (``--cache-config local,size=BYTES``, a model's ``response_cache``)
on a real server: a repeated ModelInfer is answered from the cache with the same outputs and
its own id, counted as a hit in ModelStatistics (read by an unmodified tritonclient too) and
/metrics and not as an inference; what must not be cached is not (a sampled generation without a
seed, a model without the setting, shared memory); least recently used entries go first within
the size. The cache itself against a plain reference model, and the flag's parser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import attnserve_cli
from benchmarks.server_process import ServeProcess
from contract.images import pixel_values
from serving.errors import InvalidArgument
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.response_cache import ENTRY_OVERHEAD, ResponseCache, parse_cache_config
from serving.server_config import ServerConfig
from tests.reliability.harness import copy_repository, sample, says_what_to_fix, scrape
from tests.serving.frontends import two_frontends
from tests.serving.kserve.infer_requests import TIMEOUT, digit_images, infer_request, translate
from tests.serving.server_thread import ServerThread

CACHED = {"response_cache": True}
Stub = pb_grpc.GRPCInferenceServiceStub


@pytest.fixture(scope="module")
def repository(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models, the ViT and the translator with the response cache on."""
    root = tmp_path_factory.mktemp("cache") / "repository"
    return copy_repository(tiny_repository, root, vit=CACHED, translator=CACHED)


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    with ServerThread(repository, response_cache_bytes=1 << 20) as running:
        yield running


@pytest.fixture
def stub(server: ServerThread) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield Stub(channel)


def vit(index: int, request_id: str = "req-1", **params: int) -> pb.ModelInferRequest:
    request = infer_request(
        "vit", ("pixel_values", "FP32", pixel_values(digit_images(8)[index : index + 1])), **params
    )
    request.id = request_id
    return request


def cache_stats(stub: Stub, name: str) -> tuple[int, int, int, int]:
    """(hits, misses, successful requests, inferences) of a model, from ModelStatistics."""
    reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=name), timeout=TIMEOUT)
    stats = reply.model_stats[0]
    infer = stats.inference_stats
    return infer.cache_hit.count, infer.cache_miss.count, infer.success.count, stats.inference_count


def outputs(reply: pb.ModelInferResponse) -> list[tuple[str, bytes]]:
    return [(o.name, raw) for o, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)]


def test_a_repeated_request_is_answered_from_the_cache(
    stub: Stub, server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    before = cache_stats(stub, "vit")
    first = stub.ModelInfer(vit(0, "a"), timeout=TIMEOUT)
    # the same request with another id and scheduling parameters: the same answer, its own id
    again = stub.ModelInfer(vit(0, "b", priority=1, timeout=10_000_000), timeout=TIMEOUT)
    assert outputs(again) == outputs(first) and (first.id, again.id) == ("a", "b")
    assert again.model_version == "1"
    hits, misses, success, inferences = cache_stats(stub, "vit")
    assert (hits, misses, success, inferences) == (
        before[0] + 1,
        before[1] + 1,
        before[2] + 2,
        before[3] + 1,  # the hit ran no model
    )
    # another image, and the same image asking for other outputs, are other entries
    stub.ModelInfer(vit(1), timeout=TIMEOUT)
    top = vit(0)
    top.outputs.add(name="probabilities").parameters["classification"].int64_param = 3
    stub.ModelInfer(top, timeout=TIMEOUT)
    assert cache_stats(stub, "vit")[:2] == (hits, misses + 2)
    assert server.metrics_url
    families = scrape(server.metrics_url)
    assert sample(families, "attnserve_response_cache_total", model="vit", result="hit") == hits
    assert (
        sample(families, "attnserve_response_cache_total", model="vit", result="miss") == misses + 2
    )
    assert sample(families, "attnserve_response_cache_entries") >= 3
    assert sample(families, "attnserve_response_cache_bytes") > 0
    # attnserve stats shows them too
    assert (
        attnserve_cli.main(["stats", "--server", server.address, "--model", "vit", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["cache_hits"] == hits


def test_a_sampled_generation_is_cached_only_with_a_seed(stub: Stub) -> None:
    def twice(**params: object) -> tuple[int, int]:
        before = cache_stats(stub, "translator")[:2]
        replies = [
            stub.ModelInfer(
                translate([b"forty-two"], target_language="de", max_new_tokens=6, **params),
                timeout=TIMEOUT,
            )
            for _ in range(2)
        ]
        assert replies[0].outputs
        after = cache_stats(stub, "translator")[:2]
        return after[0] - before[0], after[1] - before[1]

    assert twice() == (1, 1)  # greedy: the same answer every time
    assert twice(temperature=0.9) == (0, 0)  # sampled without a seed: never from the cache
    assert twice(temperature=0.9, seed=7) == (1, 1)


def test_a_model_without_the_setting_is_not_cached(stub: Stub) -> None:
    image = np.zeros((1, 48, 48, 3), np.uint8)
    for _ in range(2):
        stub.ModelInfer(
            infer_request("captioner", ("image", "UINT8", image), max_new_tokens=3), timeout=TIMEOUT
        )
    assert cache_stats(stub, "captioner")[:2] == (0, 0)
    configs = {
        name: stub.ModelConfig(pb.ModelConfigRequest(name=name), timeout=TIMEOUT).config
        for name in ("vit", "captioner")
    }
    assert configs["vit"].response_cache.enable and not configs["captioner"].response_cache.enable


def test_a_failed_request_is_not_cached(stub: Stub) -> None:
    before = cache_stats(stub, "vit")[:2]
    bad = vit(2)
    bad.outputs.add(name="no_such_output")
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(bad, timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert cache_stats(stub, "vit")[:2] == before


def test_tritonclient_reads_the_cache_statistics(server: ServerThread, stub: Stub) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] not installed")
    for _ in range(2):
        stub.ModelInfer(vit(3), timeout=TIMEOUT)
    hits, misses, _, _ = cache_stats(stub, "vit")
    client = grpcclient.InferenceServerClient(url=server.address)
    try:
        theirs = client.get_inference_statistics("vit", as_json=True)["model_stats"][0]
    finally:
        client.close()
    stats = theirs["inference_stats"]
    assert int(stats["cache_hit"]["count"]) == hits >= 1
    assert int(stats["cache_miss"]["count"]) == misses
    assert int(stats["cache_hit"]["ns"]) > 0


def test_the_least_recently_used_go_first(repository: Path, stub: Stub) -> None:
    reply = stub.ModelInfer(vit(0, ""), timeout=TIMEOUT)  # the size of one entry, id left out
    entry = len(reply.SerializeToString()) + 64 + ENTRY_OVERHEAD  # a BLAKE2b key: 64 bytes
    with (
        ServerThread(repository, response_cache_bytes=2 * entry + entry // 2) as small,
        grpc.insecure_channel(small.address) as channel,
    ):
        small_stub = Stub(channel)
        for index in (0, 1, 0, 2, 0, 1):  # 0 stays (used last), 1 is evicted by 2
            small_stub.ModelInfer(vit(index), timeout=TIMEOUT)
        assert cache_stats(small_stub, "vit")[:2] == (2, 4)
        assert sample(scrape(small.metrics_url), "attnserve_response_cache_entries") == 2
    with (
        ServerThread(repository, metrics_port=-1) as off,  # no cache on the server
        grpc.insecure_channel(off.address) as channel,
    ):
        off_stub = Stub(channel)
        for _ in range(2):
            off_stub.ModelInfer(vit(0), timeout=TIMEOUT)
        assert cache_stats(off_stub, "vit")[:2] == (0, 0)


# --- the cache against a reference -------------------------------------------------------------


@given(
    capacity=st.integers(0, 4000),
    operations=st.lists(
        st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 900)), max_size=60
    ),
)
def test_the_cache_matches_a_least_recently_used_reference(
    capacity: int, operations: list[tuple[bool, int, int]]
) -> None:
    cache = ResponseCache(capacity)
    reference: list[tuple[bytes, bytes]] = []  # least recently used first

    def cost(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    for is_put, number, size in operations:
        key = bytes([number]) * 32
        found = next((i for i, (k, _) in enumerate(reference) if k == key), None)
        if is_put:
            value = bytes([size % 251]) * size
            kept = cache.put(key, value)
            assert kept == (cost(key, value) <= capacity)
            if kept:
                if found is not None:
                    del reference[found]
                reference.append((key, value))
                while sum(cost(k, v) for k, v in reference) > capacity:
                    reference.pop(0)
        else:
            expected = None if found is None else reference[found][1]
            assert cache.get(key) == expected
            if found is not None:
                reference.append(reference.pop(found))
        assert cache.used == sum(cost(k, v) for k, v in reference) <= max(capacity, 0)
        assert len(cache) == len(reference)


@given(st.integers(0, 1 << 40), st.sampled_from(["", " ", ","]))
def test_the_cache_config_flag_reads_tritons_form(size: int, space: str) -> None:
    assert parse_cache_config(f"local,{space}size={size}{space}") == size


@pytest.mark.parametrize(
    "text",
    [
        "redis,host=localhost",
        "local",
        "local,size=",
        "local,size=-1",
        "local,size=1e6",
        "local,ttl=3",
        "",
    ],
)
def test_a_wrong_cache_config_says_what_to_write(text: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_cache_config(text)
    assert says_what_to_fix(str(err.value)) and "local,size=" in str(err.value)


def test_the_cache_size_is_checked() -> None:
    with pytest.raises(ValueError, match="response_cache_bytes"):
        ServerConfig(response_cache_bytes=-1)


def test_each_frontend_process_caches_and_the_statistics_add_up(repository: Path) -> None:
    """``attnserve serve --frontend-workers 2 --cache-config local,size=...``: a request sent on
    six connections twice each misses at most once per frontend process."""
    with two_frontends(repository, "--cache-config", "local,size=1048576") as (_server, stubs):
        for _ in range(2):
            for stub in stubs:
                assert stub.ModelInfer(vit(4), timeout=TIMEOUT).outputs
        hits, misses, success, inferences = cache_stats(stubs[0], "vit")
        assert hits + misses == success == 2 * len(stubs)
        assert 1 <= misses <= 2 and inferences == misses


def test_a_wrong_cache_flag_stops_the_start(repository: Path) -> None:
    server = ServeProcess(repository, "--metrics-port", "-1", "--cache-config", "redis,size=1")
    with pytest.raises(RuntimeError, match="local,size=BYTES"):
        server.start()


def test_a_reloaded_model_answers_afresh(repository: Path) -> None:
    """A reload may bring other files under the same version (a re-export): the answers of the
    model it replaced are not served again."""
    with (
        ServerThread(
            repository, metrics_port=-1, response_cache_bytes=1 << 20, model_control_mode="explicit"
        ) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = Stub(channel)
        for _ in range(2):
            stub.ModelInfer(vit(5), timeout=TIMEOUT)
        assert cache_stats(stub, "vit")[:2] == (1, 1)
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="vit"), timeout=TIMEOUT)
        for _ in range(2):
            stub.ModelInfer(vit(5), timeout=TIMEOUT)
        assert cache_stats(stub, "vit")[:2] == (2, 2)  # a miss after the reload, then a hit
