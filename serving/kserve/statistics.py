"""KServe v2 / Triton ``ModelStatistics``, computed from the server's Prometheus series.

Triton keeps cumulative counts and durations per model version. attnserve reads the same
figures off the series its /metrics exposes (``serving.metrics``, by their ``model`` and
``version`` labels), through the registry /metrics serves: in a multi-process server every
process's values added up, so any frontend answers for the whole server and the two views never
disagree.

===============================  ==============================================================
ModelStatistics field            from
===============================  ==============================================================
inference_stats.success          ``attnserve_requests_total`` (count) and
                                 ``attnserve_request_seconds_total`` (ns) of the inference
                                 methods (``INFERENCE_METHODS``) with code OK
inference_stats.fail             the same with every other code
inference_stats.queue            ``attnserve_queue_duration_seconds`` (count, sum)
inference_stats.compute_infer    ``attnserve_request_compute_seconds_total``: the classifier's
                                 batched calls once per image in them; a generated request's
                                 time from its admission to its end (stage ``generation``);
                                 count: ``inference_count``
compute_input, compute_output    not measured apart: their time is inside compute_infer (the
                                 graph call binds and copies its inputs and outputs); count:
                                 ``inference_count``, 0 ns (perf_analyzer requires the three
                                 counts equal)
inference_count                  ``attnserve_batch_size_sum`` of the model's entry stage (the
                                 classifier's, or a generator's encoder): the requests or
                                 images its batched calls took in
execution_count                  ``attnserve_batch_size_count`` of that stage: its batched calls
last_inference                   ``attnserve_last_request_timestamp_seconds`` in milliseconds
inference_stats.cache_hit,       ``attnserve_response_cache_total`` (count) and
cache_miss                       ``attnserve_response_cache_seconds_total`` (ns) by result
===============================  ==============================================================
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from contract.model_config import ClassifierConfig
from serving.metrics import (
    BATCH_SIZE,
    INFERENCE_METHODS,
    LAST_REQUEST,
    QUEUE_DURATION,
    REQUEST_COMPUTE,
    REQUEST_SECONDS,
    REQUESTS,
    RESPONSE_CACHE,
    RESPONSE_CACHE_SECONDS,
)
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedModel

NS = 1e9


def series_totals(registry: CollectorRegistry) -> defaultdict[tuple[str, ...], float]:
    """The series ``ModelStatistics`` needs, summed in one pass over the registry's samples
    (every process's in multi-process mode), keyed (what, model, and the outcome or the sample
    suffix): ("requests" | "seconds", model, "OK" | "failed"), ("queue", model, "count" | "sum"),
    ("compute", model), ("batches", model, stage, "count" | "sum"), ("last", model); where
    ``model`` is the ``model`` and ``version`` labels as NAME/VERSION (``series_key``)."""
    totals: defaultdict[tuple[str, ...], float] = defaultdict(float)
    for family in registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            model = f"{labels.get('model', '')}/{labels.get('version', '')}"
            if name in (REQUESTS, REQUEST_SECONDS) and labels.get("method") in INFERENCE_METHODS:
                what = "requests" if name == REQUESTS else "seconds"
                totals[(what, model, "OK" if labels.get("code") == "OK" else "failed")] += value
            elif name in (QUEUE_DURATION + "_count", QUEUE_DURATION + "_sum"):
                totals[("queue", model, name.rsplit("_", 1)[1])] += value
            elif name == REQUEST_COMPUTE:
                totals[("compute", model)] += value
            elif name in (BATCH_SIZE + "_count", BATCH_SIZE + "_sum"):
                stage = labels.get("stage", "")
                totals[("batches", model, stage, name.rsplit("_", 1)[1])] += value
            elif name in (RESPONSE_CACHE, RESPONSE_CACHE_SECONDS):
                what = "cache" if name == RESPONSE_CACHE else "cache_seconds"
                totals[(what, model, labels.get("result", ""))] += value
            elif name == LAST_REQUEST:
                totals[("last", model)] = max(totals[("last", model)], value)
    return totals


def series_key(model: ServedModel) -> str:
    """How ``series_totals`` keys a served model's series: NAME/VERSION (names hold no /)."""
    return f"{model.name}/{model.version}"


def entry_stage(model: ServedModel) -> str:
    """The stage whose batched calls take in a model's requests."""
    return "classifier" if isinstance(model.config, ClassifierConfig) else "encoder"


def _duration(count: float, seconds: float) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=round(count), ns=round(seconds * NS))


Totals = dict[tuple[str, ...], float]


def _outcome(totals: Totals, model: str, outcome: str) -> pb.StatisticDuration:
    """The model's inference RPCs that ended ``outcome`` ("OK" / "failed"), and their latency."""
    return _duration(totals[("requests", model, outcome)], totals[("seconds", model, outcome)])


def _cached(totals: Totals, model: str, result: str) -> pb.StatisticDuration:
    """The model's response cache lookups that ended ``result`` ("hit" / "miss"), and their
    time."""
    return _duration(totals[("cache", model, result)], totals[("cache_seconds", model, result)])


def model_statistics(
    registry: CollectorRegistry, models: Iterable[ServedModel]
) -> list[pb.ModelStatistics]:
    """Triton's statistics of each of ``models`` from the series in ``registry``."""
    totals = series_totals(registry)
    out = []
    for model in models:
        name, stage = series_key(model), entry_stage(model)
        inferences = totals[("batches", name, stage, "sum")]
        stats = pb.InferStatistics(
            success=_outcome(totals, name, "OK"),
            fail=_outcome(totals, name, "failed"),
            queue=_duration(totals[("queue", name, "count")], totals[("queue", name, "sum")]),
            compute_input=_duration(inferences, 0.0),
            compute_infer=_duration(inferences, totals[("compute", name)]),
            compute_output=_duration(inferences, 0.0),
            cache_hit=_cached(totals, name, "hit"),
            cache_miss=_cached(totals, name, "miss"),
        )
        out.append(
            pb.ModelStatistics(
                name=model.name,
                version=str(model.version),
                last_inference=round(totals[("last", name)] * 1000),
                inference_count=round(inferences),
                execution_count=round(totals[("batches", name, stage, "count")]),
                inference_stats=stats,
            )
        )
    return out
