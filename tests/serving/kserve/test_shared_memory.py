"""Triton's system shared memory extension on a real server: an unmodified tritonclient passing
inputs and outputs through POSIX shared memory (results equal to the same request sent in the
message), the region registry (status, unregister, unique names, the object's bounds), and
every wrong use answered with its status and a message."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest

from contract.images import encode_png, pixel_values
from serving.kserve.tensors import decode_outputs, encode_bytes
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import TIMEOUT, digit_images, infer_request
from tests.serving.server_thread import ServerThread

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm (POSIX shared memory)")


class Objects:
    """POSIX shared memory objects of one test, unlinked at its end."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def create(self, data: bytes | int) -> str:
        """A new object holding ``data`` (or that many zero bytes); its key."""
        key = f"/attnserve-test-{uuid.uuid4().hex[:12]}"
        self.keys.append(key)
        (SHM / key[1:]).write_bytes(bytes(data) if isinstance(data, int) else data)
        return key

    def read(self, key: str) -> bytes:
        return (SHM / key[1:]).read_bytes()


@pytest.fixture
def objects(stub: pb_grpc.GRPCInferenceServiceStub) -> Iterator[Objects]:
    made = Objects()
    yield made
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=TIMEOUT)
    for key in made.keys:
        (SHM / key[1:]).unlink(missing_ok=True)


def register(
    stub: pb_grpc.GRPCInferenceServiceStub, name: str, key: str, byte_size: int, offset: int = 0
) -> None:
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=byte_size
        ),
        timeout=TIMEOUT,
    )


def in_region(request: pb.ModelInferRequest, index: int, region: str, size: int, offset: int = 0):
    """Move input ``index``'s raw data out of the message: it names ``region`` instead."""
    params = request.inputs[index].parameters
    params["shared_memory_region"].string_param = region
    params["shared_memory_byte_size"].int64_param = size
    if offset:
        params["shared_memory_offset"].int64_param = offset
    del request.raw_input_contents[index]
    return request


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=TIMEOUT, **kwargs)
    return err.value


def test_tritonclient_passes_inputs_and_outputs_through_shared_memory(
    triton: tuple[ModuleType, Any],
) -> None:
    """The client's own shared memory module, as Triton's examples use it: an encoded PNG in,
    probabilities out; the figures equal the same request's over the message."""
    grpcclient, client = triton
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    images = [encode_png(image) for image in digit_images(2)]
    data = np.array(images, dtype=np.object_).reshape(2, 1)
    plain_input = grpcclient.InferInput("image", [2, 1], "BYTES")
    plain_input.set_data_from_numpy(data)
    plain = client.infer("vit", [plain_input]).as_numpy("probabilities")

    raw = encode_bytes(images)
    key_in, key_out = f"/attnserve-in-{os.getpid()}", f"/attnserve-out-{os.getpid()}"
    region_in = shm.create_shared_memory_region("images", key_in, len(raw))
    region_out = shm.create_shared_memory_region("probabilities", key_out, plain.nbytes + 64)
    try:
        shm.set_shared_memory_region(region_in, [np.frombuffer(raw, dtype=np.uint8)])
        client.register_system_shared_memory("images", key_in, len(raw))
        client.register_system_shared_memory("probabilities", key_out, plain.nbytes + 64)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["images"] == {"name": "images", "key": key_in, "byte_size": str(len(raw))}
        assert status["probabilities"]["byte_size"] == str(plain.nbytes + 64)

        shared_input = grpcclient.InferInput("image", [2, 1], "BYTES")
        shared_input.set_shared_memory("images", len(raw))
        wanted = grpcclient.InferRequestedOutput("probabilities")
        wanted.set_shared_memory("probabilities", plain.nbytes, offset=64)
        result = client.infer("vit", [shared_input], outputs=[wanted])
        output = result.get_output("probabilities")
        assert output.parameters["shared_memory_region"].string_param == "probabilities"
        assert output.parameters["shared_memory_byte_size"].int64_param == plain.nbytes
        assert output.parameters["shared_memory_offset"].int64_param == 64
        assert result.get_response().raw_output_contents == [b""]  # the bytes went to the region
        written = shm.get_contents_as_numpy(region_out, np.float32, plain.shape, offset=64)
        np.testing.assert_array_equal(written, plain)

        client.unregister_system_shared_memory("images")
        assert list(client.get_system_shared_memory_status(as_json=True)["regions"]) == [
            "probabilities"
        ]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True) == {}
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def test_translation_text_from_a_region_with_an_offset_next_to_a_raw_input(
    stub: pb_grpc.GRPCInferenceServiceStub, objects: Objects
) -> None:
    """Text in shared memory 100 bytes into a region that starts 8 bytes into its object, the
    target language still raw in the message: raw entries then count only the inputs outside
    shared memory, as Triton's do."""
    texts = [b"three hundred and twelve", b"nineteen"]
    plain = infer_request(
        "translator", ("text", "BYTES", texts), ("target_language", "BYTES", [b"de"])
    )
    expected = decode_outputs(stub.ModelInfer(plain, timeout=TIMEOUT))
    data = encode_bytes(texts)
    key = objects.create(bytes(108) + data + bytes(10))
    register(stub, "texts", key, byte_size=100 + len(data) + 10, offset=8)
    shared = in_region(
        infer_request(
            "translator", ("text", "BYTES", texts), ("target_language", "BYTES", [b"de"])
        ),
        0,
        "texts",
        len(data),
        offset=100,
    )
    assert len(shared.raw_input_contents) == 1
    got = decode_outputs(stub.ModelInfer(shared, timeout=TIMEOUT))
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_array_equal(got["token_ids"], expected["token_ids"])


