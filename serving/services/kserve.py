"""The KServe v2 / Triton inference protocol (``inference.GRPCInferenceService``).

Unmodified Triton and KServe clients (``tritonclient.grpc``, perf_analyzer) talk to the served
models through this servicer. Tensor contract per model task (N = batch, the first dimension):

=============== ========================= ======= =============== ==============================
task            tensor                    type    shape           notes
=============== ========================= ======= =============== ==============================
classification  in  ``pixel_values``      FP32    [N,3,S,S]       normalised pixels; FP16 for an
                                                                  fp16 model (both accepted)
                in  ``image``             BYTES   [N]             PNG / JPEG; instead of pixels
                out ``probabilities``     FP32    [N,C]           softmax over the C labels
                out ``label``             BYTES   [N]             top-1 label
translation     in  ``text``              BYTES   [N]             UTF-8 source texts
                in  ``target_language``   BYTES   [N] or [1]      optional: or request parameter
                                                                  ``target_language`` (string)
                out ``translation``       BYTES   [N]             UTF-8
                out ``token_ids``         INT32   [N,T]           padded with -1
captioning      in  ``image``             BYTES   [N]             PNG / JPEG
                out ``caption``           BYTES   [N]             UTF-8
                out ``token_ids``         INT32   [N,T]           padded with -1
=============== ========================= ======= =============== ==============================

BYTES inputs of shape [N,1] are accepted as [N]. Request parameters of the generating models:
``max_new_tokens``, ``min_new_tokens``, ``beam_size``, ``length_penalty``, ``temperature``,
``top_k``, ``top_p``, ``seed`` (int64 / double; numeric strings too). Every model honours Triton's
``timeout`` parameter (microseconds) besides the gRPC deadline. A requested output with the
``classification`` parameter k (tritonclient's ``class_count``) comes back as BYTES [N,k] of
"score:index:label", as Triton does.

``ModelStreamInfer`` is decoupled-style: a translation or captioning request of one element gets one
response per generated token (the text delta in the text output, its ids in ``token_ids``,
parameters ``index`` and ``final`` false), then a last response with an empty delta and ``final``
true (also ``triton_final_response`` true, plus ``finish_reason``, ``input_tokens``,
``output_tokens``). Any other request on the stream (classification, N > 1, beam search) gets one
response with ``final`` true. A failed request gets ``error_message`` ("CODE: message") and the
stream stays open; requests on one stream run concurrently and their responses carry the request
``id``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np

from serving.engine.inflight import GenerationRequest
from serving.errors import InvalidArgument, NotFound, ResourceExhausted, ServingError, status_code
from serving.generation.options import DecodingOptions
from serving.kserve_tensors import BYTES, Tensor, decode_inputs, format_shape, output_tensor
from serving.model_config import ModelConfig as EntryConfig
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.runtime import Generated, LabelScore, ServedModel, StreamDelta
from serving.services.common import Servicer, deadline_of, unary

log = logging.getLogger(__name__)

T = TypeVar("T")
SERVER_NAME = "attnserve"
ALL_CLASSES = 1 << 30  # top_k that makes ServedModel.classify return every class
TEXT_OUTPUT = {"translation": "translation", "captioning": "caption"}
INT_OPTIONS = ("max_new_tokens", "min_new_tokens", "beam_size", "top_k", "seed")
FLOAT_OPTIONS = ("length_penalty", "temperature", "top_p")
CONFIG_TYPES = {
    "BOOL": pb.TYPE_BOOL,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    BYTES: pb.TYPE_STRING,
}
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


# --- the tensor signature of a model --------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model.

    Attributes:
        name: tensor name.
        datatype: the advertised KServe datatype.
        dims: shape without the batch dimension; -1 = any size.
        optional: an input that may be left out.
        accepts: every datatype accepted for an input (defaults to ``datatype`` only).
    """

    name: str
    datatype: str
    dims: tuple[int, ...] = ()
    optional: bool = False
    accepts: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        """The full shape clients see: batch dimension -1 first."""
        return (-1, *self.dims)

    def shape_text(self) -> str:
        """The shape as messages show it: ``[N,3,32,32]``."""
        return format_shape(self.shape).replace("-1", "N", 1)

    def describe(self) -> str:
        """``'pixel_values' (FP32 [N,3,32,32])``."""
        return f"{self.name!r} ({self.datatype} {self.shape_text()})"

    def metadata(self) -> pb.ModelMetadataResponse.TensorMetadata:
        return pb.ModelMetadataResponse.TensorMetadata(
            name=self.name, datatype=self.datatype, shape=list(self.shape)
        )


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs as the KServe protocol shows them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)


