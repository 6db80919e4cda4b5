"""Running a checked request: generation or classification of every element, one response."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from serving.engine.requests import GenerationRequest
from serving.errors import InvalidArgument
from serving.gather import gather_or_cancel
from serving.generation.options import DecodingOptions
from serving.kserve.parameters import decoding_options
from serving.kserve.request import (
    Call,
    Wanted,
    each,
    element_pixels,
    prefixes,
    target_languages,
    utf8,
    word_lists,
)
from serving.kserve.shared_memory import BYTE_SIZE, OFFSET, REGION, Slice
from serving.kserve.signature import PREFIX_INPUT, SCORE_INPUT, WORD_INPUTS
from serving.kserve.tensors import BYTES, output_tensor
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.scoring import ScoreItem
from serving.served import Generated, LabelScore, ServedClassifier, ServedGenerator
from serving.served.generator import generate_all

ALL_CLASSES = 1 << 30  # top_k that makes ServedClassifier.classify return every class
TEXT_OUTPUT = {"translation": "translation", "captioning": "caption"}
# with the ``return_log_probs`` parameter: each token's log-probability, FP32 [N, T] (0 where
# ``token_ids`` pads), after the requested outputs (an output of no declared signature)
LOG_PROBS_OUTPUT = "token_log_probs"
# with the ``num_alternatives`` parameter: each element's beam runner-ups or further samples,
# BYTES [N, A] ("" where an element has fewer), and their scores, FP32 [N, A] (beam scores, or
# the samples' log-probability sums with ``return_log_probs``; NaN where missing, 0 unscored)
ALTERNATIVES_OUTPUT = "alternatives"
ALTERNATIVE_SCORES_OUTPUT = "alternative_scores"
# with the ``top_log_probs`` parameter k: each position's k most likely tokens, INT32 [N, T, k]
# (-1 where ``token_ids`` pads or fewer were possible), and their log-probabilities, FP32
# [N, T, k] (NaN there)
TOP_IDS_OUTPUT = "top_token_ids"
TOP_LOG_PROBS_OUTPUT = "top_log_probs"
# a scored request (input ``target``): each target's EOS log-probability after it, FP32 [N],
# and its score (its tokens' log-probabilities and EOS's summed), FP32 [N]
EOS_LOG_PROB_OUTPUT = "eos_log_prob"
SCORE_OUTPUT = "score"
# outputs of no declared signature, added after the requested ones when the request asks for them
EXTRA_OUTPUTS = (
    LOG_PROBS_OUTPUT,
    EOS_LOG_PROB_OUTPUT,
    SCORE_OUTPUT,
    ALTERNATIVES_OUTPUT,
    ALTERNATIVE_SCORES_OUTPUT,
    TOP_IDS_OUTPUT,
    TOP_LOG_PROBS_OUTPUT,
)
Outputs = dict[str, tuple[str, Any]]  # output name -> (datatype, values)


def generation_jobs(call: Call, model: ServedGenerator) -> list[GenerationRequest]:
    """One validated generation request per element (nothing is queued yet)."""
    options = replace(decoding_options(call.request.parameters), **word_lists(call))
    model.options(options)  # once, so an option error does not name an element
    starts = prefixes(call)
    if model.config.task == "translation":
        texts = utf8(call.inputs["text"])
        languages = target_languages(call, model.config.languages)
        return each(
            call,
            lambda i: model.request(
                options,
                source_ids=model.source_ids(texts[i], languages[i]),
                timeout_s=call.timeout_s,
                priority=call.priority,
                prefix=model.prefix_ids(starts[i]),
            ),
        )
    pixels = element_pixels(call)
    return each(
        call,
        lambda i: model.request(
            options,
            pixels=pixels[i],
            timeout_s=call.timeout_s,
            priority=call.priority,
            prefix=model.prefix_ids(starts[i]),
        ),
    )


def _token_matrix(sequences: list[list[int]]) -> np.ndarray:
    return _padded(sequences, -1, np.int32)


def _padded(sequences: list[list[Any]], fill: float, dtype: type) -> np.ndarray:
    width = max((len(s) for s in sequences), default=0)
    matrix: np.ndarray = np.full((len(sequences), width), fill, dtype=dtype)
    for row, values in enumerate(sequences):
        matrix[row, : len(values)] = values
    return matrix


async def generate(call: Call, model: ServedGenerator) -> Outputs:
    """Run every element of a translation / captioning request to the end."""
    jobs = generation_jobs(call, model)
    results = await generate_all(model.generate, jobs)
    outputs: Outputs = {
        TEXT_OUTPUT[model.config.task]: (BYTES, [r.text.encode() for r in results]),
        "token_ids": ("INT32", _token_matrix([r.token_ids for r in results])),
    }
    if jobs and jobs[0].options.return_log_probs:
        log_probs = [r.token_log_probs or [] for r in results]
        outputs[LOG_PROBS_OUTPUT] = ("FP32", _padded(log_probs, 0.0, np.float32))
    if jobs and jobs[0].options.num_alternatives:
        outputs.update(_alternatives(results))
    if jobs and jobs[0].options.top_log_probs:
        outputs.update(_top_log_probs(results, jobs[0].options.top_log_probs))
    return outputs


async def score(call: Call, model: ServedGenerator) -> Outputs:
    """Score every element's ``target`` after its source (``ServedGenerator.score``): the text
    output holds the targets, ``token_ids`` their tokens, then each token's log-probability,
    EOS's and the score."""
    decoded = [PREFIX_INPUT[model.config.task], *WORD_INPUTS]
    if decoding_options(call.request.parameters) != DecodingOptions() or any(
        name in call.inputs for name in decoded
    ):
        raise InvalidArgument(
            f"input {SCORE_INPUT!r} scores given targets, nothing is decoded: send no decoding "
            f"parameters and no {', '.join(repr(n) for n in decoded)} with it"
        )
    targets = utf8(call.inputs[SCORE_INPUT])
    if model.config.task == "translation":
        texts = utf8(call.inputs["text"])
        languages = target_languages(call, model.config.languages)
        sources = each(call, lambda i: model.source_ids(texts[i], languages[i]))
    else:
        sources = element_pixels(call)
    items = each(call, lambda i: ScoreItem(sources[i], model.target_ids(targets[i])))
    scored = await model.score(items, call.timeout_s, call.priority)
    return {
        TEXT_OUTPUT[model.config.task]: (BYTES, [t.encode() for t in targets]),
        "token_ids": ("INT32", _token_matrix([item.target.tolist() for item in items])),
        LOG_PROBS_OUTPUT: (
            "FP32",
            _padded([list(s.log_probs[:-1]) for s in scored], 0.0, np.float32),
        ),
        EOS_LOG_PROB_OUTPUT: ("FP32", np.array([s.log_probs[-1] for s in scored], np.float32)),
        SCORE_OUTPUT: ("FP32", np.array([s.score for s in scored], np.float32)),
    }


