"""The graph contract: which ONNX graphs a model version holds and the names of their tensors.

Export writes graphs with these names, serving feeds them, the TensorRT builder derives its
profiles from them. docs/architecture.md ("The graph contract") has the shapes:

encoder (translator): input_ids, attention_mask            [batch, source_length] int64
encoder (captioner):  pixel_values                         [batch, 3, H, W] float
   -> encoder_hidden_states [batch, source_length, d_model],
      cross_key.{i}, cross_value.{i} [batch, heads, source_length, head_dim] for every layer i
decoder: input_ids, position_ids [batch, new_tokens] int64,
         self_attention_mask [batch, past_length + new_tokens] int64 (1 = real token),
         cross_attention_mask [batch, source_length] int64,
         past_key.{i}, past_value.{i} [batch, heads, past_length, head_dim],
         cross_key.{i}, cross_value.{i}
   -> logits [batch, new_tokens, vocab], present_key.{i}, present_value.{i}
      [batch, heads, past_length + new_tokens, head_dim] (past + new, fed back as the next past)
classifier: pixel_values [batch, 3, H, W] -> logits [batch, classes]
"""

from __future__ import annotations

from typing import Literal

ENCODER, DECODER, CLASSIFIER = "encoder", "decoder", "model"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
CLASSIFIER_FILE = "model.onnx"
GRAPH_FILES = {ENCODER: ENCODER_FILE, DECODER: DECODER_FILE, CLASSIFIER: CLASSIFIER_FILE}

# torch turns scaled_dot_product_attention into the standard ONNX Attention op from this opset
# on; lower opsets get the decomposed MatMul / Softmax graph.
FUSED_ATTENTION_OPSET = 23
DEFAULT_OPSET = FUSED_ATTENTION_OPSET
MIN_OPSET, MAX_OPSET = 17, 24

TEXT_ENCODER_INPUTS = ("input_ids", "attention_mask")
IMAGE_INPUT = "pixel_values"
DECODER_STEP_INPUTS = ("input_ids", "position_ids", "self_attention_mask", "cross_attention_mask")
LOGITS = "logits"
ENCODER_STATES = "encoder_hidden_states"

ModelKind = Literal["seq2seq", "classifier"]


def graph_files(kind: ModelKind) -> dict[str, str]:
    """Graph name -> ONNX file of a model version of ``kind``.

    Returns:
        {"encoder": "encoder.onnx", "decoder": "decoder.onnx"} for seq2seq models,
        {"model": "model.onnx"} for classifiers.
    """
    if kind == "seq2seq":
        return {ENCODER: ENCODER_FILE, DECODER: DECODER_FILE}
    return {CLASSIFIER: CLASSIFIER_FILE}


def kv_names(prefix: str, num_layers: int) -> list[str]:
    """[prefix_key.0, prefix_value.0, prefix_key.1, ...]: the order the graphs flatten them.

    ``prefix`` is ``past`` / ``present`` (self-attention cache) or ``cross``.
    """
    return [f"{prefix}_{part}.{i}" for i in range(num_layers) for part in ("key", "value")]


def present_name(past_name: str) -> str:
    """The decoder output that becomes ``past_name`` on the next step."""
    return past_name.replace("past_", "present_", 1)


def encoder_output_names(num_layers: int) -> list[str]:
    return [ENCODER_STATES, *kv_names("cross", num_layers)]


def decoder_input_names(num_layers: int) -> list[str]:
    return [*DECODER_STEP_INPUTS, *kv_names("past", num_layers), *kv_names("cross", num_layers)]


def decoder_output_names(num_layers: int) -> list[str]:
    return [LOGITS, *kv_names("present", num_layers)]