def float_datatype(config: EntryConfig) -> str:
    """The pixel datatype of the graph: FP16 for an fp16 export, else FP32."""
    return "FP16" if config.precision == "fp16" else "FP32"


def signature(config: EntryConfig) -> Signature:
    """The KServe tensors of a model, by task (see the module docstring)."""
    if config.task == "classification":
        assert config.image is not None
        size = config.image.size
        classes = len(config.labels) or -1
        return Signature(
            inputs=(
                TensorSpec(
                    "pixel_values",
                    float_datatype(config),
                    (3, size, size),
                    optional=True,
                    accepts=("FP32", "FP16"),
                ),
                TensorSpec("image", BYTES, optional=True),
            ),
            outputs=(TensorSpec("probabilities", "FP32", (classes,)), TensorSpec("label", BYTES)),
        )
    token_ids = TensorSpec("token_ids", "INT32", (-1,))
    if config.task == "translation":
        return Signature(
            inputs=(TensorSpec("text", BYTES), TensorSpec("target_language", BYTES, optional=True)),
            outputs=(TensorSpec("translation", BYTES), token_ids),
        )
    return Signature(
        inputs=(TensorSpec("image", BYTES),), outputs=(TensorSpec("caption", BYTES), token_ids)
    )


def max_batch(config: EntryConfig) -> int:
    """The most elements (N) one request may carry."""
    if config.task == "translation":
        return min(config.limits.max_batch_size, config.limits.max_texts_per_request)
    return config.limits.max_batch_size


def platform(config: EntryConfig) -> str:
    return "tensorrt_plan" if config.backend == "tensorrt" else "onnxruntime_onnx"


def server_version() -> str:
    """The installed attnserve version (a placeholder when it is not installed)."""
    try:
        return importlib.metadata.version("attnserve")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def model_ready(model: ServedModel) -> bool:
    """Whether a model's scheduler is running."""
    return model.ready


# --- ModelConfig ----------------------------------------------------------------------------------


def model_config(model: ServedModel) -> pb.ModelConfig:
    """The Triton model configuration of a served model."""
    c = model.config
    sig = signature(c)
    gpu = c.backend == "tensorrt" or any(
        p in GPU_PROVIDERS for p in c.onnxruntime.execution_providers
    )
    config = pb.ModelConfig(
        name=c.name,
        platform=platform(c),
        backend=c.backend,
        max_batch_size=max_batch(c),
        version_policy=pb.ModelVersionPolicy(latest=pb.ModelVersionPolicy.Latest(num_versions=1)),
        input=[_config_input(spec) for spec in sig.inputs],
        output=[
            pb.ModelOutput(name=s.name, data_type=CONFIG_TYPES[s.datatype], dims=list(s.dims))
            for s in sig.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=f"{c.name}_0",
                count=1,
                kind=pb.ModelInstanceGroup.KIND_GPU if gpu else pb.ModelInstanceGroup.KIND_CPU,
            )
        ],
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=c.kind == "seq2seq"),
    )
    config.dynamic_batching.CopyFrom(_dynamic_batching(c))
    for key, value in _parameters(model).items():
        config.parameters[key].string_value = value
    return config


def _config_input(spec: TensorSpec) -> pb.ModelInput:
    return pb.ModelInput(
        name=spec.name,
        data_type=CONFIG_TYPES[spec.datatype],
        format=pb.ModelInput.FORMAT_NCHW
        if spec.name == "pixel_values"
        else pb.ModelInput.FORMAT_NONE,
        dims=list(spec.dims),
        optional=spec.optional,
    )