def _top_log_probs(results: list[Generated], count: int) -> Outputs:
    """``TOP_IDS_OUTPUT`` and ``TOP_LOG_PROBS_OUTPUT`` of the elements' results."""
    width = max(len(r.token_ids) for r in results)
    ids = np.full((len(results), width, count), -1, dtype=np.int32)
    values = np.full((len(results), width, count), np.nan, dtype=np.float32)
    for row, result in enumerate(results):
        for position, (top_ids, top_values) in enumerate(result.top_log_probs or ()):
            ids[row, position, : len(top_ids)] = top_ids
            values[row, position, : len(top_values)] = top_values
    return {TOP_IDS_OUTPUT: ("INT32", ids), TOP_LOG_PROBS_OUTPUT: ("FP32", values)}


def _alternatives(results: list[Generated]) -> Outputs:
    """``ALTERNATIVES_OUTPUT`` and ``ALTERNATIVE_SCORES_OUTPUT`` of the elements' results."""
    width = max(len(r.alternatives) for r in results)
    texts = np.full((len(results), width), b"", dtype=object)
    scores = np.full((len(results), width), np.nan, dtype=np.float32)
    for row, result in enumerate(results):
        for column, alternative in enumerate(result.alternatives):
            texts[row, column] = alternative.text.encode()
            scores[row, column] = alternative.score
    return {ALTERNATIVES_OUTPUT: (BYTES, texts), ALTERNATIVE_SCORES_OUTPUT: ("FP32", scores)}


