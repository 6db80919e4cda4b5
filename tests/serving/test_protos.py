"""The protos and their generated code: in sync, importable, and wire-compatible with Triton.

The KServe v2 / Triton checks come in two strengths. Without tritonclient (the default test
environment) the descriptors of our ``inference`` messages are compared with a table transcribed
from Triton's grpc_service.proto / model_config.proto, and raw bytes are checked against Triton's
field numbers. With tritonclient installed (the ``bench`` extra), our descriptors are also
compared with tritonclient's own, messages cross-parse both ways, and an unmodified
``tritonclient.grpc.InferenceServerClient`` talks to a server built on our generated code.
"""

from __future__ import annotations

import importlib.util
import pickle
import queue
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import (
    Descriptor,
    FieldDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)
from google.protobuf.json_format import MessageToDict
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.proto_gen.attnserve.v1 import attnserve_pb2, attnserve_pb2_grpc
from serving.proto_gen.inference import grpc_service_pb2, grpc_service_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATE = REPO_ROOT / "protos" / "generate.py"

# name: (request, response, client streaming, server streaming)
ATTNSERVE_METHODS = {
    "Translate": ("TranslateRequest", "TranslateResponse", False, False),
    "TranslateStream": ("TranslateStreamRequest", "TranslateStreamResponse", False, True),
    "Caption": ("CaptionRequest", "CaptionResponse", False, False),
    "CaptionStream": ("CaptionRequest", "CaptionStreamResponse", False, True),
    "Classify": ("ClassifyRequest", "ClassifyResponse", False, False),
    "ListModels": ("ListModelsRequest", "ListModelsResponse", False, False),
    "GetModel": ("GetModelRequest", "ModelInfo", False, False),
}

# Triton's GRPCInferenceService, the RPCs we serve, as in Triton's grpc_service.proto.
TRITON_METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse", False, False),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse", False, False),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse", False, False),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse", False, False),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse", False, False),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse", False, False),
    "ModelStreamInfer": ("ModelInferRequest", "ModelStreamInferResponse", True, True),
    "ModelConfig": ("ModelConfigRequest", "ModelConfigResponse", False, False),
}