# --- the in-place decoder: a fixed-capacity KV cache written where it lies ----------------------
#
# decoder_inplace: input_ids [batch, 1] int64, cache_lengths [batch] int64 (tokens already in each
#     row's cache: the new token's position and write index), cross_lengths [batch] int64 (real
#     source positions per row; sources are left-aligned), past_key.{i}, past_value.{i}
#     [batch, heads, capacity, head_dim], cross_key.{i}, cross_value.{i}
#     [batch, heads, source_capacity, head_dim]
#   -> logits [batch, 1, vocab], present_key.{i}, present_value.{i} [batch, heads, capacity,
#      head_dim]: the past with the new token written at cache_lengths. Bind each present to the
#      buffer of its past and ONNX Runtime writes in place (opset 24 TensorScatter + Attention
#      with nonpad_kv_seqlen).
# cache_copy: rows, source_rows [n] int64, past_key.{i} ... -> past_key.{i}_out ...: rows[j] of
#     every cache becomes a copy of source_rows[j] (beam search reorders its rows).
# cache_write: rows [n] int64, cross_key.{i} ... (buffers), new_cross_key.{i} ... [n, heads, S,
#     head_dim] -> cross_key.{i}_out ...: the new rows written (zero-padded to the buffers' width).
# cache_copy and cache_write (exports since 2026-11-27 evening) also take vector_scatter [1] bool:
#     true (on a GPU) scatters one vector per index, false (on the CPU) one row per index. ONNX
#     Runtime's CUDA ScatterND copies each index's slice in one thread, so whole rows there took
#     0.6-1.7 ms per buffer on an H100; its CPU kernel copies a slice as one memcpy and pays per
#     index, so rows are the CPU's faster way. Older exports scatter rows and lack the input.
# cache_resize: width [1] int64, buffer.{j} [n, heads, w, head_dim] for j < 2 * layers ->
#     buffer.{j}_out [n, heads, width, head_dim]: cut or zero-padded along axis 2. The server keeps
#     each cache as compact as its longest row needs (attention kernels read the whole bound
#     width) and re-lays it out through this graph when that width changes.
#
# With an int8 KV cache (export --kv-cache-dtype int8) every cache tensor is int8 with one fp32
# scale per cached vector (symmetric: value = int8 * scale), and the keys are stored transposed so
# that a step's scores are one int8 GEMM per row and head:
#     {past,cross}_key.{i} int8 [batch, heads, head_dim, width] + {name}_scale fp32 [.., 1, width]
#     {past,cross}_value.{i} int8 [batch, heads, width, head_dim] + {name}_scale fp32 [.., width, 1]
# The decoder and cache_write quantise what they write; cache_write takes the encoder's float
# cross keys / values; cache_resize / cache_copy treat the scales as four more buffers per layer.
DECODER_INPLACE, CACHE_COPY, CACHE_WRITE = "decoder_inplace", "cache_copy", "cache_write"
CACHE_RESIZE = "cache_resize"
DECODER_INPLACE_FILE = "decoder_inplace.onnx"
CACHE_COPY_FILE = "cache_copy.onnx"
CACHE_WRITE_FILE = "cache_write.onnx"
CACHE_RESIZE_FILE = "cache_resize.onnx"
INPLACE_GRAPH_FILES = {
    DECODER_INPLACE: DECODER_INPLACE_FILE,
    CACHE_COPY: CACHE_COPY_FILE,
    CACHE_WRITE: CACHE_WRITE_FILE,
    CACHE_RESIZE: CACHE_RESIZE_FILE,
}
INPLACE_OPSET = 24  # TensorScatter and Attention's nonpad_kv_seqlen
DECODER_INPLACE_STEP_INPUTS = ("input_ids", "cache_lengths", "cross_lengths")
# greedy_pick (exports since 2026-11-26; optional: older versions lack it and the server takes
#     the argmax on the host): logits [batch, 1, vocab] float, suppressed [1, 1, vocab] bool (ids
#     never chosen), eos [1, 1, vocab] bool (EOS one-hot), no_eos [batch, 1, 1] bool (rows that
#     may not end yet) -> greedy_ids [batch, 1] int64, the argmax of each row's allowed logits
#     (the lowest id on ties), greedy_logit [batch, 1] float, that logit: -inf where no token is
#     allowed, NaN where the row holds a NaN (or both infinities). Run on the decoder's device
#     over its logits, so that a greedy step copies ids to the host instead of the logits.
GREEDY_PICK, GREEDY_PICK_FILE = "greedy_pick", "greedy_pick.onnx"
GREEDY_SUPPRESSED, GREEDY_EOS, GREEDY_NO_EOS = "suppressed", "eos", "no_eos"
GREEDY_IDS, GREEDY_LOGIT = "greedy_ids", "greedy_logit"
# decoder_block (exports since 2026-11-28, with --decode-block K): K greedy steps in one run, the
#     in-place decoder's nodes K times with greedy_pick's between them, each step's pick fed to
#     the next as its token. Inputs: the in-place decoder's, and suppressed, eos (as greedy_pick),
#     eos_after [batch] int64 (step j of the block may choose EOS where j >= eos_after). Outputs:
#     block_ids [batch, K] int64, block_logit [batch, K] float (greedy_pick's per step), and
#     every step's caches, present_key.{i}.step{j} ...: bind them all to the buffer of their past
#     and each step writes in place, reading what the steps before it wrote. A row's tokens after
#     its EOS (or a NaN) are the block's own continuation: the caller keeps a row's tokens up to
#     where it ends and rewinds its cache length there (the positions written past it are
#     overwritten by the steps that follow).
DECODER_BLOCK, DECODER_BLOCK_FILE = "decoder_block", "decoder_block.onnx"
DEFAULT_BLOCK_STEPS = 4  # K of the block exports write unless --decode-block says (0: none)
BLOCK_IDS, BLOCK_LOGIT, BLOCK_EOS_AFTER = "block_ids", "block_logit", "eos_after"
OPTIONAL_INPLACE_GRAPH_FILES = {GREEDY_PICK: GREEDY_PICK_FILE, DECODER_BLOCK: DECODER_BLOCK_FILE}
ROWS, SOURCE_ROWS, WIDTH = "rows", "source_rows", "width"
VECTOR_SCATTER = "vector_scatter"


