"""Fuzzing: random or mutated protobuf bytes (valid messages of any method truncated, flipped
or extended) sent to every method of every service, unary and streaming."""

from __future__ import annotations

import grpc
from hypothesis import example, given
from hypothesis import strategies as st

from serving.kserve.tensors import encode_bytes
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from tests.reliability.fuzz.checker import ALLOWED, Fuzz, budget, check_stream_response
from tests.reliability.fuzz.strategies import IMAGE_POOL

GOOD_MESSAGES = [
    pb.TranslateRequest(texts=["three hundred"], target_language="de").SerializeToString(),
    pb.TranslateStreamRequest(text="doce", target_language="fr").SerializeToString(),
    pb.CaptionRequest(image=IMAGE_POOL[0]).SerializeToString(),
    pb.ClassifyRequest(image=IMAGE_POOL[0], top_k=2).SerializeToString(),
    pb.GetModelRequest(name="vit").SerializeToString(),
    kpb.ModelInferRequest(
        model_name="translator",
        inputs=[kpb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])],
        raw_input_contents=[encode_bytes([b"doce"])],
        parameters={"target_language": kpb.InferParameter(string_param="de")},
    ).SerializeToString(),
    kpb.ModelMetadataRequest(name="vit").SerializeToString(),
    kpb.SystemSharedMemoryRegisterRequest(
        name="r", key="/attnserve-fuzz-none", offset=0, byte_size=64
    ).SerializeToString(),
    kpb.TraceSettingRequest(
        model_name="vit",
        settings={"trace_level": kpb.TraceSettingRequest.SettingValue(value=["TIMESTAMPS"])},
    ).SerializeToString(),
    kpb.LogSettingsRequest(
        settings={"log_format": kpb.LogSettingsRequest.SettingValue(string_param="ISO8601")}
    ).SerializeToString(),
]
METHODS = [  # (method, shape): uu unary-unary, us unary-stream, ss stream-stream
    ("/attnserve.v1.AttnServe/Translate", "uu"),
    ("/attnserve.v1.AttnServe/TranslateStream", "us"),
    ("/attnserve.v1.AttnServe/Caption", "uu"),
    ("/attnserve.v1.AttnServe/CaptionStream", "us"),
    ("/attnserve.v1.AttnServe/Classify", "uu"),
    ("/attnserve.v1.AttnServe/ListModels", "uu"),
    ("/attnserve.v1.AttnServe/GetModel", "uu"),
    ("/inference.GRPCInferenceService/ServerLive", "uu"),
    ("/inference.GRPCInferenceService/ServerReady", "uu"),
    ("/inference.GRPCInferenceService/ModelReady", "uu"),
    ("/inference.GRPCInferenceService/ServerMetadata", "uu"),
    ("/inference.GRPCInferenceService/ModelMetadata", "uu"),
    ("/inference.GRPCInferenceService/ModelConfig", "uu"),
    ("/inference.GRPCInferenceService/ModelStatistics", "uu"),
    ("/inference.GRPCInferenceService/RepositoryIndex", "uu"),
    ("/inference.GRPCInferenceService/ModelInfer", "uu"),
    ("/inference.GRPCInferenceService/ModelStreamInfer", "ss"),
    ("/inference.GRPCInferenceService/SystemSharedMemoryStatus", "uu"),
    ("/inference.GRPCInferenceService/SystemSharedMemoryRegister", "uu"),
    ("/inference.GRPCInferenceService/SystemSharedMemoryUnregister", "uu"),
    ("/grpc.health.v1.Health/Check", "uu"),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "ss"),
    ("/inference.GRPCInferenceService/TraceSetting", "uu"),
    ("/inference.GRPCInferenceService/LogSettings", "uu"),
    ("/inference.GRPCInferenceService/RepositoryModelLoad", "uu"),
    ("/inference.GRPCInferenceService/RepositoryModelUnload", "uu"),
]

CONTROL_METHODS = {m for m, _ in METHODS[-2:]}
CONTROL_ALLOWED = ALLOWED | {grpc.StatusCode.FAILED_PRECONDITION}


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid message (of any method) truncated, flipped or extended."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    data = bytearray(draw(st.sampled_from(GOOD_MESSAGES)))
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.sampled_from(["cut", "flip", "insert"]))
        position = draw(st.integers(0, len(data)))
        if action == "cut":
            del data[position:]
        elif action == "flip" and position < len(data):
            data[position] = draw(st.integers(0, 255))
        else:
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def test_fuzz_raw_bytes_to_every_method(fuzz: Fuzz) -> None:
    @budget("raw_bytes")
    @given(method=st.sampled_from(METHODS), messages=st.lists(payloads(), min_size=1, max_size=3))
    @example(method=METHODS[0], messages=[b"\xff\xff\xff"])
    @example(method=METHODS[14], messages=[b"\x0a", b""])
    @example(method=METHODS[16], messages=[b"\x0a\x05\xff\xfe\xfd\xfc\xfb"])
    def run(method: tuple[str, str], messages: list[bytes]) -> None:
        name, shape = method
        call = fuzz.raw(name, shape)
        if shape == "uu":
            outcome = fuzz.call(lambda t: call(messages[0], timeout=t))
        elif shape == "us":
            outcome = fuzz.call(lambda t: list(call(messages[0], timeout=t)))
        else:
            outcome = fuzz.call(lambda t: list(call(iter(messages), timeout=t)))
        code, details, result = outcome
        # model control is off on the fuzz server: its RPCs say how to turn it on
        allowed = CONTROL_ALLOWED if name in CONTROL_METHODS else ALLOWED
        fuzz.check("raw_bytes", code, details, allowed, what=(name, messages))
        if name.endswith("ModelStreamInfer") and code == grpc.StatusCode.OK:
            for raw in result:
                check_stream_response(fuzz, kpb.ModelStreamInferResponse.FromString(raw))

    run()
    fuzz.assert_still_correct()