# Every message and field of our `inference` package, transcribed from Triton's
# protobuf/grpc_service.proto and protobuf/model_config.proto (triton-inference-server/common)
# and checked against tritonclient 2.73's descriptors. One line per field:
# "<message> <field> <number> <type>"; a line with only a message name declares a message.
# Renumbering or retyping any of these breaks every Triton / KServe client.
TRITON_FIELDS = """
ServerLiveRequest
ServerLiveResponse live 1 bool
ServerReadyRequest
ServerReadyResponse ready 1 bool
ModelReadyRequest name 1 string
ModelReadyRequest version 2 string
ModelReadyResponse ready 1 bool
ServerMetadataRequest
ServerMetadataResponse name 1 string
ServerMetadataResponse version 2 string
ServerMetadataResponse extensions 3 repeated string
ModelMetadataRequest name 1 string
ModelMetadataRequest version 2 string
ModelMetadataResponse name 1 string
ModelMetadataResponse versions 2 repeated string
ModelMetadataResponse platform 3 string
ModelMetadataResponse inputs 4 repeated ModelMetadataResponse.TensorMetadata
ModelMetadataResponse outputs 5 repeated ModelMetadataResponse.TensorMetadata
ModelMetadataResponse.TensorMetadata name 1 string
ModelMetadataResponse.TensorMetadata datatype 2 string
ModelMetadataResponse.TensorMetadata shape 3 repeated int64
InferParameter bool_param 1 bool
InferParameter int64_param 2 int64
InferParameter string_param 3 string
InferParameter double_param 4 double
InferParameter uint64_param 5 uint64
InferTensorContents bool_contents 1 repeated bool
InferTensorContents int_contents 2 repeated int32
InferTensorContents int64_contents 3 repeated int64
InferTensorContents uint_contents 4 repeated uint32
InferTensorContents uint64_contents 5 repeated uint64
InferTensorContents fp32_contents 6 repeated float
InferTensorContents fp64_contents 7 repeated double
InferTensorContents bytes_contents 8 repeated bytes
ModelInferRequest model_name 1 string
ModelInferRequest model_version 2 string
ModelInferRequest id 3 string
ModelInferRequest parameters 4 map<string, InferParameter>
ModelInferRequest inputs 5 repeated ModelInferRequest.InferInputTensor
ModelInferRequest outputs 6 repeated ModelInferRequest.InferRequestedOutputTensor
ModelInferRequest raw_input_contents 7 repeated bytes
ModelInferRequest.InferInputTensor name 1 string
ModelInferRequest.InferInputTensor datatype 2 string
ModelInferRequest.InferInputTensor shape 3 repeated int64
ModelInferRequest.InferInputTensor parameters 4 map<string, InferParameter>
ModelInferRequest.InferInputTensor contents 5 InferTensorContents
ModelInferRequest.InferRequestedOutputTensor name 1 string
ModelInferRequest.InferRequestedOutputTensor parameters 2 map<string, InferParameter>
ModelInferResponse model_name 1 string
ModelInferResponse model_version 2 string
ModelInferResponse id 3 string
ModelInferResponse parameters 4 map<string, InferParameter>
ModelInferResponse outputs 5 repeated ModelInferResponse.InferOutputTensor
ModelInferResponse raw_output_contents 6 repeated bytes
ModelInferResponse.InferOutputTensor name 1 string
ModelInferResponse.InferOutputTensor datatype 2 string
ModelInferResponse.InferOutputTensor shape 3 repeated int64
ModelInferResponse.InferOutputTensor parameters 4 map<string, InferParameter>
ModelInferResponse.InferOutputTensor contents 5 InferTensorContents
ModelStreamInferResponse error_message 1 string
ModelStreamInferResponse infer_response 2 ModelInferResponse
ModelConfigRequest name 1 string
ModelConfigRequest version 2 string
ModelConfigResponse config 1 ModelConfig
ModelVersionPolicy latest 1 ModelVersionPolicy.Latest
ModelVersionPolicy all 2 ModelVersionPolicy.All
ModelVersionPolicy specific 3 ModelVersionPolicy.Specific
ModelVersionPolicy.Latest num_versions 1 uint32
ModelVersionPolicy.All
ModelVersionPolicy.Specific versions 1 repeated int64
ModelTensorReshape shape 1 repeated int64
ModelInput name 1 string
ModelInput data_type 2 DataType
ModelInput format 3 ModelInput.Format
ModelInput dims 4 repeated int64
ModelInput reshape 5 ModelTensorReshape
ModelInput is_shape_tensor 6 bool
ModelInput allow_ragged_batch 7 bool
ModelInput optional 8 bool
ModelInput is_non_linear_format_io 9 bool
ModelOutput name 1 string
ModelOutput data_type 2 DataType
ModelOutput dims 3 repeated int64
ModelOutput label_filename 4 string
ModelOutput reshape 5 ModelTensorReshape
ModelOutput is_shape_tensor 6 bool
ModelOutput is_non_linear_format_io 7 bool
ModelInstanceGroup name 1 string
ModelInstanceGroup count 2 int32
ModelInstanceGroup gpus 3 repeated int32
ModelInstanceGroup kind 4 ModelInstanceGroup.Kind
ModelInstanceGroup profile 5 repeated string
ModelInstanceGroup passive 7 bool
ModelInstanceGroup host_policy 9 string
ModelQueuePolicy timeout_action 1 ModelQueuePolicy.TimeoutAction
ModelQueuePolicy default_timeout_microseconds 2 uint64
ModelQueuePolicy allow_timeout_override 3 bool
ModelQueuePolicy max_queue_size 4 uint32
ModelDynamicBatching preferred_batch_size 1 repeated int32
ModelDynamicBatching max_queue_delay_microseconds 2 uint64
ModelDynamicBatching preserve_ordering 3 bool
ModelDynamicBatching priority_levels 4 uint64
ModelDynamicBatching default_priority_level 5 uint64
ModelDynamicBatching default_queue_policy 6 ModelQueuePolicy
ModelDynamicBatching priority_queue_policy 7 map<uint64, ModelQueuePolicy>
ModelParameter string_value 1 string
ModelTransactionPolicy decoupled 1 bool
ModelConfig name 1 string
ModelConfig platform 2 string
ModelConfig version_policy 3 ModelVersionPolicy
ModelConfig max_batch_size 4 int32
ModelConfig input 5 repeated ModelInput
ModelConfig output 6 repeated ModelOutput
ModelConfig instance_group 7 repeated ModelInstanceGroup
ModelConfig default_model_filename 8 string
ModelConfig dynamic_batching 11 ModelDynamicBatching
ModelConfig parameters 14 map<string, ModelParameter>
ModelConfig backend 17 string
ModelConfig model_transaction_policy 19 ModelTransactionPolicy
"""

