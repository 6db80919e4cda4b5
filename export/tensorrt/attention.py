"""The attention layers of a parsed network: finding them, grouping them, allowing decomposition.

TensorRT's ONNX parser (TensorRT >= 10.14, TensorRT-RTX) turns each ONNX ``Attention`` node into
an ``IAttention``: a pair of ``ATTENTION_INPUT`` / ``ATTENTION_OUTPUT`` layers whose
``attention`` property is the ``IAttention``. An ``IAttention`` is not decomposable by default,
so a build fails ("Attention operation was not supported by a dedicated kernel") when no fused
kernel fits it, e.g. fp32 attention over a fixed sequence (the ViT, the encoders) or head sizes
below 16. ``IAttention.decomposable = True`` lets the builder fall back to MatMul / Softmax for
that layer; an attention layer that builds while not decomposable has a dedicated fused kernel.

``network.get_layer(i)`` returns the base ``ILayer`` for these layer types; the bindings' own
subclass is reached by setting the Python object's ``__class__`` (the downcast idiom of
TensorRT's Python tools). Nothing here imports TensorRT: the module comes in as ``trt``.
"""

from __future__ import annotations

from typing import Any

# Substrings of the builder error that says an attention layer has no fused kernel.
NO_KERNEL_MARKERS = ("not supported by a dedicated kernel", "setdecomposable", "is_decomposable")


def attention_layers(trt: Any, network: Any) -> list[Any]:
    """The ``IAttention`` of every ``ATTENTION_INPUT`` layer, in network order.

    Args:
        trt: the TensorRT module (either flavour).
        network: a parsed ``INetworkDefinition``.

    Returns:
        the ``IAttention`` objects (each with ``name``, ``decomposable``, ``get_input``).
    """
    found = []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type != trt.LayerType.ATTENTION_INPUT:
            continue
        if not isinstance(layer, trt.IAttentionInputLayer):
            layer.__class__ = trt.IAttentionInputLayer  # downcast the ILayer proxy
        found.append(layer.attention)
    return found


def attention_names(attentions: list[Any]) -> list[str]:
    """Names of ``attentions`` (the ONNX node names), made unique with "#n" suffixes.

    Args:
        attentions: from ``attention_layers``.

    Returns:
        one name per attention layer, in the same order.
    """
    names: list[str] = []
    for attention in attentions:
        name = str(attention.name) or "attention"
        names.append(name if name not in names else f"{name}#{len(names)}")
    return names


def signature(attention: Any) -> str:
    """What decides whether a fused kernel fits: query / key shapes and type, mask, causality.

    Args:
        attention: an ``IAttention``.

    Returns:
        e.g. "q DataType.FLOAT (-1, 4, 17, 48), k (-1, 4, 17, 48), mask None, CausalMaskKind.NONE".
    """
    query, key = attention.get_input(0), attention.get_input(1)
    mask = attention.mask
    mask_shape = tuple(mask.shape) if mask is not None else None
    causal = getattr(attention, "causal_kind", getattr(attention, "causal", None))
    return (
        f"q {query.dtype} {tuple(query.shape)}, k {tuple(key.shape)}, mask {mask_shape}, {causal}"
    )


def groups(attentions: list[Any]) -> dict[str, list[int]]:
    """Indices of ``attentions`` by ``signature`` (one group per kind: self, cross, encoder).

    Args:
        attentions: from ``attention_layers``.

    Returns:
        signature -> indices, in order of first appearance.
    """
    grouped: dict[str, list[int]] = {}
    for index, attention in enumerate(attentions):
        grouped.setdefault(signature(attention), []).append(index)
    return grouped


def set_decomposable(attentions: list[Any], decomposable: set[int]) -> None:
    """Allow decomposition for the layers in ``decomposable``, forbid it for the others.

    Args:
        attentions: from ``attention_layers``.
        decomposable: indices into ``attentions``.
    """
    for index, attention in enumerate(attentions):
        attention.decomposable = index in decomposable


def lacks_kernel(message: str) -> bool:
    """Whether a build error says an attention layer had no fused kernel and was not decomposable.

    Args:
        message: the builder's logged errors.

    Returns:
        True for TensorRT's "not supported by a dedicated kernel ... setDecomposable" error.
    """
    text = message.lower()
    return any(marker in text for marker in NO_KERNEL_MARKERS)
