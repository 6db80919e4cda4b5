"""What the protos tests compare our generated code with: the RPC tables of both services, every
field and enum of Triton's ``inference`` messages (transcribed from Triton's grpc_service.proto /
model_config.proto), descriptor rendering, a raw protobuf wire-format reader, the protos/generate.py
script as a module, and a ModelInferRequest with every field set."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from google.protobuf.descriptor import (
    Descriptor,
    FieldDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)

from serving.proto_gen.inference import grpc_service_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATE = REPO_ROOT / "protos" / "generate.py"

# name: (request, response, client streaming, server streaming)
ATTNSERVE_METHODS = {
    "Translate": ("TranslateRequest", "TranslateResponse", False, False),
    "TranslateStream": ("TranslateStreamRequest", "TranslateStreamResponse", False, True),
    "Caption": ("CaptionRequest", "CaptionResponse", False, False),
    "CaptionStream": ("CaptionRequest", "CaptionStreamResponse", False, True),
    "Classify": ("ClassifyRequest", "ClassifyResponse", False, False),
    "Score": ("ScoreRequest", "ScoreResponse", False, False),
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
    "ModelStatistics": ("ModelStatisticsRequest", "ModelStatisticsResponse", False, False),
    "RepositoryIndex": ("RepositoryIndexRequest", "RepositoryIndexResponse", False, False),
    **{
        f"RepositoryModel{rpc}": (
            f"RepositoryModel{rpc}Request",
            f"RepositoryModel{rpc}Response",
            False,
            False,
        )
        for rpc in ("Load", "Unload")
    },
    **{
        f"SystemSharedMemory{rpc}": (
            f"SystemSharedMemory{rpc}Request",
            f"SystemSharedMemory{rpc}Response",
            False,
            False,
        )
        for rpc in ("Status", "Register", "Unregister")
    },
    "TraceSetting": ("TraceSettingRequest", "TraceSettingResponse", False, False),
    "LogSettings": ("LogSettingsRequest", "LogSettingsResponse", False, False),
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
ModelStatisticsRequest name 1 string
ModelStatisticsRequest version 2 string
StatisticDuration count 1 uint64
StatisticDuration ns 2 uint64
InferStatistics success 1 StatisticDuration
InferStatistics fail 2 StatisticDuration
InferStatistics queue 3 StatisticDuration
InferStatistics compute_input 4 StatisticDuration
InferStatistics compute_infer 5 StatisticDuration
InferStatistics compute_output 6 StatisticDuration
InferStatistics cache_hit 7 StatisticDuration
InferStatistics cache_miss 8 StatisticDuration
ModelStatistics name 1 string
ModelStatistics version 2 string
ModelStatistics last_inference 3 uint64
ModelStatistics inference_count 4 uint64
ModelStatistics execution_count 5 uint64
ModelStatistics inference_stats 6 InferStatistics
ModelStatisticsResponse model_stats 1 repeated ModelStatistics
SystemSharedMemoryStatusRequest name 1 string
SystemSharedMemoryStatusResponse regions 1 map<string, SystemSharedMemoryStatusResponse.RegionStatus>
SystemSharedMemoryStatusResponse.RegionStatus name 1 string
SystemSharedMemoryStatusResponse.RegionStatus key 2 string
SystemSharedMemoryStatusResponse.RegionStatus offset 3 uint64
SystemSharedMemoryStatusResponse.RegionStatus byte_size 4 uint64
SystemSharedMemoryRegisterRequest name 1 string
SystemSharedMemoryRegisterRequest key 2 string
SystemSharedMemoryRegisterRequest offset 3 uint64
SystemSharedMemoryRegisterRequest byte_size 4 uint64
SystemSharedMemoryRegisterResponse
SystemSharedMemoryUnregisterRequest name 1 string
SystemSharedMemoryUnregisterResponse
TraceSettingRequest settings 1 map<string, TraceSettingRequest.SettingValue>
TraceSettingRequest model_name 2 string
TraceSettingRequest.SettingValue value 1 repeated string
TraceSettingResponse settings 1 map<string, TraceSettingResponse.SettingValue>
TraceSettingResponse.SettingValue value 1 repeated string
LogSettingsRequest settings 1 map<string, LogSettingsRequest.SettingValue>
LogSettingsRequest.SettingValue bool_param 1 bool
LogSettingsRequest.SettingValue uint32_param 2 uint32
LogSettingsRequest.SettingValue string_param 3 string
LogSettingsResponse settings 1 map<string, LogSettingsResponse.SettingValue>
LogSettingsResponse.SettingValue bool_param 1 bool
LogSettingsResponse.SettingValue uint32_param 2 uint32
LogSettingsResponse.SettingValue string_param 3 string
RepositoryIndexRequest repository_name 1 string
RepositoryIndexRequest ready 2 bool
RepositoryIndexResponse models 1 repeated RepositoryIndexResponse.ModelIndex
RepositoryIndexResponse.ModelIndex name 1 string
RepositoryIndexResponse.ModelIndex version 2 string
RepositoryIndexResponse.ModelIndex state 3 string
RepositoryIndexResponse.ModelIndex reason 4 string
ModelRepositoryParameter bool_param 1 bool
ModelRepositoryParameter int64_param 2 int64
ModelRepositoryParameter string_param 3 string
ModelRepositoryParameter bytes_param 4 bytes
RepositoryModelLoadRequest repository_name 1 string
RepositoryModelLoadRequest model_name 2 string
RepositoryModelLoadRequest parameters 3 map<string, ModelRepositoryParameter>
RepositoryModelLoadResponse
RepositoryModelUnloadRequest repository_name 1 string
RepositoryModelUnloadRequest model_name 2 string
RepositoryModelUnloadRequest parameters 3 map<string, ModelRepositoryParameter>
RepositoryModelUnloadResponse
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
ModelConfig response_cache 24 ModelResponseCache
ModelResponseCache enable 1 bool
"""  # noqa: E501 (one line per field, as the table reads)

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
