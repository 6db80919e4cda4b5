"""Batching of one-shot work (dynamic batching, Triton semantics)."""

from serving.batching.dynamic import DynamicBatcher

__all__ = ["DynamicBatcher"]
