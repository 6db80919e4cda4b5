"""The attnserve.v1 API: protobuf in, runtime calls, protobuf out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from serving.errors import InvalidArgument, TooLarge
from serving.generation.options import DecodingOptions
from serving.generation.top_tokens import TopTokens
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.scoring import ScoreItem
from serving.served import (
    Generated,
    ServedClassifier,
    ServedGenerator,
    ServedModel,
    StreamDelta,
)
from serving.served.generator import generate_all
from serving.services.common import Servicer, deadline_of, streaming, unary

FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "cancelled": pb.FINISH_REASON_CANCELLED,
    "stop_sequence": pb.FINISH_REASON_STOP_SEQUENCE,
}
DEFAULT_MODELS = {"translate": "translator", "caption": "captioner", "classify": "vit"}


def decoding_options(message: pb.DecodingOptions) -> DecodingOptions:
    """Plain options from the protobuf (unset optional fields keep their defaults)."""
    return DecodingOptions(
        max_new_tokens=message.max_new_tokens or None,
        min_new_tokens=message.min_new_tokens,
        beam_size=message.beam_size or 1,
        length_penalty=message.length_penalty if message.HasField("length_penalty") else 1.0,
        temperature=message.temperature if message.HasField("temperature") else 0.0,
        top_k=message.top_k,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        seed=message.seed if message.HasField("seed") else None,
        num_alternatives=message.num_alternatives,
        repetition_penalty=(
            message.repetition_penalty if message.HasField("repetition_penalty") else 1.0
        ),
        no_repeat_ngram_size=message.no_repeat_ngram_size,
        return_log_probs=message.return_log_probs,
        bad_words=tuple(message.bad_words),
        stop=tuple(message.stop),
        top_log_probs=message.top_log_probs,
    )


def _top_messages(tops: list[TopTokens] | None) -> list[pb.TopLogProbs]:
    """``DecodingOptions.top_log_probs``' answer fields (none without them)."""
    return [pb.TopLogProbs(token_ids=ids, log_probs=values) for ids, values in tops or ()]


def _model_name(request: Any, task: str) -> str:
    return request.model or DEFAULT_MODELS[task]


def _version(request: Any) -> str:
    return str(request.model_version)


def _timing(result: Generated) -> pb.Timing:
    return pb.Timing(
        queue_time_ms=result.queue_seconds * 1000,
        compute_time_ms=max(0.0, result.total_seconds - result.queue_seconds) * 1000,
        total_time_ms=result.total_seconds * 1000,
        time_to_first_token_ms=(result.first_token_seconds or 0.0) * 1000,
    )


def _alternatives(result: Generated) -> list[pb.Hypothesis]:
    return [
        pb.Hypothesis(
            text=a.text,
            token_ids=a.token_ids,
            score=a.score,
            finish_reason=FINISH[a.finish_reason],
            token_log_probs=a.token_log_probs or (),
            top_log_probs=_top_messages(a.top_log_probs),
        )
        for a in result.alternatives
    ]


def _stream_options(options: pb.DecodingOptions) -> DecodingOptions:
    """Decoding options of a streaming call: greedy or sampling (a beam has no single stream)."""
    parsed = decoding_options(options)
    if parsed.beam_size > 1:
        raise InvalidArgument("streams decode greedily or by sampling: set beam_size to 1")
    if parsed.num_alternatives:
        raise InvalidArgument(
            f"a stream sends one output, not num_alternatives {parsed.num_alternatives} more: "
            "leave it at 0, or use the unary call"
        )
    return parsed


def _prefixes(request: pb.TranslateRequest) -> list[str]:
    """The request's target prefix per text ("" for none)."""
    prefixes = list(request.target_prefixes)
    if not prefixes:
        return [""] * len(request.texts)
    if len(prefixes) != len(request.texts):
        raise InvalidArgument(
            f"{len(prefixes)} target_prefixes for {len(request.texts)} texts: send one per text "
            '("" for none), or none at all'
        )
    return prefixes