def _dynamic_batching(c: EntryConfig) -> pb.ModelDynamicBatching:
    b = c.batching
    return pb.ModelDynamicBatching(
        max_queue_delay_microseconds=b.max_queue_delay_us,
        default_queue_policy=pb.ModelQueuePolicy(
            default_timeout_microseconds=b.timeout_ms * 1000,
            allow_timeout_override=True,
            max_queue_size=b.max_queue_size,
        ),
    )


def _parameters(model: ServedModel) -> dict[str, str]:
    c = model.config
    parameters = {
        "task": c.task,
        "kind": c.kind,
        "precision": c.precision,
        "version": str(model.version),
        "max_batch_size_per_call": str(c.batching.max_batch_size),
    }
    if c.kind == "seq2seq":
        parameters["in_flight_batching"] = str(c.batching.in_flight).lower()
        parameters["max_active_sequences"] = str(c.batching.max_active_sequences)
        parameters["max_new_tokens"] = str(c.limits.max_new_tokens)
        parameters["max_source_length"] = str(c.limits.max_source_length)
    if c.languages:
        parameters["languages"] = ",".join(c.languages)
    if c.labels:
        parameters["labels"] = json.dumps(list(c.labels))
    if c.image is not None:
        parameters["image_size"] = str(c.image.size)
        parameters["max_image_bytes"] = str(c.limits.max_image_bytes)
    return parameters


# --- request parameters ---------------------------------------------------------------------------


def _param_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def int_parameter(name: str, parameter: pb.InferParameter) -> int:
    """An integer request parameter (int64 / uint64, or a string holding an integer)."""
    value = _param_value(parameter)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidArgument(f"parameter {name!r} must be an integer (int64_param), got {value!r}")


def float_parameter(name: str, parameter: pb.InferParameter) -> float:
    """A real request parameter (double / int64 / uint64, or a numeric string)."""
    value = _param_value(parameter)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise InvalidArgument(f"parameter {name!r} must be a number (double_param), got {value!r}")


def string_parameter(name: str, parameter: pb.InferParameter) -> str:
    value = _param_value(parameter)
    if not isinstance(value, str):
        raise InvalidArgument(f"parameter {name!r} must be a string (string_param), got {value!r}")
    return value


def decoding_options(parameters: Any) -> DecodingOptions:
    """DecodingOptions from request parameters (absent ones keep their defaults)."""
    kwargs: dict[str, Any] = {}
    for name in INT_OPTIONS:
        if name in parameters:
            kwargs[name] = int_parameter(name, parameters[name])
    for name in FLOAT_OPTIONS:
        if name in parameters:
            kwargs[name] = float_parameter(name, parameters[name])
    return DecodingOptions(**kwargs)


def request_timeout(request: pb.ModelInferRequest, deadline: float | None) -> float | None:
    """Seconds the request may take: the gRPC deadline and Triton's ``timeout`` (µs) parameter."""
    if "timeout" not in request.parameters:
        return deadline
    micros = int_parameter("timeout", request.parameters["timeout"])
    if micros < 0:
        raise InvalidArgument(f"parameter 'timeout' must be >= 0 microseconds, got {micros}")
    if micros == 0:  # Triton: 0 = no timeout
        return deadline
    return micros / 1e6 if deadline is None else min(deadline, micros / 1e6)


# --- one request, parsed --------------------------------------------------------------------------


@dataclass(frozen=True)
class Wanted:
    """A requested output: its name and Triton's ``classification`` top-k (0 = plain tensor)."""

    name: str
    classification: int = 0


@dataclass(frozen=True)
class Call:
    """A validated inference request."""

    model: ServedModel
    request: pb.ModelInferRequest
    inputs: dict[str, Tensor]
    wanted: tuple[Wanted, ...]
    batch: int
    timeout_s: float | None


