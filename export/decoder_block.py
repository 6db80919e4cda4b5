"""The decode block graph: K greedy steps of the in-place decoder in one ONNX Runtime run.

A batch-1 step on a GPU spends more time on the host (binding, the run call, the copies, the
token choice) than its kernels take (0.38-0.43 ms of GPU work in a 0.78 ms step on an H100,
2026-11-27), and the engine process of a served translator spends 0.3-0.4 ms of host time
between two device steps. vLLM's multi-step scheduling answers this by running several decode
steps per scheduler pass; this graph does it inside one run: the in-place decoder's nodes K
times, ``greedy_pick``'s nodes after each copy, each step's pick fed to the next step as its
token, so that the host pays for one run (one replayed CUDA graph) per K tokens.

    step j (0 .. K-1):  ids_j      = j == 0 ? input_ids : pick_{j-1}
                        lengths_j  = cache_lengths + j
                        past_j     = j == 0 ? past : present_{j-1}
                        logits_j, present_j = decoder_inplace(ids_j, lengths_j, cross, past_j)
                        pick_j     = greedy_pick(logits_j, no_eos = j < eos_after)

Every ``present_j`` is a graph output (``block_present_name``); bound to the buffer of its past,
each step's ``TensorScatter`` writes its key / value where it lies and the next step reads the
cache with it (no copies: ONNX Runtime skips the scatter's copy when input and output share
memory, as for the single step). The weights are the decoder's initializers, shared by the K
copies (the file holds them once).

The tokens a row chooses after its EOS are the block's own continuation, not what the server
returns: ``serving.engine`` keeps each row's tokens up to where it ends (EOS, its token limit, a
NaN) and rewinds the row's cache length to there, so a sequence decodes token for token as it
does step by step (``tests/export/test_decoder_block.py`` checks it against K single steps).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from contract.graphs import (
    BLOCK_EOS_AFTER,
    BLOCK_IDS,
    BLOCK_LOGIT,
    DECODER_BLOCK,
    DECODER_BLOCK_FILE,
    DECODER_INPLACE_FILE,
    GREEDY_EOS,
    GREEDY_SUPPRESSED,
    LOGITS,
    block_present_name,
    present_name,
)
from export.greedy_pick import pick_constants, pick_nodes

MIN_BLOCK_STEPS, MAX_BLOCK_STEPS = 2, 16  # export --decode-block K
# the graph's revision, in the manifest (``decoders.inplace.decode_block.revision``): 2 since
# unnamed nodes are named (revision 1 repeated names ONNX Runtime refuses)
BLOCK_REVISION = 2


def block_manifest(steps: int) -> dict[str, object]:
    """What ``manifest.json`` says of a decode block of ``steps`` steps."""
    return {
        "file": DECODER_BLOCK_FILE,
        "steps": steps,
        "revision": BLOCK_REVISION,
        "greedy_steps": "the in-place decoder and greedy_pick per step, in one run",
    }


def write_decode_block(version_dir: Path, steps: int) -> dict[str, object]:
    """Write ``decoder_block.onnx`` of ``steps`` steps beside the version's in-place decoder;
    returns what ``manifest.json`` says of it."""
    decoder = onnx.load(str(version_dir / DECODER_INPLACE_FILE))
    onnx.save(decoder_block_model(decoder, steps), str(version_dir / DECODER_BLOCK_FILE))
    return block_manifest(steps)


def decoder_block_model(decoder: onnx.ModelProto, steps: int) -> onnx.ModelProto:
    """The block graph of ``steps`` greedy steps over the in-place decoder ``decoder``
    (``contract.graphs`` documents its inputs and outputs)."""
    if not MIN_BLOCK_STEPS <= steps <= MAX_BLOCK_STEPS:
        raise ValueError(
            f"a decode block takes {MIN_BLOCK_STEPS}-{MAX_BLOCK_STEPS} steps, not {steps}"
        )
    graph = decoder.graph
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for a in n.attribute
    ):
        raise ValueError("the in-place decoder has subgraphs: a decode block cannot copy them")
    inputs = [i.name for i in graph.input]
    pasts = [name for name in inputs if name.startswith("past_")]
    presents = {present_name(name): name for name in pasts}
    missing = [p for p in presents if p not in {o.name for o in graph.output}]
    if missing or LOGITS not in {o.name for o in graph.output}:
        raise ValueError(f"the in-place decoder lacks the outputs {missing or [LOGITS]}")
    # names every copy shares: the graph's inputs and the weights
    shared = set(inputs) | {t.name for t in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    ids, lengths = "input_ids", "cache_lengths"
    current = {name: name for name in pasts}  # each past buffer as the next step reads it
    picks, logits_out = [], []
    value_info: list[onnx.ValueInfoProto] = []  # the shapes ONNX Runtime's fusions look for
    for step in range(steps):
        prefix = f"step{step}/"
        rename = {name: name for name in shared}
        rename["input_ids"], rename["cache_lengths"] = ids, lengths
        rename.update(current)
        for present, past in presents.items():
            rename[present] = block_present_name(past, step)
        rename[LOGITS] = f"{prefix}{LOGITS}"
        for index, node in enumerate(graph.node):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            # names are unique in a graph: an unnamed node (a rewrite's) gets its position's
            copy.name = f"{prefix}{node.name or f'node_{index}'}"
            copy.input[:] = [rename.get(n, f"{prefix}{n}") if n else n for n in node.input]
            outputs = []
            for name in node.output:
                if name not in rename:
                    rename[name] = f"{prefix}{name}"
                outputs.append(rename[name] if name else name)
            copy.output[:] = outputs
            nodes.append(copy)
        for info in [*graph.value_info, *(o for o in graph.output if o.name == LOGITS)]:
            if info.name in shared or info.name not in rename:
                continue
            copy_info = onnx.ValueInfoProto()
            copy_info.CopyFrom(info)
            copy_info.name = rename[info.name]
            value_info.append(copy_info)
        pick, best = f"{prefix}{BLOCK_IDS}", f"{prefix}{BLOCK_LOGIT}"
        nodes += [
            helper.make_node("Less", [f"block_step_{step}", BLOCK_EOS_AFTER], [f"{prefix}ban"]),
            helper.make_node("Reshape", [f"{prefix}ban", "block_rows_shape"], [f"{prefix}no_eos"]),
            *pick_nodes(rename[LOGITS], f"{prefix}no_eos", pick, best, prefix=f"{prefix}pick/"),
        ]
        picks.append(pick)
        logits_out.append(best)
        current = {past: block_present_name(past, step) for past in pasts}
        ids = pick
        if step + 1 < steps:
            lengths = f"cache_lengths_{step + 1}"
            nodes.append(
                helper.make_node("Add", ["cache_lengths", f"block_step_{step + 1}"], [lengths])
            )
    nodes += [
        helper.make_node("Concat", picks, [BLOCK_IDS], axis=1),
        helper.make_node("Concat", logits_out, [BLOCK_LOGIT], axis=1),
    ]
    constants = [
        *pick_constants(),
        *(helper.make_tensor(f"block_step_{j}", TensorProto.INT64, [], [j]) for j in range(steps)),
        helper.make_tensor("block_rows_shape", TensorProto.INT64, [3], [-1, 1, 1]),
    ]
    vocab = _logits_vocab(graph)
    by_name = {o.name: o for o in graph.output}
    outputs = [
        helper.make_tensor_value_info(BLOCK_IDS, TensorProto.INT64, ["batch", steps]),
        helper.make_tensor_value_info(BLOCK_LOGIT, TensorProto.FLOAT, ["batch", steps]),
    ]
    for step in range(steps):
        for present, past in presents.items():
            value = onnx.ValueInfoProto()
            value.CopyFrom(by_name[present])
            value.name = block_present_name(past, step)
            outputs.append(value)
    block = helper.make_graph(
        nodes,
        DECODER_BLOCK,
        [
            *graph.input,
            helper.make_tensor_value_info(GREEDY_SUPPRESSED, TensorProto.BOOL, [1, 1, vocab]),
            helper.make_tensor_value_info(GREEDY_EOS, TensorProto.BOOL, [1, 1, vocab]),
            helper.make_tensor_value_info(BLOCK_EOS_AFTER, TensorProto.INT64, ["batch"]),
        ],
        outputs,
        [*graph.initializer, *constants],
    )
    block.value_info.extend(value_info)
    model = helper.make_model(block, opset_imports=list(decoder.opset_import))
    model.ir_version = decoder.ir_version
    return model


def _logits_vocab(graph: onnx.GraphProto) -> int | str:
    """The logits' vocabulary size as the decoder declares it (a name where it is symbolic)."""
    (logits,) = [o for o in graph.output if o.name == LOGITS]
    if logits.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ValueError("the in-place decoder's logits are not float: greedy_pick reads float")
    last = logits.type.tensor_type.shape.dim[-1]
    return last.dim_value if last.HasField("dim_value") else last.dim_param or "vocab"
