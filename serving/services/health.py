"""grpc.health.v1 with a message on NOT_FOUND (the stock servicer aborts with empty details)."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2


class HealthServicer(health.aio.HealthServicer):
    """The stock aio health servicer; an unknown service name gets NOT_FOUND with the known ones."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        known = getattr(self, "_server_status", None)
        if isinstance(known, dict) and request.service not in known:
            names = ", ".join(repr(name) for name in sorted(known))
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no health status for service {request.service[:100]!r}; choose one of: {names}",
            )
        return await super().Check(request, context)