def test_pixels_in_and_an_output_too_small(
    stub: pb_grpc.GRPCInferenceServiceStub, objects: Objects
) -> None:
    pixels = pixel_values(digit_images(1))
    raw = pixels.astype(np.float32).tobytes()
    register(stub, "pixels", objects.create(raw), len(raw))
    register(stub, "out", objects.create(64), 64)
    request = in_region(
        infer_request("vit", ("pixel_values", "FP32", pixels)), 0, "pixels", len(raw)
    )
    reply = decode_outputs(stub.ModelInfer(request, timeout=TIMEOUT))
    assert reply["probabilities"].shape == (1, 10)

    small = pb.ModelInferRequest()
    small.CopyFrom(request)
    wanted = small.outputs.add(name="probabilities")
    wanted.parameters["shared_memory_region"].string_param = "out"
    wanted.parameters["shared_memory_byte_size"].int64_param = 16
    err = rpc_error(stub.ModelInfer, small)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "output 'probabilities' is 40 bytes; its shared_memory_byte_size in region 'out' "
        + ("is 16: it must be at least 40")
        in err.details()
    )

    both = pb.ModelInferRequest()
    both.CopyFrom(small)
    both.outputs[0].parameters["classification"].int64_param = 2
    err = rpc_error(stub.ModelInfer, both)
    assert "sets both classification and a shared memory region" in err.details()

    short = in_region(
        infer_request("vit", ("pixel_values", "FP32", pixels)), 0, "pixels", len(raw) - 4
    )
    err = rpc_error(stub.ModelInfer, short)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{len(raw) - 4} bytes of raw data" in err.details()


