"""KServe v2 / Triton ModelStatistics on a real server: requests, items and batched calls
counted as they happen, through both APIs, equal to what /metrics says; every model at once;
bad names and versions; an unmodified tritonclient reading them."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.images import encode_png, pixel_values
from serving.metrics import INFERENCE_METHODS
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as apb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import TIMEOUT, digit_images, infer_request, translate
from tests.serving.server_thread import ServerThread


def statistics(stub: pb_grpc.GRPCInferenceServiceStub, name: str) -> pb.ModelStatistics:
    reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=name), timeout=TIMEOUT)
    assert [s.name for s in reply.model_stats] == [name]
    return reply.model_stats[0]


def counts(stats: pb.ModelStatistics) -> dict[str, int]:
    """Every count of a model's statistics, by field."""
    s = stats.inference_stats
    return {
        "success": s.success.count,
        "fail": s.fail.count,
        "queue": s.queue.count,
        "compute_input": s.compute_input.count,
        "compute_infer": s.compute_infer.count,
        "compute_output": s.compute_output.count,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
    }


def delta(after: pb.ModelStatistics, before: pb.ModelStatistics) -> dict[str, int]:
    old = counts(before)
    return {k: v - old[k] for k, v in counts(after).items()}


def requests_in_metrics(server: ServerThread, model: str) -> tuple[float, float]:
    """(succeeded, failed) inference RPCs of ``model`` as /metrics counts them."""
    text = server.running.metrics.render().decode()
    ok = failed = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if s.name != "attnserve_requests_total" or labels["model"] != model:
                continue
            if labels["method"] in INFERENCE_METHODS:
                if labels["code"] == "OK":
                    ok += s.value
                else:
                    failed += s.value
    return ok, failed


def test_classifier_requests_items_and_batches_are_counted(
    stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread
) -> None:
    """Two KServe requests of 2 and 1 images, one attnserve Classify and one bad request: 3
    successes, 1 failure, 4 images inferred in 1-3 batched calls, each image queued once."""
    before = statistics(stub, "vit")
    started_ms = time.time() * 1000
    images = digit_images(3)
    for batch in (images[:2], images[2:]):
        request = infer_request("vit", ("pixel_values", "FP32", pixel_values(batch)))
        stub.ModelInfer(request, timeout=TIMEOUT)
    with grpc.insecure_channel(server.address) as channel:
        classify = apb.ClassifyRequest(model="vit", image=encode_png(images[0]))
        apb_grpc.AttnServeStub(channel).Classify(classify, timeout=TIMEOUT)
    wrong = infer_request("vit", ("pixel_values", "FP32", np.zeros((1, 3, 8, 8), np.float32)))
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(wrong, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = statistics(stub, "vit")
    moved = delta(after, before)
    assert 1 <= moved.pop("execution_count") <= 3
    assert moved == {
        "success": 3,
        "fail": 1,
        "queue": 4,
        "compute_input": 4,
        "compute_output": 4,
        "compute_infer": 4,
        "inference_count": 4,
    }
    s, b = after.inference_stats, before.inference_stats
    success_ns = s.success.ns - b.success.ns
    compute_ns = s.compute_infer.ns - b.compute_infer.ns
    # each image counts its batch's time, and no batch outlasts its request (2 images at most)
    assert 0 < compute_ns <= 2 * success_ns
    assert s.fail.ns > b.fail.ns and s.queue.ns >= b.queue.ns
    assert s.compute_input.ns == s.compute_output.ns == 0  # inside compute_infer
    assert started_ms <= after.last_inference <= time.time() * 1000
    assert (after.version, after.inference_stats.success.count) == ("1", s.success.count)
    assert requests_in_metrics(server, "vit") == (s.success.count, s.fail.count)


def test_generator_requests_count_each_text(
    stub: pb_grpc.GRPCInferenceServiceStub, server: ServerThread
) -> None:
    """A KServe request of 2 texts and an attnserve Translate of 1: 3 sequences through the
    encoder, each queued once; the decoder steps add to their compute time."""
    before = statistics(stub, "translator")
    stub.ModelInfer(translate([b"twelve", b"forty-two"], target_language="de"), timeout=TIMEOUT)
    with grpc.insecure_channel(server.address) as channel:
        request = apb.TranslateRequest(texts=["seven"], target_language="fr")
        apb_grpc.AttnServeStub(channel).Translate(request, timeout=TIMEOUT)
    after = statistics(stub, "translator")
    moved = delta(after, before)
    assert 1 <= moved.pop("execution_count") <= 3
    assert moved == {
        "success": 2,
        "fail": 0,
        "queue": 3,
        "compute_input": 3,
        "compute_output": 3,
        "compute_infer": 3,
        "inference_count": 3,
    }
    s, b = after.inference_stats, before.inference_stats
    # each sequence's time from its admission to its end, within its request's latency
    assert 0 < s.compute_infer.ns - b.compute_infer.ns <= 2 * (s.success.ns - b.success.ns)


def test_every_model_at_once_and_bad_names(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = stub.ModelStatistics(pb.ModelStatisticsRequest(), timeout=TIMEOUT)
    assert sorted((s.name, s.version) for s in reply.model_stats) == [
        ("captioner", "1"),
        ("translator", "1"),
        ("vit", "1"),
    ]
    assert statistics(stub, "captioner").name == "captioner"
    for request, code, message in [
        (pb.ModelStatisticsRequest(name="nope"), "NOT_FOUND", "no model named 'nope'"),
        (pb.ModelStatisticsRequest(name="vit", version="7"), "NOT_FOUND", "serves version 1"),
        (pb.ModelStatisticsRequest(version="1"), "INVALID_ARGUMENT", "without a model name"),
        (pb.ModelStatisticsRequest(name="../x"), "INVALID_ARGUMENT", "is not a model name"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelStatistics(request, timeout=TIMEOUT)
        assert err.value.code().name == code, err.value.details()
        assert message in err.value.details()


def test_tritonclient_reads_the_statistics(
    triton: tuple[ModuleType, Any], stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    _, client = triton
    stub.ModelInfer(
        infer_request("vit", ("pixel_values", "FP32", pixel_values(digit_images(1)))),
        timeout=TIMEOUT,
    )
    ours = statistics(stub, "vit")
    theirs = client.get_inference_statistics("vit", as_json=True)["model_stats"]
    assert [(s["name"], s["version"]) for s in theirs] == [("vit", "1")]
    # tritonclient's JSON writes uint64 as strings; no request ran in between
    assert int(theirs[0]["inference_count"]) == ours.inference_count
    success = theirs[0]["inference_stats"]["success"]
    assert int(success["count"]) == ours.inference_stats.success.count
