from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_UNAVAILABLE: _ClassVar[ModelState]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_UNAVAILABLE: ModelState

class DecodingOptions(_message.Message):
    __slots__ = ("max_new_tokens", "min_new_tokens", "beam_size", "length_penalty", "temperature", "top_k", "top_p", "seed", "num_alternatives", "repetition_penalty", "no_repeat_ngram_size", "return_log_probs", "bad_words", "stop", "top_log_probs")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    min_new_tokens: int
    beam_size: int
    length_penalty: float
    temperature: float
    top_k: int
    top_p: float
    seed: int
    num_alternatives: int
    repetition_penalty: float
    no_repeat_ngram_size: int
    return_log_probs: bool
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    stop: _containers.RepeatedScalarFieldContainer[str]
    top_log_probs: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., beam_size: _Optional[int] = ..., length_penalty: _Optional[float] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., num_alternatives: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., no_repeat_ngram_size: _Optional[int] = ..., return_log_probs: _Optional[bool] = ..., bad_words: _Optional[_Iterable[str]] = ..., stop: _Optional[_Iterable[str]] = ..., top_log_probs: _Optional[int] = ...) -> None: ...

class TopLogProbs(_message.Message):
    __slots__ = ("token_ids", "log_probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    log_probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., log_probs: _Optional[_Iterable[float]] = ...) -> None: ...

class Hypothesis(_message.Message):
    __slots__ = ("text", "token_ids", "score", "finish_reason", "token_log_probs", "top_log_probs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    score: float
    finish_reason: FinishReason
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogProbs]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., score: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogProbs, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_time_ms", "compute_time_ms", "total_time_ms", "time_to_first_token_ms")
    QUEUE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    queue_time_ms: float
    compute_time_ms: float
    total_time_ms: float
    time_to_first_token_ms: float
    def __init__(self, queue_time_ms: _Optional[float] = ..., compute_time_ms: _Optional[float] = ..., total_time_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ...) -> None: ...

class TranslateRequest(_message.Message):
    __slots__ = ("texts", "target_language", "model", "options", "model_version", "priority", "target_prefixes")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TARGET_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    target_language: str
    model: str
    options: DecodingOptions
    model_version: str
    priority: int
    target_prefixes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., target_language: _Optional[str] = ..., model: _Optional[str] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., model_version: _Optional[str] = ..., priority: _Optional[int] = ..., target_prefixes: _Optional[_Iterable[str]] = ...) -> None: ...

class Translation(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "score", "alternatives", "token_log_probs", "top_log_probs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    score: float
    alternatives: _containers.RepeatedCompositeFieldContainer[Hypothesis]
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogProbs]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., score: _Optional[float] = ..., alternatives: _Optional[_Iterable[_Union[Hypothesis, _Mapping]]] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogProbs, _Mapping]]] = ...) -> None: ...

class TranslateResponse(_message.Message):
    __slots__ = ("translations", "model", "usage", "timing", "model_version")
    TRANSLATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    translations: _containers.RepeatedCompositeFieldContainer[Translation]
    model: str
    usage: Usage
    timing: Timing
    model_version: str
    def __init__(self, translations: _Optional[_Iterable[_Union[Translation, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., model_version: _Optional[str] = ...) -> None: ...

class TranslateStreamRequest(_message.Message):
    __slots__ = ("text", "target_language", "model", "options", "model_version", "priority", "target_prefix")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TARGET_PREFIX_FIELD_NUMBER: _ClassVar[int]
    text: str
    target_language: str
    model: str
    options: DecodingOptions
    model_version: str
    priority: int
    target_prefix: str
    def __init__(self, text: _Optional[str] = ..., target_language: _Optional[str] = ..., model: _Optional[str] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., model_version: _Optional[str] = ..., priority: _Optional[int] = ..., target_prefix: _Optional[str] = ...) -> None: ...

class TranslateStreamResponse(_message.Message):
    __slots__ = ("delta", "token_ids", "index", "finish_reason", "usage", "timing", "model", "model_version", "token_log_probs", "score", "top_log_probs")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    index: int
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    model: str
    model_version: str
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    score: float
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogProbs]
    def __init__(self, delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., index: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., score: _Optional[float] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogProbs, _Mapping]]] = ...) -> None: ...

class CaptionRequest(_message.Message):
    __slots__ = ("image", "model", "options", "model_version", "priority", "prefix")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    model: str
    options: DecodingOptions
    model_version: str
    priority: int
    prefix: str
    def __init__(self, image: _Optional[bytes] = ..., model: _Optional[str] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., model_version: _Optional[str] = ..., priority: _Optional[int] = ..., prefix: _Optional[str] = ...) -> None: ...

class CaptionResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "score", "alternatives", "model", "usage", "timing", "model_version", "token_log_probs", "top_log_probs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    score: float
    alternatives: _containers.RepeatedCompositeFieldContainer[Hypothesis]
    model: str
    usage: Usage
    timing: Timing
    model_version: str
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogProbs]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., score: _Optional[float] = ..., alternatives: _Optional[_Iterable[_Union[Hypothesis, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., model_version: _Optional[str] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogProbs, _Mapping]]] = ...) -> None: ...

class CaptionStreamResponse(_message.Message):
    __slots__ = ("delta", "token_ids", "index", "finish_reason", "usage", "timing", "model", "model_version", "token_log_probs", "score", "top_log_probs")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOP_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    index: int
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    model: str
    model_version: str
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    score: float
    top_log_probs: _containers.RepeatedCompositeFieldContainer[TopLogProbs]
    def __init__(self, delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., index: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., score: _Optional[float] = ..., top_log_probs: _Optional[_Iterable[_Union[TopLogProbs, _Mapping]]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("model", "model_version", "texts", "target_language", "images", "targets", "priority")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_version: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    target_language: str
    images: _containers.RepeatedScalarFieldContainer[bytes]
    targets: _containers.RepeatedScalarFieldContainer[str]
    priority: int
    def __init__(self, model: _Optional[str] = ..., model_version: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., target_language: _Optional[str] = ..., images: _Optional[_Iterable[bytes]] = ..., targets: _Optional[_Iterable[str]] = ..., priority: _Optional[int] = ...) -> None: ...

class TargetScore(_message.Message):
    __slots__ = ("token_ids", "token_log_probs", "eos_log_prob", "score")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    EOS_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_log_probs: _containers.RepeatedScalarFieldContainer[float]
    eos_log_prob: float
    score: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., token_log_probs: _Optional[_Iterable[float]] = ..., eos_log_prob: _Optional[float] = ..., score: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "model", "model_version", "usage", "timing")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[TargetScore]
    model: str
    model_version: str
    usage: Usage
    timing: Timing
    def __init__(self, scores: _Optional[_Iterable[_Union[TargetScore, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("image", "top_k", "model", "model_version", "priority")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    top_k: int
    model: str
    model_version: str
    priority: int
    def __init__(self, image: _Optional[bytes] = ..., top_k: _Optional[int] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "index", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    index: int
    score: float
    def __init__(self, label: _Optional[str] = ..., index: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("labels", "model", "timing", "model_version")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelScore]
    model: str
    timing: Timing
    model_version: str
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ..., model: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., model_version: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_batch_size", "max_source_length", "max_new_tokens", "max_image_bytes")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SOURCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_source_length: int
    max_new_tokens: int
    max_image_bytes: int
    def __init__(self, max_batch_size: _Optional[int] = ..., max_source_length: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., max_image_bytes: _Optional[int] = ...) -> None: ...

class Batching(_message.Message):
    __slots__ = ("max_batch_size", "max_queue_delay_us", "max_queue_size", "timeout_ms", "in_flight", "priority_levels", "default_priority_level", "priority_queue_policy")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_US_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_queue_delay_us: int
    max_queue_size: int
    timeout_ms: int
    in_flight: bool
    priority_levels: int
    default_priority_level: int
    priority_queue_policy: _containers.RepeatedCompositeFieldContainer[LevelQueue]
    def __init__(self, max_batch_size: _Optional[int] = ..., max_queue_delay_us: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., in_flight: _Optional[bool] = ..., priority_levels: _Optional[int] = ..., default_priority_level: _Optional[int] = ..., priority_queue_policy: _Optional[_Iterable[_Union[LevelQueue, _Mapping]]] = ...) -> None: ...

class LevelQueue(_message.Message):
    __slots__ = ("level", "max_queue_size", "timeout_ms")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    level: int
    max_queue_size: int
    timeout_ms: int
    def __init__(self, level: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("name", "datatype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "versions", "kind", "task", "backend", "state", "limits", "batching", "languages", "labels", "inputs", "outputs", "version", "state_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    task: str
    backend: str
    state: ModelState
    limits: Limits
    batching: Batching
    languages: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.RepeatedScalarFieldContainer[str]
    inputs: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    version: str
    state_reason: str
    def __init__(self, name: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ..., task: _Optional[str] = ..., backend: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., batching: _Optional[_Union[Batching, _Mapping]] = ..., languages: _Optional[_Iterable[str]] = ..., labels: _Optional[_Iterable[str]] = ..., inputs: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., version: _Optional[str] = ..., state_reason: _Optional[str] = ...) -> None: ...