# fmt: off
TRITON_ENUMS = {
    "DataType": {
        "TYPE_INVALID": 0, "TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4,
        "TYPE_UINT64": 5, "TYPE_INT8": 6, "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9,
        "TYPE_FP16": 10, "TYPE_FP32": 11, "TYPE_FP64": 12, "TYPE_STRING": 13, "TYPE_BF16": 14,
    },
    "ModelInput.Format": {"FORMAT_NONE": 0, "FORMAT_NHWC": 1, "FORMAT_NCHW": 2},
    "ModelInstanceGroup.Kind": {"KIND_AUTO": 0, "KIND_GPU": 1, "KIND_CPU": 2, "KIND_MODEL": 3},
    "ModelQueuePolicy.TimeoutAction": {"REJECT": 0, "DELAY": 1},
}
# fmt: on

SCALAR_TYPES = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
}

WIRE_VARINT, WIRE_FIXED64, WIRE_LEN, WIRE_FIXED32 = 0, 1, 2, 5


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def type_name(field: FieldDescriptor) -> str:
    """A field's type as written in a .proto file, without the package prefix."""
    if field.message_type is not None:
        return field.message_type.full_name.removeprefix("inference.")
    if field.enum_type is not None:
        return field.enum_type.full_name.removeprefix("inference.")
    return SCALAR_TYPES[field.type]