KV_CACHE_DTYPES = ("float", "int8")  # the in-place cache: the graphs' float type, or int8 + scales
# the in-place decoder's attention over a float cache: ONNX's Attention op, or keys x query, a
# masked Softmax, x values (export.matmul_attention: faster on the CPU)
DECODE_ATTENTIONS = ("fused", "matmul")


def default_decode_attention(precision: str, kv_cache_dtype: str) -> str:
    """The decode attention an export gets unless asked: ``matmul`` for int8 graphs with a float
    cache (int8 exports are for the CPU), ``fused`` for fp32 / fp16 (a GPU's fused kernels),
    ``int8`` with an int8 cache (its own integer MatMuls, ``export.kv_int8``; not a choice)."""
    if kv_cache_dtype == "int8":
        return "int8"
    return "matmul" if precision == "int8" else "fused"


def resize_buffer_names(count: int) -> list[str]:
    """The ``count`` buffer inputs of ``cache_resize`` (``cache_buffer_names`` order)."""
    return [f"buffer.{j}" for j in range(count)]


def scale_name(buffer_name: str) -> str:
    """The fp32 scales of an int8 cache buffer (one per cached vector)."""
    return f"{buffer_name}_scale"


def cache_buffer_names(prefix: str, num_layers: int, kv_dtype: str) -> list[str]:
    """Every cache tensor of ``prefix`` (``past`` / ``present`` / ``cross``) in graph order:
    key, value per layer; with an int8 cache key, key scale, value, value scale."""
    names = kv_names(prefix, num_layers)
    if kv_dtype != "int8":
        return names
    return [n for name in names for n in (name, scale_name(name))]


def is_scale(buffer_name: str) -> bool:
    """Whether ``buffer_name`` holds an int8 cache's scales (or is a graph's name for them)."""
    return buffer_name.endswith(scale_name(""))


def vector_size(buffer_name: str, head_dim: int) -> int:
    """Values per cached position: the head size, or 1 for an int8 cache's scales."""
    return 1 if is_scale(buffer_name) else head_dim


def width_axis(buffer_name: str, kv_dtype: str) -> int:
    """The axis positions run along: 3 for an int8 cache's (transposed) keys and key scales."""
    return 3 if kv_dtype == "int8" and "_key." in buffer_name else 2


def decoder_inplace_input_names(num_layers: int) -> list[str]:
    return [
        *DECODER_INPLACE_STEP_INPUTS,
        *kv_names("past", num_layers),
        *kv_names("cross", num_layers),
    ]


def block_present_name(past_name: str, step: int) -> str:
    """The ``decoder_block`` output of step ``step``'s ``past_name`` cache."""
    return f"{present_name(past_name)}.step{step}"


def written_name(buffer_name: str) -> str:
    """The output of a cache helper graph that is bound to input buffer ``buffer_name``."""
    return f"{buffer_name}_out"


def update_name(buffer_name: str) -> str:
    """The input of ``cache_write`` that holds the new rows for ``buffer_name``."""
    return f"new_{buffer_name}"
