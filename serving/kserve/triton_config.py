"""Triton's view of a served model: its ModelConfig, readiness and the server's version."""

from __future__ import annotations

import importlib.metadata
import json

from contract.model_config import ImageSpec, VersionPolicy
from serving.kserve.signature import TensorSpec, max_batch, platform, signature
from serving.kserve.tensors import BYTES
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedClassifier, ServedModel

SERVER_NAME = "attnserve"
CONFIG_TYPES = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    BYTES: pb.TYPE_STRING,
}
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def server_version() -> str:
    """The installed attnserve version (a placeholder when it is not installed)."""
    try:
        return importlib.metadata.version("attnserve")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def model_ready(model: ServedModel) -> bool:
    """Whether a model's scheduler is running."""
    return model.ready


def model_config(model: ServedModel) -> pb.ModelConfig:
    """The Triton model configuration of a served model."""
    c = model.config
    sig = signature(c)
    gpu = c.backend == "tensorrt" or any(
        p in GPU_PROVIDERS for p in c.onnxruntime.execution_providers
    )
    config = pb.ModelConfig(
        name=c.name,
        platform=platform(c),
        backend=c.backend,
        max_batch_size=max_batch(c),
        version_policy=version_policy(c.version_policy),
        input=[_config_input(spec) for spec in sig.inputs],
        output=[
            pb.ModelOutput(name=s.name, data_type=CONFIG_TYPES[s.datatype], dims=list(s.dims))
            for s in sig.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=f"{c.name}_0",
                count=c.batching.instances,
                kind=pb.ModelInstanceGroup.KIND_GPU if gpu else pb.ModelInstanceGroup.KIND_CPU,
            )
        ],
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=c.kind == "seq2seq"),
        response_cache=pb.ModelResponseCache(enable=c.response_cache),
    )
    config.dynamic_batching.CopyFrom(_dynamic_batching(model))
    for key, value in _parameters(model).items():
        config.parameters[key].string_value = value
    return config


def version_policy(policy: VersionPolicy | None) -> pb.ModelVersionPolicy:
    """A config.yaml's ``version_policy`` as Triton's (None: the newest version)."""
    if policy is None or policy.latest is not None:
        count = 1 if policy is None or policy.latest is None else policy.latest.num_versions
        return pb.ModelVersionPolicy(latest=pb.ModelVersionPolicy.Latest(num_versions=count))
    if policy.specific is not None:
        versions = list(policy.specific.versions)
        return pb.ModelVersionPolicy(specific=pb.ModelVersionPolicy.Specific(versions=versions))
    return pb.ModelVersionPolicy(all=pb.ModelVersionPolicy.All())


LAYOUTS = {"NCHW": pb.ModelInput.FORMAT_NCHW, "NHWC": pb.ModelInput.FORMAT_NHWC}


def _config_input(spec: TensorSpec) -> pb.ModelInput:
    return pb.ModelInput(
        name=spec.name,
        data_type=CONFIG_TYPES[spec.datatype],
        format=LAYOUTS.get(spec.layout, pb.ModelInput.FORMAT_NONE),
        dims=list(spec.dims),
        optional=spec.optional,
    )


def _dynamic_batching(model: ServedModel) -> pb.ModelDynamicBatching:
    """Triton's queue policy; generators batch in flight, so they have no queue delay."""
    b = model.config.batching
    # narrowed through the model (a classifier's batching has a queue delay), not through b
    delay = model.config.batching.max_queue_delay_us if isinstance(model, ServedClassifier) else 0
    return pb.ModelDynamicBatching(
        max_queue_delay_microseconds=delay,
        priority_levels=b.priority_levels,
        default_priority_level=b.default_priority_level,
        default_queue_policy=_queue_policy(b.timeout_ms, b.max_queue_size),
        priority_queue_policy={
            p.level: _queue_policy(p.timeout_ms, p.max_queue_size) for p in b.priority_queue_policy
        },
    )


def _queue_policy(timeout_ms: int, max_queue_size: int) -> pb.ModelQueuePolicy:
    return pb.ModelQueuePolicy(
        default_timeout_microseconds=timeout_ms * 1000,
        allow_timeout_override=True,
        max_queue_size=max_queue_size,
    )


def _parameters(model: ServedModel) -> dict[str, str]:
    """Facts of the model Triton's config has no field for, as string parameters."""
    c = model.config
    alternatives = signature(c).alternatives
    parameters = {
        "task": c.task,
        "kind": c.kind,
        "precision": c.precision,
        "version": str(model.version),
        "max_batch_size_per_call": str(c.batching.max_batch_size),
    }
    if alternatives:  # accepted instead of the declared inputs (see serving.kserve.signature)
        parameters["also_accepts"] = ", ".join(spec.describe() for spec in alternatives)
    if isinstance(model, ServedClassifier):
        if model.config.labels:
            parameters["labels"] = json.dumps(list(model.config.labels))
        image: ImageSpec | None = model.config.image
    else:
        generator = model.config
        parameters["in_flight_batching"] = str(generator.batching.in_flight).lower()
        parameters["max_active_sequences"] = str(generator.batching.max_active_sequences)
        parameters["max_new_tokens"] = str(generator.limits.max_new_tokens)
        parameters["max_source_length"] = str(generator.limits.max_source_length)
        if generator.languages:
            parameters["languages"] = ",".join(generator.languages)
        image = generator.image
    if image is not None:
        parameters["image_size"] = str(image.size)
        parameters["max_image_bytes"] = str(c.limits.max_image_bytes)
    return parameters
