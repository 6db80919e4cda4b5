"""The gauges of a model served by several engine instances, summed into the model's values."""

from __future__ import annotations

import threading


class GaugeBoard:
    """The model's gauges summed over its instances (each instance reports its own value)."""

    def __init__(self, instances: int) -> None:
        self._values: dict[str, list[float]] = {}
        self._instances = instances
        self._lock = threading.Lock()

    def update(self, instance: int, gauge: str, value: float) -> float:
        """Record ``instance``'s ``value`` of ``gauge``; returns the model's value: the sum, or
        for ``kv_cache_usage`` (a ratio of equal capacities) the mean."""
        with self._lock:
            values = self._values.setdefault(gauge, [0.0] * self._instances)
            values[instance] = value
            total = sum(values)
        return total / self._instances if gauge == "kv_cache_usage" else total