def _score_model(request: pb.ScoreRequest) -> str:
    """The model a Score request names; by default the translator, or for images the
    captioner."""
    return request.model or DEFAULT_MODELS["caption" if request.images else "translate"]


def _score_sources(model: ServedGenerator, request: pb.ScoreRequest) -> list[np.ndarray]:
    """A Score request's sources as the encoder takes them, one per target: token ids of its
    texts (a translator) or pixels of its images (a captioner).

    Raises:
        InvalidArgument: no targets, texts and images mixed or of the wrong kind for the model,
            or not one per target; a bad text or image.
    """
    if not request.targets:
        raise InvalidArgument("targets is empty; send at least one target to score")
    if request.texts and request.images:
        raise InvalidArgument("send texts (a translator) or images (a captioner), not both")
    texts = model.config.input == "text"
    given, other = (request.texts, request.images) if texts else (request.images, request.texts)
    what, not_what = ("texts", "images") if texts else ("images", "texts")
    if other:
        raise InvalidArgument(f"model {model.name!r} takes {what}, not {not_what}: send {what}")
    if len(given) != len(request.targets):
        raise InvalidArgument(
            f"{len(given)} {what} for {len(request.targets)} targets: send one per target"
        )
    if texts:
        return [model.source_ids(text, request.target_language) for text in request.texts]
    return [model.image_pixels(image) for image in request.images]