def render_field(field: FieldDescriptor) -> str:
    """A field as ``"<number> <type>"``, e.g. ``"7 repeated bytes"`` or ``"4 map<K, V>"``."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"{field.number} map<{type_name(key)}, {type_name(value)}>"
    return f"{field.number} {'repeated ' if field.is_repeated else ''}{type_name(field)}"


def all_messages(file: FileDescriptor) -> Iterator[Descriptor]:
    """Every message of a file, nested ones included, map entries left out."""
    pending = list(file.message_types_by_name.values())
    while pending:
        message = pending.pop(0)
        if not message.GetOptions().map_entry:
            yield message
            pending.extend(message.nested_types)


def render_messages(file: FileDescriptor) -> dict[str, dict[str, str]]:
    """``{message: {field: "<number> <type>"}}`` for every message of ``file``."""
    return {
        message.full_name.removeprefix("inference."): {
            field.name: render_field(field) for field in message.fields
        }
        for message in all_messages(file)
    }


def parse_field_table(table: str) -> dict[str, dict[str, str]]:
    """Parse :data:`TRITON_FIELDS` into the shape :func:`render_messages` returns."""
    messages: dict[str, dict[str, str]] = {}
    for line in table.strip().splitlines():
        message, *field = line.split(maxsplit=2)
        fields = messages.setdefault(message, {})
        if field:
            name, kind = field
            fields[name] = kind
    return messages


def render_methods(service: ServiceDescriptor) -> dict[str, tuple[str, str, bool, bool]]:
    """``{rpc: (request, response, client streaming, server streaming)}`` of a service."""
    return {
        method.name: (
            method.input_type.name,
            method.output_type.name,
            method.client_streaming,
            method.server_streaming,
        )
        for method in service.methods
    }


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """Decode a base-128 varint at ``offset``; returns (value, next offset)."""
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, offset


def wire_fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """Split serialized protobuf bytes into (field number, wire type, payload), in order."""
    fields = []
    offset = 0
    while offset < len(data):
        tag, offset = read_varint(data, offset)
        number, wire_type = tag >> 3, tag & 7
        start = offset
        if wire_type == WIRE_VARINT:
            _, offset = read_varint(data, offset)
        elif wire_type == WIRE_FIXED64:
            offset += 8
        elif wire_type == WIRE_FIXED32:
            offset += 4
        elif wire_type == WIRE_LEN:
            length, start = read_varint(data, offset)
            offset = start + length
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
        fields.append((number, wire_type, data[start:offset]))
    return fields


def load_generate_script() -> ModuleType:
    """Import protos/generate.py (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location("protos_generate", GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_infer_request() -> grpc_service_pb2.ModelInferRequest:
    """A ModelInferRequest with every field set, two inputs as raw contents."""
    request = grpc_service_pb2.ModelInferRequest(
        model_name="vit",
        model_version="1",
        id="request-7",
        inputs=[
            grpc_service_pb2.ModelInferRequest.InferInputTensor(
                name="pixel_values",
                datatype="FP32",
                shape=[1, 3, 2, 2],
                parameters={"binary_data_size": grpc_service_pb2.InferParameter(int64_param=48)},
            ),
            grpc_service_pb2.ModelInferRequest.InferInputTensor(
                name="text", datatype="BYTES", shape=[1]
            ),
        ],
        outputs=[
            grpc_service_pb2.ModelInferRequest.InferRequestedOutputTensor(
                name="probabilities",
                parameters={"classification": grpc_service_pb2.InferParameter(int64_param=3)},
            )
        ],
        raw_input_contents=[bytes(range(48)), b"\x02\x00\x00\x00hi"],
    )
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].double_param = 0.5
    request.parameters["sequence_start"].bool_param = True
    request.parameters["tag"].string_param = "x"
    return request


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
# Generated code: in sync and importable
# --------------------------------------------------------------------------------------------


def test_generated_code_is_in_sync() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    result = subprocess.run(
        [sys.executable, str(GENERATE), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_changed_missing_and_extra_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    generate = load_generate_script()
    copy = tmp_path / "serving" / "proto_gen"
    shutil.copytree(generate.OUTPUT_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(generate, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(generate, "OUTPUT_DIR", copy)
    assert generate.main(["--check"]) == 0

    (copy / "attnserve" / "v1" / "attnserve_pb2.py").write_text("# edited by hand\n")
    (copy / "inference" / "grpc_service_pb2.pyi").unlink()
    (copy / "inference" / "old_pb2.py").write_text("")
    capsys.readouterr()
    assert generate.main(["--check"]) == 1
    report = capsys.readouterr().out
    for name in ("attnserve_pb2.py", "grpc_service_pb2.pyi", "old_pb2.py"):
        assert name in report
    assert "grpc_service_pb2.py\n" not in report


@pytest.mark.parametrize(
    ("folder", "line", "expected"),
    [
        (
            ("attnserve", "v1"),
            "from attnserve.v1 import attnserve_pb2 as attnserve_dot_v1_dot_attnserve__pb2",
            "from . import attnserve_pb2 as attnserve_dot_v1_dot_attnserve__pb2",
        ),
        (
            ("attnserve", "v1"),
            "from inference import grpc_service_pb2 as _grpc_service_pb2",
            "from ...inference import grpc_service_pb2 as _grpc_service_pb2",
        ),
        ((), "import top_pb2 as top__pb2", "from . import top_pb2 as top__pb2"),
        (
            ("attnserve", "v1"),
            "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
            "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
        ),
    ],
)
def test_generator_makes_imports_of_generated_modules_relative(
    folder: tuple[str, ...], line: str, expected: str
) -> None:
    generate = load_generate_script()
    modules = {
        "attnserve.v1.attnserve_pb2": ("attnserve", "v1"),
        "inference.grpc_service_pb2": ("inference",),
        "top_pb2": (),
    }
    assert generate.fix_imports(line, folder, modules) == expected


def test_generated_modules_import_as_package_and_expose_services() -> None:
    for module, service in [
        (attnserve_pb2_grpc, "AttnServe"),
        (grpc_service_pb2_grpc, "GRPCInferenceService"),
    ]:
        for name in (f"{service}Stub", f"{service}Servicer", f"add_{service}Servicer_to_server"):
            assert callable(getattr(module, name)), f"{module.__name__}.{name}"

    attnserve = attnserve_pb2.DESCRIPTOR.services_by_name["AttnServe"]
    assert attnserve.full_name == "attnserve.v1.AttnServe"
    assert render_methods(attnserve) == ATTNSERVE_METHODS
    inference = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert inference.full_name == "inference.GRPCInferenceService"
    assert render_methods(inference) == TRITON_METHODS


def test_generated_messages_carry_their_module_and_pickle() -> None:
    request = attnserve_pb2.TranslateRequest(texts=["forty two"], target_language="de")
    assert type(request).__module__ == attnserve_pb2.__name__
    assert pickle.loads(pickle.dumps(request)) == request
    infer = make_infer_request()
    assert type(infer).__module__ == grpc_service_pb2.__name__
    assert pickle.loads(pickle.dumps(infer)) == infer


def test_inference_protos_stay_out_of_the_default_descriptor_pool() -> None:
    """tritonclient registers inference.* in the default pool; ours must not collide with it."""
    from serving.proto_gen.inference import POOL, grpc_service_pb2

    # Our definitions live in a private pool (the default one may hold tritonclient's by now).
    assert grpc_service_pb2.DESCRIPTOR.pool is POOL
    assert POOL is not descriptor_pool.Default()
    # A Triton-like definition in the default pool first, then our module: both must load.
    # A fresh interpreter, so the fake never meets a real tritonclient in this one.
    script = (
        "from google.protobuf import descriptor_pb2, descriptor_pool\n"
        "proto = descriptor_pb2.FileDescriptorProto(\n"
        "    name='grpc_service.proto', package='inference', syntax='proto3')\n"
        "message = proto.message_type.add(name='ModelInferRequest')\n"
        "message.field.add(name='model_name', number=1, type=9, label=1)\n"
        "descriptor_pool.Default().AddSerializedFile(proto.SerializeToString())\n"
        "from serving.proto_gen.inference import grpc_service_pb2\n"
        "print(grpc_service_pb2.ModelInferRequest(model_name='vit').model_name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "vit"


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


# --------------------------------------------------------------------------------------------
# attnserve.v1 messages: round trips
# --------------------------------------------------------------------------------------------

int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
float32s = st.floats(width=32, allow_nan=False)
OPTIONAL_FIELDS = ("length_penalty", "temperature", "top_p", "seed")


@st.composite
def decoding_options(draw: st.DrawFn) -> attnserve_pb2.DecodingOptions:
    """DecodingOptions with arbitrary values, each optional field set (0 included) or unset."""
    options = attnserve_pb2.DecodingOptions(
        max_new_tokens=draw(int32s),
        min_new_tokens=draw(int32s),
        beam_size=draw(int32s),
        top_k=draw(int32s),
        num_alternatives=draw(int32s),
    )
    for name in ("length_penalty", "temperature", "top_p"):
        value = draw(st.none() | st.just(0.0) | float32s)
        if value is not None:
            setattr(options, name, value)
    seed = draw(st.none() | st.just(0) | st.integers(min_value=0, max_value=2**64 - 1))
    if seed is not None:
        options.seed = seed
    return options


@st.composite
def translate_requests(draw: st.DrawFn) -> attnserve_pb2.TranslateRequest:
    """TranslateRequests with arbitrary texts and options (present or absent)."""
    request = attnserve_pb2.TranslateRequest(
        texts=draw(st.lists(st.text(max_size=40), max_size=6)),
        target_language=draw(st.sampled_from(["de", "fr", "es", ""]) | st.text(max_size=4)),
        model=draw(st.sampled_from(["", "translator"]) | st.text(max_size=12)),
        model_version=draw(st.sampled_from(["", "1"]) | st.text(max_size=4)),
    )
    options = draw(st.none() | decoding_options())
    if options is not None:
        request.options.CopyFrom(options)
    return request


@settings(max_examples=200, deadline=None)
@given(decoding_options())
def test_decoding_options_round_trip_keeps_values_and_presence(
    options: attnserve_pb2.DecodingOptions,
) -> None:
    parsed = attnserve_pb2.DecodingOptions.FromString(options.SerializeToString())
    assert parsed == options
    for name in OPTIONAL_FIELDS:
        # An explicit 0 must stay distinguishable from "unset".
        assert parsed.HasField(name) == options.HasField(name), name


@settings(max_examples=100, deadline=None)
@given(translate_requests())
def test_translate_request_round_trip(request: attnserve_pb2.TranslateRequest) -> None:
    parsed = attnserve_pb2.TranslateRequest.FromString(request.SerializeToString())
    assert parsed == request
    assert parsed.HasField("options") == request.HasField("options")
    assert parsed.SerializeToString(deterministic=True) == request.SerializeToString(
        deterministic=True
    )


def test_unset_optional_fields_differ_from_explicit_zero() -> None:
    unset = attnserve_pb2.DecodingOptions()
    zero = attnserve_pb2.DecodingOptions(temperature=0.0, top_p=0.0, seed=0, length_penalty=0.0)
    assert unset != zero
    assert zero.SerializeToString() != b""
    parsed = attnserve_pb2.DecodingOptions.FromString(zero.SerializeToString())
    assert all(parsed.HasField(name) for name in OPTIONAL_FIELDS)
    assert not any(unset.HasField(name) for name in OPTIONAL_FIELDS)
