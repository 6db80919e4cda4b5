"""Our ``inference`` protos are wire-compatible with Triton's (the KServe v2 protocol).

The KServe v2 / Triton checks come in two strengths. Without tritonclient (the default test
environment) the descriptors of our ``inference`` messages are compared with a table transcribed
from Triton's grpc_service.proto / model_config.proto, and raw bytes are checked against Triton's
field numbers. With tritonclient installed (the ``bench`` extra), our descriptors are also
compared with tritonclient's own, messages cross-parse both ways, and an unmodified
``tritonclient.grpc.InferenceServerClient`` talks to a server built on our generated code.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from serving.proto_gen.inference import grpc_service_pb2, grpc_service_pb2_grpc
from tests.serving.proto_descriptors import (
    TRITON_ENUMS,
    TRITON_FIELDS,
    TRITON_METHODS,
    WIRE_LEN,
    all_messages,
    make_infer_request,
    parse_field_table,
    render_field,
    render_messages,
    render_methods,
    wire_fields,
)


class EchoInferenceServicer(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
    """A KServe v2 servicer for one model, "echo", that returns its inputs as outputs."""

    def ServerLive(self, request: Any, context: Any) -> Any:
        return grpc_service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return grpc_service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request: Any, context: Any) -> Any:
        return grpc_service_pb2.ModelReadyResponse(ready=request.name == "echo")

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        tensor = grpc_service_pb2.ModelMetadataResponse.TensorMetadata
        return grpc_service_pb2.ModelMetadataResponse(
            name="echo",
            versions=["1"],
            platform="attnserve",
            inputs=[tensor(name="INPUT", datatype="FP32", shape=[-1, 3])],
            outputs=[tensor(name="INPUT", datatype="FP32", shape=[-1, 3])],
        )

    def ModelConfig(self, request: Any, context: Any) -> Any:
        config = grpc_service_pb2.ModelConfig(
            name="echo",
            backend="onnxruntime",
            max_batch_size=8,
            input=[
                grpc_service_pb2.ModelInput(
                    name="INPUT", data_type=grpc_service_pb2.TYPE_FP32, dims=[3]
                )
            ],
            dynamic_batching=grpc_service_pb2.ModelDynamicBatching(
                max_queue_delay_microseconds=100,
                default_queue_policy=grpc_service_pb2.ModelQueuePolicy(max_queue_size=16),
            ),
        )
        return grpc_service_pb2.ModelConfigResponse(config=config)

    def ModelInfer(self, request: Any, context: Any) -> Any:
        return echo(request)

    def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Iterator[Any]:
        for request in request_iterator:
            yield grpc_service_pb2.ModelStreamInferResponse(infer_response=echo(request))


def echo(request: grpc_service_pb2.ModelInferRequest) -> grpc_service_pb2.ModelInferResponse:
    """The response that returns each input of ``request`` as an output of the same name."""
    response = grpc_service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version="1", id=request.id
    )
    for tensor in request.inputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    response.raw_output_contents.extend(request.raw_input_contents)
    return response


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    """A gRPC server running :class:`EchoInferenceServicer` on a free port; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        EchoInferenceServicer(), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


# --------------------------------------------------------------------------------------------
# Triton wire compatibility without tritonclient
# --------------------------------------------------------------------------------------------


def test_inference_fields_match_triton() -> None:
    assert render_messages(grpc_service_pb2.DESCRIPTOR) == parse_field_table(TRITON_FIELDS)


def test_inference_enums_match_triton() -> None:
    enums = {
        enum.full_name.removeprefix("inference."): {v.name: v.number for v in enum.values}
        for enum in [
            *grpc_service_pb2.DESCRIPTOR.enum_types_by_name.values(),
            *(e for m in all_messages(grpc_service_pb2.DESCRIPTOR) for e in m.enum_types),
        ]
    }
    assert enums == TRITON_ENUMS


def test_model_infer_request_bytes_use_triton_field_numbers() -> None:
    data = make_infer_request().SerializeToString(deterministic=True)
    top = wire_fields(data)
    # model_name 1, model_version 2, id 3, parameters 4 (x4), inputs 5 (x2), outputs 6,
    # raw_input_contents 7 (x2): all length-delimited.
    assert [number for number, _, _ in top] == [1, 2, 3, 4, 4, 4, 4, 5, 5, 6, 7, 7]
    assert {wire_type for _, wire_type, _ in top} == {WIRE_LEN}
    assert [payload for number, _, payload in top if number == 7] == [
        bytes(range(48)),
        b"\x02\x00\x00\x00hi",
    ]
    first_input = next(payload for number, _, payload in top if number == 5)
    # InferInputTensor: name 1, datatype 2, shape 3 (packed int64), parameters 4.
    assert [(number, payload) for number, _, payload in wire_fields(first_input)][:3] == [
        (1, b"pixel_values"),
        (2, b"FP32"),
        (3, bytes([1, 3, 2, 2])),
    ]
    assert [number for number, _, _ in wire_fields(first_input)] == [1, 2, 3, 4]