class AttnServeServicer(Servicer, pb_grpc.AttnServeServicer):
    """Translate, caption, classify; list and describe models."""

    def _model(self, name: str, version: str, task: str) -> ServedModel:
        model: ServedModel = self.repository.get(name, version)
        if model.config.task != task:
            raise InvalidArgument(
                f"model {name!r} does {model.config.task}, not {task}; pick another model"
            )
        return model

    def _generator(self, name: str, version: str, task: str) -> ServedGenerator:
        model = self._model(name, version, task)
        assert isinstance(model, ServedGenerator)  # only generators do translation / captioning
        return model

    def _classifier(self, name: str, version: str) -> ServedClassifier:
        model = self._model(name, version, "classification")
        assert isinstance(model, ServedClassifier)  # only classifiers do classification
        return model

    # --- translation ----------------------------------------------------------------------------
    @unary("Translate", lambda r: _model_name(r, "translate"), version_of=_version)
    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext):
        model = self._generator(
            _model_name(request, "translate"), request.model_version, "translation"
        )
        if not request.texts:
            raise InvalidArgument("texts is empty; send at least one text to translate")
        limit = model.config.limits.max_texts_per_request
        if len(request.texts) > limit:
            raise TooLarge(
                f"{len(request.texts)} texts in one request; the limit is {limit}: split it"
            )
        options = decoding_options(request.options)
        timeout = deadline_of(context)
        prefixes = _prefixes(request)
        jobs = [
            model.request(
                options,
                source_ids=model.source_ids(text, request.target_language),
                timeout_s=timeout,
                priority=request.priority,
                prefix=model.prefix_ids(prefix),
            )
            for text, prefix in zip(request.texts, prefixes, strict=True)
        ]
        results = await generate_all(model.generate, jobs)
        response = pb.TranslateResponse(model=model.name, model_version=str(model.version))
        for result in results:
            response.translations.append(
                pb.Translation(
                    text=result.text,
                    token_ids=result.token_ids,
                    finish_reason=FINISH[result.finish_reason],
                    score=result.score or 0.0,
                    alternatives=_alternatives(result),
                    token_log_probs=result.token_log_probs or (),
                    top_log_probs=_top_messages(result.top_log_probs),
                )
            )
        response.usage.input_tokens = sum(r.input_tokens for r in results)
        response.usage.output_tokens = sum(len(r.token_ids) for r in results)
        response.timing.CopyFrom(_timing(max(results, key=lambda r: r.total_seconds)))
        return response

    @streaming("TranslateStream", lambda r: _model_name(r, "translate"), _version)
    async def TranslateStream(
        self, request: pb.TranslateStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TranslateStreamResponse]:
        model = self._generator(
            _model_name(request, "translate"), request.model_version, "translation"
        )
        options = _stream_options(request.options)
        job = model.request(
            options,
            source_ids=model.source_ids(request.text, request.target_language),
            timeout_s=deadline_of(context),
            priority=request.priority,
            prefix=model.prefix_ids(request.target_prefix),
        )
        async for item in model.stream(job):
            yield self._stream_message(pb.TranslateStreamResponse, model, item)

    # --- captioning -----------------------------------------------------------------------------
    @unary("Caption", lambda r: _model_name(r, "caption"), version_of=_version)
    async def Caption(self, request: pb.CaptionRequest, context: grpc.aio.ServicerContext):
        model = self._generator(
            _model_name(request, "caption"), request.model_version, "captioning"
        )
        job = model.request(
            decoding_options(request.options),
            pixels=model.image_pixels(request.image),
            timeout_s=deadline_of(context),
            priority=request.priority,
            prefix=model.prefix_ids(request.prefix),
        )
        result = await model.generate(job)
        return pb.CaptionResponse(
            text=result.text,
            token_ids=result.token_ids,
            finish_reason=FINISH[result.finish_reason],
            score=result.score or 0.0,
            alternatives=_alternatives(result),
            token_log_probs=result.token_log_probs or (),
            top_log_probs=_top_messages(result.top_log_probs),
            model=model.name,
            model_version=str(model.version),
            usage=pb.Usage(input_tokens=result.input_tokens, output_tokens=len(result.token_ids)),
            timing=_timing(result),
        )

    @streaming("CaptionStream", lambda r: _model_name(r, "caption"), _version)
    async def CaptionStream(
        self, request: pb.CaptionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CaptionStreamResponse]:
        model = self._generator(
            _model_name(request, "caption"), request.model_version, "captioning"
        )
        options = _stream_options(request.options)
        job = model.request(
            options,
            pixels=model.image_pixels(request.image),
            timeout_s=deadline_of(context),
            priority=request.priority,
            prefix=model.prefix_ids(request.prefix),
        )
        async for item in model.stream(job):
            yield self._stream_message(pb.CaptionStreamResponse, model, item)

    @staticmethod
    def _stream_message(cls: Any, model: ServedGenerator, item: StreamDelta | Generated) -> Any:
        if isinstance(item, StreamDelta):
            return cls(
                delta=item.delta,
                token_ids=item.token_ids,
                index=item.index,
                token_log_probs=item.log_probs or (),
                top_log_probs=_top_messages(item.top),
            )
        return cls(
            finish_reason=FINISH[item.finish_reason],
            score=item.score or 0.0,
            usage=pb.Usage(input_tokens=item.input_tokens, output_tokens=len(item.token_ids)),
            timing=_timing(item),
            model=model.name,
            model_version=str(model.version),
        )

    # --- scoring --------------------------------------------------------------------------------
    @unary("Score", _score_model, version_of=_version)
    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext):
        model = self.repository.get(_score_model(request), request.model_version)
        if not isinstance(model, ServedGenerator):
            raise InvalidArgument(
                f"model {model.name!r} does {model.config.task}: only translators and "
                "captioners score targets; pick another model"
            )
        limit = model.config.limits.max_texts_per_request
        if len(request.targets) > limit:  # before any text is tokenized or image decoded
            raise TooLarge(
                f"{len(request.targets)} targets in one request; the limit is {limit}: split it"
            )
        sources = _score_sources(model, request)
        items = [
            ScoreItem(source, model.target_ids(target))
            for source, target in zip(sources, request.targets, strict=True)
        ]
        started = time.monotonic()
        scored = await model.score(items, deadline_of(context), request.priority)
        slowest = max(scored, key=lambda s: s.queue_seconds + s.compute_seconds)
        return pb.ScoreResponse(
            scores=[
                pb.TargetScore(
                    token_ids=item.target.tolist(),
                    token_log_probs=s.log_probs[:-1].tolist(),
                    eos_log_prob=float(s.log_probs[-1]),
                    score=s.score,
                )
                for item, s in zip(items, scored, strict=True)
            ],
            model=model.name,
            model_version=str(model.version),
            usage=pb.Usage(
                input_tokens=sum(s.input_tokens for s in scored),
                output_tokens=sum(len(item.target) for item in items),
            ),
            timing=pb.Timing(
                queue_time_ms=slowest.queue_seconds * 1000,
                compute_time_ms=slowest.compute_seconds * 1000,
                total_time_ms=(time.monotonic() - started) * 1000,
            ),
        )

    # --- classification -------------------------------------------------------------------------
    @unary("Classify", lambda r: _model_name(r, "classify"), version_of=_version)
    async def Classify(self, request: pb.ClassifyRequest, context: grpc.aio.ServicerContext):
        model = self._classifier(_model_name(request, "classify"), request.model_version)
        pixels = model.image_pixels(request.image)
        labels = await model.classify(
            pixels, request.top_k, timeout_s=deadline_of(context), priority=request.priority
        )
        return pb.ClassifyResponse(
            labels=[pb.LabelScore(label=s.label, index=s.index, score=s.score) for s in labels],
            model=model.name,
            model_version=str(model.version),
        )

    # --- metadata -------------------------------------------------------------------------------
    @unary("ListModels", lambda r: "")
    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext):
        # one per model, at its newest served version (``versions``: all served)
        models = [self.repository.get(name) for name in self.repository.names()]
        return pb.ListModelsResponse(models=[self._info(m) for m in models])

    @unary("GetModel", lambda r: r.name, version_of=lambda r: r.version)
    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext):
        if not request.name:
            raise InvalidArgument("name is empty; ListModels shows the served models")
        return self._info(self.repository.get(request.name, request.version))

    def _info(self, model: ServedModel) -> pb.ModelInfo:
        return model_info(model, self.repository.versions(model.name))


