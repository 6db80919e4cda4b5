"""Token choice for generation: decoding options, per-row sampling and beam search (numpy only)."""

from serving.generation.beam import BeamSearch, Hypothesis
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler, filter_logits, log_softmax

__all__ = [
    "BeamSearch",
    "DecodingOptions",
    "Hypothesis",
    "RowSampler",
    "filter_logits",
    "log_softmax",
]