def test_bytes_written_with_triton_field_numbers_parse_into_our_messages() -> None:
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | WIRE_LEN, len(payload)]) + payload

    request = grpc_service_pb2.ModelInferRequest.FromString(
        field(1, b"vit") + field(3, b"id-1") + field(7, b"\x00\x01") + field(7, b"\x02")
    )
    assert (request.model_name, request.id) == ("vit", "id-1")
    assert list(request.raw_input_contents) == [b"\x00\x01", b"\x02"]
    response = grpc_service_pb2.ModelInferResponse.FromString(
        field(1, b"vit")
        + field(5, field(1, b"probabilities") + field(2, b"FP32"))
        + field(6, b"\x00\x00\x80\x3f")
    )
    assert response.outputs[0].name == "probabilities"
    assert response.outputs[0].datatype == "FP32"
    assert list(response.raw_output_contents) == [b"\x00\x00\x80\x3f"]
    stream = grpc_service_pb2.ModelStreamInferResponse.FromString(
        field(1, b"boom") + field(2, field(3, b"r"))
    )
    assert (stream.error_message, stream.infer_response.id) == ("boom", "r")


def test_our_stub_talks_to_our_servicer(echo_server: str) -> None:
    with grpc.insecure_channel(echo_server) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(grpc_service_pb2.ServerLiveRequest(), timeout=10).live
        request = make_infer_request()
        response = stub.ModelInfer(request, timeout=10)
        assert response.id == "request-7"
        assert list(response.raw_output_contents) == list(request.raw_input_contents)
        streamed = list(stub.ModelStreamInfer(iter([request, request]), timeout=10))
        assert [r.infer_response.id for r in streamed] == ["request-7", "request-7"]


# --------------------------------------------------------------------------------------------
# Triton wire compatibility with tritonclient's own classes (skipped when it is not installed)
# --------------------------------------------------------------------------------------------


def import_tritonclient_grpc() -> ModuleType:
    """tritonclient.grpc, or skip the test (it comes with the ``bench`` extra)."""
    return pytest.importorskip(
        "tritonclient.grpc", reason="tritonclient[grpc] is not installed (bench extra)"
    )


def test_descriptors_match_tritonclient() -> None:
    import_tritonclient_grpc()
    from tritonclient.grpc import service_pb2

    triton_pool = service_pb2.DESCRIPTOR.pool
    for message in all_messages(grpc_service_pb2.DESCRIPTOR):
        theirs = triton_pool.FindMessageTypeByName(message.full_name)
        for field in message.fields:
            assert field.name in theirs.fields_by_name, f"{message.full_name}.{field.name}"
            assert render_field(field) == render_field(theirs.fields_by_name[field.name]), (
                f"{message.full_name}.{field.name}"
            )
    for name, values in TRITON_ENUMS.items():
        theirs_enum = triton_pool.FindEnumTypeByName(f"inference.{name}")
        assert {v.name: v.number for v in theirs_enum.values} == values
    service = triton_pool.FindServiceByName("inference.GRPCInferenceService")
    theirs_methods = render_methods(service)
    assert {name: theirs_methods[name] for name in TRITON_METHODS} == TRITON_METHODS


def test_messages_cross_parse_with_tritonclient() -> None:
    import_tritonclient_grpc()
    from tritonclient.grpc import service_pb2

    theirs = service_pb2.ModelInferRequest()
    theirs.model_name = "vit"
    theirs.id = "t-1"
    tensor = theirs.inputs.add(name="pixel_values", datatype="FP32", shape=[1, 3])
    tensor.parameters["shared_memory_region"].string_param = "none"
    tensor.contents.fp32_contents.extend([0.5, 1.0, -2.0])
    theirs.outputs.add(name="probabilities").parameters["classification"].int64_param = 2
    theirs.parameters["priority"].int64_param = 1
    theirs.raw_input_contents.append(b"\x01\x02")
    ours = grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
    assert MessageToDict(ours) == MessageToDict(theirs)

    our_response = grpc_service_pb2.ModelInferResponse(model_name="vit", id="t-1")
    our_response.outputs.add(name="probabilities", datatype="FP32", shape=[1, 10])
    our_response.raw_output_contents.append(bytes(40))
    our_response.parameters["triton_final_response"].bool_param = True
    their_response = service_pb2.ModelInferResponse.FromString(our_response.SerializeToString())
    assert MessageToDict(their_response) == MessageToDict(our_response)

    our_config = EchoInferenceServicer().ModelConfig(None, None)
    their_config = service_pb2.ModelConfigResponse.FromString(our_config.SerializeToString())
    assert MessageToDict(their_config) == MessageToDict(our_config)
    assert their_config.config.dynamic_batching.default_queue_policy.max_queue_size == 16


def test_unmodified_tritonclient_works_against_our_service(echo_server: str) -> None:
    grpcclient = import_tritonclient_grpc()
    np = pytest.importorskip("numpy")
    client = grpcclient.InferenceServerClient(url=echo_server)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("echo")
        assert not client.is_model_ready("missing")
        assert client.get_model_metadata("echo").inputs[0].shape == [-1, 3]
        config = client.get_model_config("echo", as_json=True)["config"]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "100"

        values = np.arange(6, dtype=np.float32).reshape(2, 3)
        tensor = grpcclient.InferInput("INPUT", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        texts = np.array([b"hallo", b"welt"], dtype=np.object_)
        text_tensor = grpcclient.InferInput("TEXT", [2], "BYTES")
        text_tensor.set_data_from_numpy(texts)
        result = client.infer("echo", [tensor, text_tensor], request_id="r-1")
        assert result.get_response().id == "r-1"
        np.testing.assert_array_equal(result.as_numpy("INPUT"), values)
        assert result.as_numpy("TEXT").tolist() == [b"hallo", b"welt"]

        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("echo", [tensor], request_id="s-1")
        streamed, error = answers.get(timeout=10)
        client.stop_stream()
        assert error is None
        np.testing.assert_array_equal(streamed.as_numpy("INPUT"), values)
    finally:
        client.close()