def model_info(model: ServedModel, versions: list[int]) -> pb.ModelInfo:
    """ModelInfo of a served model (one version; ``versions``: all its served ones): kind,
    limits, batching, languages or labels."""
    c = model.config
    info = pb.ModelInfo(
        name=c.name,
        versions=list(map(str, versions)),
        version=str(model.version),
        kind=c.kind,
        task=c.task,
        backend=c.backend,
        state=pb.MODEL_STATE_READY,
        limits=pb.Limits(
            max_batch_size=c.limits.max_batch_size, max_image_bytes=c.limits.max_image_bytes
        ),
        batching=pb.Batching(
            max_batch_size=c.batching.max_batch_size,
            max_queue_size=c.batching.max_queue_size,
            timeout_ms=c.batching.timeout_ms,
            priority_levels=c.batching.priority_levels,
            default_priority_level=c.batching.default_priority_level,
            priority_queue_policy=[
                pb.LevelQueue(
                    level=p.level, max_queue_size=p.max_queue_size, timeout_ms=p.timeout_ms
                )
                for p in c.batching.priority_queue_policy
            ],
        ),
    )
    if isinstance(model, ServedClassifier):
        info.labels.extend(model.config.labels)
        info.batching.max_queue_delay_us = model.config.batching.max_queue_delay_us
    else:
        info.languages.extend(model.config.languages)
        info.limits.max_source_length = model.config.limits.max_source_length
        info.limits.max_new_tokens = model.config.limits.max_new_tokens
        info.batching.in_flight = model.config.batching.in_flight
    return info