async def classify(call: Call, model: ServedClassifier) -> Outputs:
    """Every element through the model's dynamic batcher; full probabilities and top-1 label."""
    pixels = element_pixels(call)
    scores: list[list[LabelScore]] = await gather_or_cancel(
        model.classify(p, ALL_CLASSES, timeout_s=call.timeout_s, priority=call.priority)
        for p in pixels
    )
    classes = max(len(s) for s in scores)
    probabilities = np.zeros((call.batch, classes), dtype=np.float32)
    for row, labels in enumerate(scores):
        for score in labels:
            probabilities[row, score.index] = score.score
    return {
        "probabilities": ("FP32", probabilities),
        "label": (BYTES, [labels[0].label.encode() for labels in scores]),
    }


def _classification(values: np.ndarray, top_k: int, labels: tuple[str, ...]) -> np.ndarray:
    """Triton's classification output: "score:index[:label]" strings of the top k per row."""
    rows = np.asarray(values).reshape(values.shape[0], -1)
    k = min(top_k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        for c, index in enumerate(np.argsort(-row, kind="stable")[:k]):
            text = f"{float(row[index]):f}:{int(index)}"
            if index < len(labels):
                text += f":{labels[index]}"
            out[r, c] = text.encode()
    return out


def parameter(value: bool | int | str) -> pb.InferParameter:
    """A response parameter holding ``value`` in the field of its type."""
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    return pb.InferParameter(string_param=value)


def build_response(
    call: Call, outputs: Outputs, parameters: dict[str, bool | int | str] | None = None
) -> pb.ModelInferResponse:
    """The response holding the requested outputs (raw contents), in the requested order."""
    model = call.model
    labels = model.config.labels if isinstance(model, ServedClassifier) else ()
    response = pb.ModelInferResponse(
        model_name=model.name, model_version=str(model.version), id=call.request.id
    )
    extra = tuple(Wanted(name) for name in EXTRA_OUTPUTS if name in outputs)
    for wanted in (*call.wanted, *extra):
        datatype, values = outputs[wanted.name]
        if wanted.classification:
            datatype = BYTES
            values = _classification(values, wanted.classification, labels)
        header, raw = output_tensor(wanted.name, datatype, values)
        if wanted.shared is not None:
            write_shared(call, wanted.shared, header, raw)
            raw = b""  # Triton's layout: an empty raw entry, so entries still match outputs
        response.outputs.append(header)  # a copy: after the header is complete
        response.raw_output_contents.append(raw)
    for key, value in (parameters or {}).items():
        response.parameters[key].CopyFrom(parameter(value))
    return response


def write_shared(call: Call, piece: Slice, header: Any, raw: bytes) -> None:
    """Write an output into its shared memory; its header's parameters say where and how many
    bytes were written (Triton's header says neither; the shape alone does not size BYTES)."""
    assert call.regions is not None  # a slice is only accepted with the extension on
    call.regions.write(piece, raw, f"output {header.name!r}")
    header.parameters[REGION].string_param = piece.region.name
    header.parameters[BYTE_SIZE].int64_param = len(raw)
    if piece.offset:
        header.parameters[OFFSET].int64_param = piece.offset


async def infer(call: Call) -> pb.ModelInferResponse:
    """Run a whole request and build its single response."""
    model = call.model
    if isinstance(model, ServedClassifier):
        return build_response(call, await classify(call, model))
    if SCORE_INPUT in call.inputs:
        return build_response(call, await score(call, model))
    return build_response(call, await generate(call, model))
