"""ONNX translations of the project's PyTorch custom ops (``models.cache_ops``), at opset 24.

``torch.onnx.export(..., custom_translation_table=CUSTOM_TRANSLATIONS)`` emits each custom op as
the one standard ONNX op that does the same thing, so ONNX Runtime can run the in-place decoder
graph on a bound, preallocated cache.
"""

from __future__ import annotations

from typing import Any

import onnxscript
import torch

import models.cache_ops  # noqa: F401 - registers torch.ops.attnserve.*
from contract.graphs import INPLACE_OPSET

_OPSET = onnxscript.values.Opset("", INPLACE_OPSET)
_SEQUENCE_AXIS = 2  # (B, H, P, D): caches grow along P


def cache_write_onnx(cache: Any, update: Any, positions: Any) -> Any:
    """``TensorScatter``: each row's update written at its own position of the sequence axis."""
    return _OPSET.TensorScatter(cache, update, positions, axis=_SEQUENCE_AXIS)


def attend_prefix_onnx(query: Any, key: Any, value: Any, lengths: Any) -> Any:
    """``Attention`` with ``nonpad_kv_seqlen``: each row attends to its first ``lengths`` keys.

    The exporter gives the node every output of the op's schema; only the first is used, and
    ``export.onnx_export`` drops the unused optional ones (ONNX Runtime would otherwise copy
    the keys and values into them).
    """
    outputs = _OPSET.Attention(query, key, value, None, None, None, lengths)
    return outputs[0] if isinstance(outputs, list | tuple) else outputs


CUSTOM_TRANSLATIONS: dict[Any, Any] = {
    torch.ops.attnserve.cache_write.default: cache_write_onnx,
    torch.ops.attnserve.attend_prefix.default: attend_prefix_onnx,
}