def test_registry_errors(stub: pb_grpc.GRPCInferenceServiceStub, objects: Objects) -> None:
    key = objects.create(1000)
    register(stub, "r", key, 1000)
    cases = [
        ({"name": "r", "key": key, "byte_size": 10}, "ALREADY_EXISTS", "named 'r' is registered"),
        ({"name": "", "key": key, "byte_size": 10}, "INVALID_ARGUMENT", "name the region"),
        ({"name": "z", "key": key, "byte_size": 0}, "INVALID_ARGUMENT", "byte_size must be > 0"),
        (
            {"name": "z", "key": key, "byte_size": 900, "offset": 200},
            "INVALID_ARGUMENT",
            "runs past the end of shared memory object",
        ),
        (
            {"name": "z", "key": "/attnserve-none", "byte_size": 8},
            "NOT_FOUND",
            "no shared memory object '/attnserve-none'",
        ),
        (
            {"name": "z", "key": "/../etc/passwd", "byte_size": 8},
            "INVALID_ARGUMENT",
            "is not an shm_open name",
        ),
        ({"name": "z", "key": "/", "byte_size": 8}, "INVALID_ARGUMENT", "not an shm_open name"),
    ]
    for fields, code, message in cases:
        err = rpc_error(
            stub.SystemSharedMemoryRegister, pb.SystemSharedMemoryRegisterRequest(**fields)
        )
        assert (err.code().name, message in err.details()) == (code, True), (fields, err.details())
    err = rpc_error(stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest(name="nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    # unregistering a name never registered is no error (Triton's behaviour too)
    stub.SystemSharedMemoryUnregister(
        pb.SystemSharedMemoryUnregisterRequest(name="nope"), timeout=TIMEOUT
    )


def test_requests_naming_bad_regions(
    stub: pb_grpc.GRPCInferenceServiceStub, objects: Objects
) -> None:
    pixels = pixel_values(digit_images(1))
    size = pixels.astype(np.float32).nbytes
    key = objects.create(size)
    register(stub, "px", key, size)

    def request(**params: Any) -> pb.ModelInferRequest:
        built = infer_request("vit", ("pixel_values", "FP32", pixels))
        del built.raw_input_contents[0]
        for name, value in params.items():
            field = "string_param" if isinstance(value, str) else "int64_param"
            setattr(built.inputs[0].parameters[f"shared_memory_{name}"], field, value)
        return built

    cases = [
        (request(region="ghost", byte_size=size), "NOT_FOUND", "no shared memory region named"),
        (request(region="px"), "INVALID_ARGUMENT", "needs both shared_memory_region"),
        (
            request(region="px", byte_size=size, offset=4),
            "INVALID_ARGUMENT",
            "does not lie inside shared memory region 'px'",
        ),
        (request(region="px", byte_size=-1), "INVALID_ARGUMENT", "does not lie inside"),
        (request(region=7, byte_size=size), "INVALID_ARGUMENT", "must be a string"),
    ]
    for built, code, message in cases:
        err = rpc_error(stub.ModelInfer, built)
        assert (err.code().name, message in err.details()) == (code, True), err.details()

    both = request(region="px", byte_size=size)
    both.inputs[0].contents.fp32_contents.extend(pixels.reshape(-1).tolist())
    err = rpc_error(stub.ModelInfer, both)
    assert "sets contents while it lies in shared memory" in err.details()

    (SHM / key[1:]).unlink()  # the client removed the object but not the region
    err = rpc_error(stub.ModelInfer, request(region="px", byte_size=size))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "no shared memory object" in err.details()


def test_streamed_generation_refuses_outputs_in_shared_memory(
    stub: pb_grpc.GRPCInferenceServiceStub, objects: Objects
) -> None:
    register(stub, "o", objects.create(256), 256)
    request = infer_request("translator", ("text", "BYTES", [b"twelve"]), target_language="de")
    wanted = request.outputs.add(name="translation")
    wanted.parameters["shared_memory_region"].string_param = "o"
    wanted.parameters["shared_memory_byte_size"].int64_param = 256
    (reply,) = list(stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT))
    assert reply.error_message.startswith("INVALID_ARGUMENT: a streamed generation")
    # the same request by ModelInfer writes the translation into the region
    out = stub.ModelInfer(request, timeout=TIMEOUT)
    size = out.outputs[0].parameters["shared_memory_byte_size"].int64_param
    del request.outputs[:]
    request.outputs.add(name="translation")
    expected = stub.ModelInfer(request, timeout=TIMEOUT).raw_output_contents[0]
    assert objects.read(objects.keys[-1])[:size] == expected


def test_a_server_with_the_extension_off(tiny_repository: Path) -> None:
    with (
        ServerThread(tiny_repository, metrics_port=-1, models=("vit",)) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
        assert "system_shared_memory" not in meta.extensions
        for call, message in [
            (stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest()),
            (stub.SystemSharedMemoryRegister, pb.SystemSharedMemoryRegisterRequest(name="a")),
            (stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest()),
        ]:
            err = rpc_error(call, message)
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--system-shared-memory" in err.details()
        pixels = pixel_values(digit_images(1))
        request = in_region(
            infer_request("vit", ("pixel_values", "FP32", pixels)), 0, "px", pixels.nbytes
        )
        err = rpc_error(stub.ModelInfer, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "names a shared memory region: system shared memory is off" in err.details()