def _check_inputs(model: ServedModel, sig: Signature, inputs: dict[str, Tensor]) -> None:
    for tensor in inputs.values():
        spec = sig.input(tensor.name)
        what = f"input {tensor.name[:100]!r}"
        if spec is None:
            known = ", ".join(s.describe() for s in sig.inputs)
            raise InvalidArgument(f"model {model.name!r} has no {what}; its inputs are: {known}")
        accepted = spec.accepts or (spec.datatype,)
        if tensor.datatype not in accepted:
            raise InvalidArgument(f"{what} must be {' or '.join(accepted)}, got {tensor.datatype}")
        _check_shape(tensor, spec, what)
    for spec in sig.inputs:
        if not spec.optional and spec.name not in inputs:
            raise InvalidArgument(f"input {spec.describe()} is missing; send it")


def _check_shape(tensor: Tensor, spec: TensorSpec, what: str) -> None:
    shape = tensor.shape
    if not spec.dims and len(shape) == 2 and shape[1] == 1:  # [N,1] BYTES, a Triton habit
        return
    ok = len(shape) == len(spec.shape) and all(
        want in (-1, got) for want, got in zip(spec.shape[1:], shape[1:], strict=True)
    )
    if not ok:
        raise InvalidArgument(
            f"{what} has shape {format_shape(shape)}; it must be {spec.shape_text()}"
        )


def _requested_outputs(
    model: ServedModel, sig: Signature, request: pb.ModelInferRequest
) -> tuple[Wanted, ...]:
    if not request.outputs:
        return tuple(Wanted(spec.name) for spec in sig.outputs)
    wanted: list[Wanted] = []
    for output in request.outputs:
        spec = sig.output(output.name)
        if spec is None:
            known = ", ".join(s.describe() for s in sig.outputs)
            raise InvalidArgument(
                f"model {model.name!r} has no output {output.name[:100]!r}; "
                f"its outputs are: {known}"
            )
        if any(w.name == output.name for w in wanted):
            raise InvalidArgument(f"output {output.name!r} is requested twice; ask once")
        top_k = 0
        if "classification" in output.parameters:
            top_k = int_parameter("classification", output.parameters["classification"])
            if top_k < 1 or spec.datatype == BYTES:
                raise InvalidArgument(
                    f"output {output.name!r}: classification must be >= 1 and only applies to "
                    "numeric outputs such as 'probabilities'"
                )
        wanted.append(Wanted(output.name, top_k))
    return tuple(wanted)


def _batch_size(model: ServedModel, inputs: dict[str, Tensor]) -> int:
    sizes = {t.name: t.batch for t in inputs.values() if t.name != "target_language"}
    if not sizes:
        names = ", ".join(s.describe() for s in signature(model.config).inputs)
        raise InvalidArgument(f"the request has no inputs; model {model.name!r} takes: {names}")
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in sizes.items())
        raise InvalidArgument(f"inputs disagree on the batch size ({listed}); send equal N")
    (name, n), *_ = sizes.items()
    if n == 0:
        raise InvalidArgument(f"input {name!r} is empty (N = 0); send at least one element")
    limit = max_batch(model.config)
    if n > limit:
        raise ResourceExhausted(
            f"input {name!r} holds {n} elements; model {model.name!r} takes at most {limit} per "
            "request (max_batch_size): split the request"
        )
    return n


def prepare(model: ServedModel, request: pb.ModelInferRequest, deadline: float | None) -> Call:
    """Decode and validate a request against the model's signature.

    Raises:
        InvalidArgument: bad tensors, names, datatypes, shapes, outputs or parameters.
        ResourceExhausted: more elements than the model takes per request.
    """
    sig = signature(model.config)
    inputs = decode_inputs(request)
    _check_inputs(model, sig, inputs)
    wanted = _requested_outputs(model, sig, request)
    batch = _batch_size(model, inputs)
    return Call(model, request, inputs, wanted, batch, request_timeout(request, deadline))


# --- per-task work --------------------------------------------------------------------------------

Outputs = dict[str, tuple[str, Any]]  # output name -> (datatype, values)


def _each(call: Call, fn: Callable[[int], T]) -> list[T]:
    """``fn(i)`` for every element; a failing element's error names its index (when N > 1)."""
    results: list[T] = []
    for index in range(call.batch):
        try:
            results.append(fn(index))
        except ServingError as err:
            if call.batch == 1:
                raise
            raise type(err)(f"element {index}: {err}") from err
    return results


