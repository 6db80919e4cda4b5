"""max_message_bytes on a real server: an over-limit request fails alone, the server goes on."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from contract.images import encode_png
from models.data import digits
from serving.client import AttnServeClient, ClientError
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from tests.serving.server_thread import ServerThread

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, max_message_bytes=LIMIT, metrics_port=-1) as running:
        yield running


def digit_png() -> bytes:
    images, _ = digits.load_digits_split("test")
    return encode_png(images[0])


def test_an_over_limit_request_is_resource_exhausted(server: ServerThread) -> None:
    big = b"\x89PNG" + bytes(2 * LIMIT)
    with AttnServeClient(server.address, timeout=10) as client:
        with pytest.raises(ClientError) as err:
            client.classify(big)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        size = pb.ClassifyRequest(image=big, top_k=5).ByteSize()
        assert f"Received message larger than max ({size} vs. {LIMIT})" in err.value.details
        assert client.classify(digit_png(), top_k=3)  # the next request is served
        assert client.health() == "SERVING"


def test_an_over_limit_kserve_tensor_is_resource_exhausted(server: ServerThread) -> None:
    request = kpb.ModelInferRequest(model_name="vit")
    request.inputs.add(name="pixel_values", datatype="FP32", shape=[8, 3, 32, 32])
    request.raw_input_contents.append(np.zeros((8, 3, 32, 32), np.float32).tobytes())
    with grpc.insecure_channel(server.address) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in err.value.details()
        assert stub.ServerReady(kpb.ServerReadyRequest(), timeout=10).ready


def test_over_limit_requests_do_not_hurt_concurrent_ones(server: ServerThread) -> None:
    good, big = digit_png(), bytes(LIMIT + 1)

    def classify(image: bytes) -> str:
        with AttnServeClient(server.address, timeout=30) as client:
            try:
                return client.classify(image, top_k=1)[0].label
            except ClientError as err:
                return err.code.name

    images = [good, big] * 8
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(classify, images))
    assert results[1::2] == ["RESOURCE_EXHAUSTED"] * 8
    assert all(label in {str(i) for i in range(10)} for label in results[::2]), results
