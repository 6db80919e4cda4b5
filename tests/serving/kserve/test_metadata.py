"""KServe v2 health, metadata and config on a real server: ServerLive / ServerReady /
ModelReady, ServerMetadata, ModelMetadata and ModelConfig per task (our stub and an unmodified
tritonclient), and the FP16 classifier's signature."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

import grpc
import pytest

from contract.model_config import ClassifierConfig, ImageSpec
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.services.kserve import signature
from tests.serving.kserve.infer_requests import TIMEOUT
from tests.serving.server_thread import ServerThread


def test_live_ready_and_server_metadata(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready
    for name, version, ready in [
        ("vit", "", True),
        ("translator", "1", True),
        ("vit", "99", False),
        ("nope", "", False),
    ]:
        reply = stub.ModelReady(pb.ModelReadyRequest(name=name, version=version), timeout=TIMEOUT)
        assert reply.ready is ready, (name, version)
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert meta.name == "attnserve" and meta.version
    assert list(meta.extensions) == [
        "classification",
        "logging",
        "model_configuration",
        "parameters",
        "schedule_policy",
        "statistics",
        "system_shared_memory",
        "trace",
    ]


def _tensors(items: Iterable[Any]) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (t.datatype, list(t.shape)) for t in items}


def test_model_metadata_per_task(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Declared inputs as Triton declares them: one string per item is BYTES [-1,1]; the image
    models declare decoded RGB pixels (generated data is valid for them)."""
    vit = stub.ModelMetadata(pb.ModelMetadataRequest(name="vit"), timeout=TIMEOUT)
    assert vit.platform == "onnxruntime_onnx" and list(vit.versions) == ["1"]
    assert _tensors(vit.inputs) == {"image": ("UINT8", [-1, 32, 32, 3])}
    assert _tensors(vit.outputs) == {"probabilities": ("FP32", [-1, 10]), "label": ("BYTES", [-1])}
    tr = stub.ModelMetadata(pb.ModelMetadataRequest(name="translator"), timeout=TIMEOUT)
    assert _tensors(tr.inputs) == {
        "text": ("BYTES", [-1, 1]),
        "target_language": ("BYTES", [-1, 1]),
    }
    assert _tensors(tr.outputs) == {
        "translation": ("BYTES", [-1]),
        "token_ids": ("INT32", [-1, -1]),
    }
    cap = stub.ModelMetadata(pb.ModelMetadataRequest(name="captioner"), timeout=TIMEOUT)
    assert _tensors(cap.inputs) == {"image": ("UINT8", [-1, 48, 48, 3])}
    assert set(_tensors(cap.outputs)) == {"caption", "token_ids"}
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "vit" in err.value.details()


def test_model_config(stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread) -> None:
    vit_model = server.running.repository.get("vit")
    config = stub.ModelConfig(pb.ModelConfigRequest(name="vit"), timeout=TIMEOUT).config
    assert (config.name, config.platform, config.backend) == (
        "vit",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == vit_model.config.limits.max_batch_size
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = vit_model.config.batching
    assert config.dynamic_batching.max_queue_delay_microseconds == batching.max_queue_delay_us
    assert config.dynamic_batching.default_queue_policy.max_queue_size == batching.max_queue_size
    (image,) = config.input
    assert (image.name, image.data_type, list(image.dims)) == ("image", pb.TYPE_UINT8, [32, 32, 3])
    assert image.format == pb.ModelInput.FORMAT_NHWC and image.optional
    also = config.parameters["also_accepts"].string_value
    assert "'image' (BYTES [N,1])" in also and "'pixel_values' (FP32/FP16 [N,3,32,32])" in also
    assert not config.model_transaction_policy.decoupled
    translator = stub.ModelConfig(pb.ModelConfigRequest(name="translator"), timeout=TIMEOUT).config
    assert translator.model_transaction_policy.decoupled
    assert translator.parameters["languages"].string_value
    # a target prefix is accepted, not declared: perf_analyzer would fill it with random text
    assert "'target_prefix' (BYTES [N,1])" in translator.parameters["also_accepts"].string_value
    inputs = {i.name: (i.data_type, list(i.dims), i.optional) for i in translator.input}
    assert inputs == {
        "text": (pb.TYPE_STRING, [1], False),
        "target_language": (pb.TYPE_STRING, [1], True),
    }
    captioner = stub.ModelConfig(pb.ModelConfigRequest(name="captioner"), timeout=TIMEOUT).config
    assert captioner.model_transaction_policy.decoupled
    assert [(i.name, i.data_type, i.optional) for i in captioner.input] == [
        ("image", pb.TYPE_UINT8, False)
    ]


def test_fp16_classifier_advertises_fp16_pixels() -> None:
    config = ClassifierConfig(
        name="v16",
        precision="fp16",
        image=ImageSpec(size=8),
        labels=("a", "b"),
    )
    sig = signature(config)
    pixels = sig.input("pixel_values")
    assert pixels is not None and pixels.datatype == "FP16" and pixels.shape == (-1, 3, 8, 8)
    assert set(pixels.accepts) == {"FP16", "FP32"} and pixels not in sig.inputs
    assert sig.input_form("image", "UINT8").shape == (-1, 8, 8, 3)
    assert sig.output("probabilities").shape == (-1, 2)


# --- unmodified tritonclient ----------------------------------------------------------------------
def test_tritonclient_health_and_metadata(triton: tuple[ModuleType, Any]) -> None:
    _, client = triton
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("vit") and not client.is_model_ready("nope")
    assert client.get_server_metadata().name == "attnserve"
    meta = client.get_model_metadata("vit", as_json=True)
    assert {i["name"]: i["shape"] for i in meta["inputs"]}["image"] == ["-1", "32", "32", "3"]
    config = client.get_model_config("translator").config
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 32