def _elements(tensor: Tensor) -> list[bytes]:
    return [bytes(v) for v in tensor.data.reshape(-1)]


def _utf8(tensor: Tensor) -> list[str]:
    texts = []
    for index, value in enumerate(_elements(tensor)):
        try:
            texts.append(value.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InvalidArgument(
                f"input {tensor.name!r} element {index} is not valid UTF-8 ({err.reason} at byte "
                f"{err.start}); send UTF-8 text"
            ) from err
    return texts


def _target_languages(call: Call) -> list[str]:
    tensor = call.inputs.get("target_language")
    parameter = call.request.parameters.get("target_language")
    languages = call.model.config.languages
    if tensor is not None and parameter is not None:
        raise InvalidArgument(
            "target_language is sent both as an input and as a request parameter; send it once"
        )
    if tensor is not None:
        values = [v.strip() for v in _utf8(tensor)]
        if len(values) not in (1, call.batch):
            raise InvalidArgument(
                f"input 'target_language' holds {len(values)} elements; send 1 (for every text) "
                f"or {call.batch} (one per text)"
            )
        return values * call.batch if len(values) == 1 else values
    if parameter is not None:
        return [string_parameter("target_language", parameter).strip()] * call.batch
    if languages:
        raise InvalidArgument(
            "target_language is missing: send request parameter 'target_language' (string) or "
            f"input 'target_language' (BYTES [N] or [1]); choose one of: {', '.join(languages)}"
        )
    return [""] * call.batch


PIXEL_LIMIT = 1e4  # normalised pixels are within a few units; larger values overflow the model


def _pixels(call: Call) -> list[np.ndarray]:
    """One (3, S, S) array per element, from ``pixel_values`` or encoded ``image`` bytes."""
    model = call.model
    pixels = call.inputs.get("pixel_values")
    image = call.inputs.get("image")
    if pixels is not None and image is not None:
        raise InvalidArgument("send either input 'pixel_values' or input 'image', not both")
    if pixels is not None:
        data = pixels.data.astype(model.float_dtype, copy=False)
        if not np.isfinite(data).all():
            raise InvalidArgument("input 'pixel_values' holds NaN or infinite values")
        if data.size and float(np.abs(data).max()) > PIXEL_LIMIT:
            raise InvalidArgument(
                f"input 'pixel_values' holds values up to {float(np.abs(data).max()):.3g}; send "
                f"normalised pixels ((x/255 - mean) / std, |value| <= {PIXEL_LIMIT:g})"
            )
        return [np.ascontiguousarray(data[i]) for i in range(call.batch)]
    if image is None:
        described = ", ".join(s.describe() for s in signature(model.config).inputs)
        raise InvalidArgument(f"model {model.name!r} needs one of the inputs {described}")
    encoded = _elements(image)
    return _each(call, lambda i: model.image_pixels(encoded[i]))


def generation_jobs(call: Call) -> list[GenerationRequest]:
    """One validated generation request per element (nothing is queued yet)."""
    model = call.model
    options = decoding_options(call.request.parameters)
    model.options(options)  # once, so an option error does not name an element
    if model.config.task == "translation":
        texts = _utf8(call.inputs["text"])
        languages = _target_languages(call)
        return _each(
            call,
            lambda i: model.request(
                options,
                source_ids=model.source_ids(texts[i], languages[i]),
                timeout_s=call.timeout_s,
            ),
        )
    pixels = _pixels(call)
    return [model.request(options, pixels=p, timeout_s=call.timeout_s) for p in pixels]


async def _gather(awaitables: Iterable[Awaitable[T]], on_error: Callable[[], None]) -> list[T]:
    """Await all concurrently; on the first failure (or cancellation) cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        on_error()
        raise


def _token_matrix(sequences: list[list[int]]) -> np.ndarray:
    width = max((len(s) for s in sequences), default=0)
    matrix = np.full((len(sequences), width), -1, dtype=np.int32)
    for row, ids in enumerate(sequences):
        matrix[row, : len(ids)] = ids
    return matrix


async def generate(call: Call) -> Outputs:
    """Run every element of a translation / captioning request to the end."""
    jobs = generation_jobs(call)

    def cancel_jobs() -> None:
        for job in jobs:
            job.cancel()

    results: list[Generated] = await _gather((call.model.generate(j) for j in jobs), cancel_jobs)
    return {
        TEXT_OUTPUT[call.model.config.task]: (BYTES, [r.text.encode() for r in results]),
        "token_ids": ("INT32", _token_matrix([r.token_ids for r in results])),
    }


async def classify(call: Call) -> Outputs:
    """Every element through the model's dynamic batcher; full probabilities and top-1 label."""
    model = call.model
    pixels = _pixels(call)
    scores: list[list[LabelScore]] = await _gather(
        (model.classify(p, ALL_CLASSES, timeout_s=call.timeout_s) for p in pixels), lambda: None
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


def _parameter(value: bool | int | str) -> pb.InferParameter:
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
    response = pb.ModelInferResponse(
        model_name=model.name, model_version=str(model.version), id=call.request.id
    )
    for wanted in call.wanted:
        datatype, values = outputs[wanted.name]
        if wanted.classification:
            datatype = BYTES
            values = _classification(values, wanted.classification, model.config.labels)
        header, raw = output_tensor(wanted.name, datatype, values)
        response.outputs.append(header)
        response.raw_output_contents.append(raw)
    for key, value in (parameters or {}).items():
        response.parameters[key].CopyFrom(_parameter(value))
    return response


async def infer(call: Call) -> pb.ModelInferResponse:
    """Run a whole request and build its single response."""
    if call.model.config.task == "classification":
        return build_response(call, await classify(call))
    return build_response(call, await generate(call))


def _final(final: bool) -> dict[str, bool | int | str]:
    return {"final": final, "triton_final_response": final}


def _beam_search(call: Call) -> bool:
    """Beam search settles its text only at the end: such requests are not streamed."""
    return decoding_options(call.request.parameters).beam_size > 1


async def stream_responses(call: Call) -> AsyncIterator[pb.ModelInferResponse]:
    """The decoupled responses of one streamed request (see the module docstring)."""
    task = call.model.config.task
    if task == "classification" or call.batch > 1 or _beam_search(call):
        response = await infer(call)
        for key, value in _final(True).items():
            response.parameters[key].CopyFrom(_parameter(value))
        yield response
        return
    (job,) = generation_jobs(call)
    text_output = TEXT_OUTPUT[task]
    async for item in call.model.stream(job):
        if isinstance(item, StreamDelta):
            outputs = {
                text_output: (BYTES, [item.delta.encode()]),
                "token_ids": ("INT32", np.asarray([item.token_ids], dtype=np.int32)),
            }
            yield build_response(call, outputs, {"index": item.index, **_final(False)})
        else:
            outputs = {
                text_output: (BYTES, [b""]),
                "token_ids": ("INT32", np.zeros((1, 0), dtype=np.int32)),
            }
            yield build_response(
                call,
                outputs,
                {
                    **_final(True),
                    "finish_reason": item.finish_reason,
                    "input_tokens": item.input_tokens,
                    "output_tokens": len(item.token_ids),
                },
            )


# --- the servicer ---------------------------------------------------------------------------------


def probe(method: str, model_of: Callable[[Any], str]) -> Callable:
    """Like ``unary`` but without the drain check: health and metadata answer while draining
    (Triton: live stays true and ready turns false while the server shuts down)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        async def handler(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            code = "OK"
            try:
                return await fn(self, request, context)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as err:
                code = status_code(err).name
                if not isinstance(err, ServingError):
                    log.exception("internal error in %s", method)
                await context.abort(status_code(err), _message(err))
            finally:
                self.record(self.model_label(model_of(request)), method, code, started)

        return handler

    return decorate


def _message(err: BaseException) -> str:
    if isinstance(err, ServingError):
        return str(err)
    return f"internal error: {type(err).__name__}: {err}"


_END = object()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's exception as seen, so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()


class KServeServicer(Servicer, pb_grpc.GRPCInferenceServiceServicer):
    """KServe v2 health, metadata, config, unary and streaming inference."""

    def _model(self, name: str, version: str) -> ServedModel:
        if not name:
            raise InvalidArgument(
                "model_name is empty; name the model (ServerMetadata lists none, "
                "ModelMetadata describes one)"
            )
        model: ServedModel = self.repository.get(name)
        if version and version != str(model.version):
            raise NotFound(
                f"model {model.name!r} has no version {version[:40]!r}; it serves version "
                f"{model.version}: send that or leave the version empty"
            )
        return model

    # --- health and metadata --------------------------------------------------------------------
    @probe("ServerLive", lambda r: "")
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any):
        return pb.ServerLiveResponse(live=True)

    @probe("ServerReady", lambda r: "")
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any):
        models = self.repository.models()
        ready = not self.state.draining and bool(models) and all(map(model_ready, models))
        return pb.ServerReadyResponse(ready=ready)

    @probe("ModelReady", lambda r: r.name)
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any):
        try:
            model = self._model(request.name, request.version)
        except (NotFound, InvalidArgument):  # Triton answers ready=false for unknown models
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not self.state.draining and model_ready(model))

    @probe("ServerMetadata", lambda r: "")
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=server_version(), extensions=[])

    @probe("ModelMetadata", lambda r: r.name)
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any):
        model = self._model(request.name, request.version)
        sig = signature(model.config)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[str(model.version)],
            platform=platform(model.config),
            inputs=[spec.metadata() for spec in sig.inputs],
            outputs=[spec.metadata() for spec in sig.outputs],
        )

    @probe("ModelConfig", lambda r: r.name)
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any):
        return pb.ModelConfigResponse(
            config=model_config(self._model(request.name, request.version))
        )

    # --- inference ------------------------------------------------------------------------------
    @unary("ModelInfer", lambda r: r.model_name)
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext):
        model = self._model(request.model_name, request.model_version)
        return await infer(prepare(model, request, deadline_of(context)))

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Bidirectional stream: every request runs concurrently; see the module docstring.

        Draining refuses new streams (UNAVAILABLE) and new requests on open ones (error_message).
        Metrics count each request of the stream (method "ModelStreamInfer").
        """
        if self.state.draining:
            self.record(
                self.model_label(""), "ModelStreamInfer", "UNAVAILABLE", time.perf_counter()
            )
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry on another replica"
            )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        pump = asyncio.ensure_future(self._pump(request_iterator, queue.put_nowait, context))
        pump.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while (item := await queue.get()) is not _END:
                yield item
            error = None if pump.cancelled() else pump.exception()
            if error is not None:
                raise error
        finally:
            pump.cancel()
            pump.add_done_callback(_retrieve)  # a late failure of a cancelled stream is not news

    async def _pump(
        self,
        requests: AsyncIterator[pb.ModelInferRequest],
        send: Callable[[pb.ModelStreamInferResponse], None],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Read the stream's requests, run each in its own task; return when all are done."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                task = asyncio.ensure_future(self._stream_one(request, send, context))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_one(
        self,
        request: pb.ModelInferRequest,
        send: Callable[[pb.ModelStreamInferResponse], None],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Serve one request of a stream; its failure goes into error_message, not the stream."""
        started = time.perf_counter()
        code = "OK"
        try:
            self.state.check_serving()
            model = self._model(request.model_name, request.model_version)
            call = prepare(model, request, deadline_of(context))
            async for response in stream_responses(call):
                send(pb.ModelStreamInferResponse(infer_response=response))
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as err:
            code = status_code(err).name
            if not isinstance(err, ServingError):
                log.exception("internal error in ModelStreamInfer")
            send(
                pb.ModelStreamInferResponse(
                    error_message=f"{code}: {_message(err)}",
                    infer_response=pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    ),
                )
            )
        finally:
            self.record(self.model_label(request.model_name), "ModelStreamInfer", code, started)
