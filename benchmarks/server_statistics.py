"""A load point's figures as the server itself counts them: KServe ``ModelStatistics``.

attnserve and Triton both answer Triton's statistics RPC (cumulative counts and nanoseconds per
model). A snapshot before and after a point gives, per request of the point (its warm-up and any
repeat included), the server's own latency, the queue wait and the compute time, and the
requests per model execution: what the client's latency is made of, on either server, from the
same RPC.
"""

from __future__ import annotations

from typing import Any

import grpc

from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

TIMEOUT_S = 10.0


async def model_statistics(address: str, model: str) -> Any | None:
    """``model``'s statistics on the server at ``address`` (its highest version where it has
    several), or None where the server answers none."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        try:
            reply = await stub.ModelStatistics(
                kpb.ModelStatisticsRequest(name=model), timeout=TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            return None
    mine = [s for s in reply.model_stats if s.name == model]
    return max(mine, key=lambda s: int(s.version or 0)) if mine else None


def _mean_ms(after: Any, before: Any) -> float | None:
    count = after.count - before.count
    return round((after.ns - before.ns) / count / 1e6, 4) if count > 0 else None


def server_side(before: Any | None, after: Any | None) -> dict[str, Any] | None:
    """Per request between two snapshots: the server's latency of its successes, queue wait and
    compute time (each over its own count), and inferences per execution; None without both
    snapshots or without a success between them."""
    if before is None or after is None:
        return None
    b, a = before.inference_stats, after.inference_stats
    requests = a.success.count - b.success.count
    if requests <= 0:
        return None
    executions = after.execution_count - before.execution_count
    inferences = after.inference_count - before.inference_count
    return {
        "requests": requests,
        "latency_ms": _mean_ms(a.success, b.success),
        "queue_ms": _mean_ms(a.queue, b.queue),
        "compute_ms": _mean_ms(a.compute_infer, b.compute_infer),
        "inferences_per_execution": round(inferences / executions, 3) if executions > 0 else None,
    }
