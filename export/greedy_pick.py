"""The greedy pick graph: each row's greedy token and its logit, computed where the logits lie.

A decode step on a GPU copied every row's logits to the host to take their argmax there:
[rows, vocab] floats each step (8 MB at 256 rows of an 8,000-token vocabulary). With this graph
run on the decoder's device over its logits, a step where every row decodes greedily copies
[rows] ids and [rows] logits instead; the full logits stay on the device unless a row's sampler
needs them (a NaN).

The tokens a row may not choose are masked first, as the server's sampler masks them: the
model's suppressed ids always (``suppressed``, one-hot over the vocabulary), EOS where the row
has not yet generated its ``min_new_tokens`` (``no_eos`` per row, ``eos`` one-hot):

    allowed      = Where(suppressed | (eos & no_eos), -inf, logits)
    greedy_ids   = ArgMax(allowed, axis=-1, keepdims=0)              lowest id on ties
    greedy_logit = Where(IsNaN(ReduceSum(logits)), NaN, ReduceMax(allowed))

A row whose allowed logits are all -inf gets -inf (the server then ends it with EOS, as the
sampler does); a row holding a NaN gets NaN (the sampler decides from the logits).

It is a graph of its own, not outputs of the decoder: ONNX Runtime runs every node of a graph
whatever outputs are bound, and its CPU ArgMax is slow (batch 256 x 8,000: 1.7 ms against
0.2 ms for numpy's, 2-core AMD EPYC, 2026-11-26), so on the CPU the server takes the argmax on
the host and the decoder step costs what it did.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from contract.graphs import (
    GREEDY_EOS,
    GREEDY_IDS,
    GREEDY_LOGIT,
    GREEDY_NO_EOS,
    GREEDY_PICK,
    GREEDY_SUPPRESSED,
    LOGITS,
)

PICK_OPSET = 18  # ReduceMax / ReduceSum with axes as an input


def pick_nodes(
    logits: str, no_eos: str, ids: str, logit: str, prefix: str = ""
) -> list[onnx.NodeProto]:
    """The pick's nodes over ``logits`` with the rows' EOS ban ``no_eos`` ([batch, 1, 1] bool),
    writing ``ids`` and ``logit``; intermediate names start with ``prefix``. They read the
    initializers ``pick_constants`` makes and the inputs ``suppressed`` and ``eos``."""
    p = prefix
    return [
        helper.make_node("And", [GREEDY_EOS, no_eos], [f"{p}eos_banned"]),
        helper.make_node("Or", [GREEDY_SUPPRESSED, f"{p}eos_banned"], [f"{p}banned"]),
        helper.make_node("Where", [f"{p}banned", "pick_minus_inf", logits], [f"{p}allowed"]),
        helper.make_node("ArgMax", [f"{p}allowed"], [ids], axis=2, keepdims=0),
        helper.make_node("ReduceMax", [f"{p}allowed", "pick_axes"], [f"{p}max"], keepdims=0),
        helper.make_node("ReduceSum", [logits, "pick_axes"], [f"{p}sum"], keepdims=0),
        helper.make_node("IsNaN", [f"{p}sum"], [f"{p}has_nan"]),
        helper.make_node("Where", [f"{p}has_nan", "pick_nan", f"{p}max"], [logit]),
    ]


def pick_constants() -> list[onnx.TensorProto]:
    """The initializers ``pick_nodes`` reads."""
    return [
        helper.make_tensor("pick_axes", TensorProto.INT64, [1], [2]),
        helper.make_tensor("pick_nan", TensorProto.FLOAT, [], [float("nan")]),
        helper.make_tensor("pick_minus_inf", TensorProto.FLOAT, [], [float("-inf")]),
    ]


def greedy_pick_model() -> onnx.ModelProto:
    """``contract.graphs`` documents the inputs and outputs (``greedy_pick``)."""
    nodes = pick_nodes(LOGITS, GREEDY_NO_EOS, GREEDY_IDS, GREEDY_LOGIT)
    graph = helper.make_graph(
        nodes,
        GREEDY_PICK,
        [
            helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["batch", 1, "vocab"]),
            helper.make_tensor_value_info(GREEDY_SUPPRESSED, TensorProto.BOOL, [1, 1, "vocab"]),
            helper.make_tensor_value_info(GREEDY_EOS, TensorProto.BOOL, [1, 1, "vocab"]),
            helper.make_tensor_value_info(GREEDY_NO_EOS, TensorProto.BOOL, ["batch", 1, 1]),
        ],
        [
            helper.make_tensor_value_info(GREEDY_IDS, TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info(GREEDY_LOGIT, TensorProto.FLOAT, ["batch", 1]),
        ],
        pick_constants(),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", PICK_OPSET)])
    # as the cache graphs: an IR version every supported ONNX Runtime reads (a newer onnx package
    # writes its own, e.g. 14, which onnxruntime-gpu 1.31 refuses)
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model
