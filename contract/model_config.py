"""The model repository's config.yaml: what a served model is and how it is batched.

Written by the export package, read by the server (``contract.repository`` reads and writes the
file). Every field has a default and a comment; ``contract.schema`` rejects unknown fields and
wrong types with the field's path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from contract.normalize import check_steps
from contract.schema import SchemaError, from_mapping

# --- limits ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClassifierLimits:
    """Largest inputs a classifier accepts; larger requests are rejected with a clear status."""

    max_batch_size: int = 32  # most images in one graph call (and in one KServe request)
    max_image_bytes: int = 4 * 1024 * 1024  # encoded image size

    def __post_init__(self) -> None:
        _at_least_one(self, "max_batch_size", "max_image_bytes")


@dataclass(frozen=True, kw_only=True)
class GeneratorLimits:
    """Largest inputs a seq2seq model accepts; larger requests are rejected with a clear status."""

    max_batch_size: int = 32  # most sequences in one graph call
    max_source_length: int = 64  # source tokens (translator) or encoder positions (captioner)
    max_new_tokens: int = 64  # generated tokens per sequence
    max_texts_per_request: int = 32  # texts in one Translate call
    max_image_bytes: int = 4 * 1024 * 1024  # encoded image size (image inputs)

    def __post_init__(self) -> None:
        _at_least_one(
            self, "max_batch_size", "max_source_length", "max_new_tokens", "max_image_bytes"
        )


# --- batching --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class QueuePolicy:
    """A priority level's own queue (Triton's priority_queue_policy entry): its requests count
    against its own limit and take its own default deadline, not the model's."""

    level: int  # the priority level (1..priority_levels)
    max_queue_size: int = 256  # requests waiting at this level beyond this: RESOURCE_EXHAUSTED
    timeout_ms: int = 30_000  # this level's deadline when the client sets none (0 = none)

    def __post_init__(self) -> None:
        _at_least_one(self, "level")
        _not_negative(self, "max_queue_size", "timeout_ms")


@dataclass(frozen=True, kw_only=True)
class DynamicBatching:
    """Triton-style dynamic batching of one-shot work (classifiers)."""

    max_batch_size: int = 32  # requests merged into one call
    # How long the first queued request waits for batch-mates. 0 (Triton's default too): a batch
    # leaves as soon as the model is free, and requests that arrive while it runs form the next
    # one, so batches grow with load without delaying a lone request.
    max_queue_delay_us: int = 0
    max_queue_size: int = 256  # queued requests beyond this get RESOURCE_EXHAUSTED
    timeout_ms: int = 30_000  # per-request deadline when the client sets none (0 = none)
    # Model instances (Triton's instance_group): up to this many batches run at once, each on
    # its own thread (and its own sessions unless it has one intra-op thread: then all share
    # one set). intra_op_threads 0 then means the cores divided among the instances.
    instances: int = 1
    # Pad each batch with zero images up to the next power of two (at most max_batch_size) and
    # run every such size once when the model loads: the graph then meets a few input shapes,
    # each prepared before the first request. (A graph with a convolution still pays cuDNN's
    # planning at every change of shape on CUDA, tens of milliseconds: the ViT and captioner
    # exports since 2026-11-27 have none.) "auto": on when the first execution provider is not
    # the CPU's, or with the TensorRT backend; off on the CPU, where a padded row costs as much
    # as a real one.
    batch_buckets: Literal["auto", "on", "off"] = "auto"
    # Triton's priority levels: 0 = off (one queue, first come first served); N > 0: a request's
    # priority 1 (highest) .. N is served before every queued request of a lower priority, first
    # come first served within a level. A request without a priority (0), or with one above N,
    # takes default_priority_level (1..N).
    priority_levels: int = 0
    default_priority_level: int = 0
    # Levels with a queue of their own (Triton's priority_queue_policy), e.g. [{level: 1,
    # max_queue_size: 32, timeout_ms: 1000}]: their requests are not counted against
    # max_queue_size (which then bounds the other levels' requests) and wait at most their
    # timeout_ms when the client sets no deadline.
    priority_queue_policy: tuple[QueuePolicy, ...] = ()

    def __post_init__(self) -> None:
        _at_least_one(self, "max_batch_size", "instances")
        _not_negative(self, "max_queue_delay_us", "max_queue_size", "timeout_ms")
        _check_priorities(self)


@dataclass(frozen=True, kw_only=True)
class InFlightBatching:
    """In-flight batching of generation: sequences join and leave the decode batch between steps."""

    max_batch_size: int = 32  # requests admitted in one step (their encoder pass is one batch)
    max_queue_size: int = 256  # waiting requests beyond this get RESOURCE_EXHAUSTED
    timeout_ms: int = 30_000  # per-request deadline when the client sets none (0 = none)
    # New sequences join the running decode batch between steps. Off: a batch of up to
    # max_batch_size sequences runs to its end before the next one starts.
    in_flight: bool = True
    max_active_sequences: int = 64  # KV-cache capacity in decode rows (beams count each)
    token_budget: int = 4096  # decode rows + encoder tokens of joiners in one step
    # Engine instances (Triton's instance_group, CTranslate2's inter_threads): each has its own
    # KV cache, queue and decode thread, with the limits above (and its own sessions unless it has
    # one intra-op thread: then all share one set); a request goes to the least busy one.
    # intra_op_threads 0 then means the cores divided among the instances.
    instances: int = 1
    # A stream's messages leave at most every stream_interval_ms: the tokens decoded meanwhile
    # travel in one message (SGLang's stream_interval, in time). 0 = a message per decode step.
    # The first token and the last message are never held.
    stream_interval_ms: int = 0
    # Waiting requests join a running batch at most every join_interval_steps decode steps, so
    # that their encoder passes and cache writes run as one batch (TGI's max_waiting_tokens):
    # fewer, fuller runs for up to that many steps of waiting. They join an idle batch at once,
    # and at once when max_batch_size of them wait. 1 = at every step.
    join_interval_steps: int = 1
    # Start each greedy decode step before the last one's bookkeeping (streaming its tokens,
    # finishing sequences, metrics), on a thread of its own, so that this Python runs while the
    # device computes (vLLM's and SGLang's overlapped scheduling); waiting requests join after
    # such a step. The in-place KV cache only. Off by default: not yet measured on a GPU host.
    overlap_steps: bool = False
    # Decode greedy steps K at a time through the export's decoder_block graph (export
    # --decode-block K, 4 by default; vLLM's multi-step scheduling): one run, and one pass of the
    # engine's bookkeeping, per K tokens. Used while every running sequence decodes greedily and
    # has its first token, none waits to join and each has room for K more positions; tokens then
    # stream K at a time. None (auto): on where the entry has the graph and runs on the CPU
    # (measured there), off on a GPU until measured there; true: wherever the entry has it.
    decode_block: bool | None = None
    # Priority levels as in dynamic batching: waiting requests join the decode batch highest
    # priority first (first come first served within a level); running sequences are never
    # preempted. 0 = off. priority_queue_policy: levels with a queue of their own, as there.
    priority_levels: int = 0
    default_priority_level: int = 0
    priority_queue_policy: tuple[QueuePolicy, ...] = ()

    def __post_init__(self) -> None:
        _at_least_one(
            self,
            "max_batch_size",
            "max_active_sequences",
            "token_budget",
            "instances",
            "join_interval_steps",
        )
        _not_negative(self, "max_queue_size", "timeout_ms", "stream_interval_ms")
        _check_priorities(self)

    @property
    def decode_rows(self) -> int:
        """Rows of the decode batch (the KV cache's capacity in sequences, a beam per row)."""
        return self.max_active_sequences if self.in_flight else self.max_batch_size


def _at_least_one(section: object, *names: str) -> None:
    for name in names:
        if getattr(section, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(section, name)}")


def _check_priorities(section: DynamicBatching | InFlightBatching) -> None:
    levels, default = section.priority_levels, section.default_priority_level
    _not_negative(section, "priority_levels", "default_priority_level")
    if levels == 0 and default != 0:
        raise ValueError(
            f"default_priority_level {default} needs priority_levels >= {default}; "
            "set priority_levels, or default_priority_level 0 (priorities off)"
        )
    if levels > 0 and not 1 <= default <= levels:
        raise ValueError(
            f"default_priority_level must be 1..{levels} (priority_levels {levels}), got "
            f"{default}: the level of requests that set no priority"
        )
    seen: set[int] = set()
    for policy in section.priority_queue_policy:
        if not 1 <= policy.level <= levels:
            raise ValueError(
                f"priority_queue_policy names level {policy.level}; the levels are "
                + (f"1..{levels}" if levels else "off (priority_levels 0)")
            )
        if policy.level in seen:
            raise ValueError(f"priority_queue_policy names level {policy.level} twice")
        seen.add(policy.level)


def level_policy(level: int, policies: tuple[QueuePolicy, ...]) -> QueuePolicy | None:
    """The queue policy of its own that ``level`` has among ``policies``, if any."""
    return next((p for p in policies if p.level == level), None)


def level_timeout_ms(level: int, section: DynamicBatching | InFlightBatching) -> int:
    """The default deadline (ms, 0 = none) of a request queued at ``level``."""
    policy = level_policy(level, section.priority_queue_policy)
    return section.timeout_ms if policy is None else policy.timeout_ms


def priority_level(requested: int, section: DynamicBatching | InFlightBatching) -> int:
    """The queue level of a request asking for ``requested`` (Triton's rule): itself when it is
    1..priority_levels, else (0 = none asked, or above the levels) default_priority_level. 0
    when the model has no priority levels: every request is equal."""
    if 1 <= requested <= section.priority_levels:
        return requested
    return section.default_priority_level


def _not_negative(section: object, *names: str) -> None:
    for name in names:
        if getattr(section, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(section, name)}")


# --- what the graphs are ---------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderSpec:
    """What the generation engine needs to know about a seq2seq model's graphs."""

    num_layers: int
    num_heads: int
    head_dim: int
    vocab_size: int
    pad_id: int = 0
    eos_id: int = 2
    decoder_start_id: int = 1
    max_positions: int = 512  # decoder position table: past + new tokens must stay below
    # Token ids never generated (Hugging Face ``bad_words_ids`` of one token and
    # ``suppress_tokens``: Marian never generates its pad token).
    suppress_ids: tuple[int, ...] = ()
    # The last token a sequence may generate is EOS (Hugging Face ``forced_eos_token_id``).
    forced_eos: bool = False
    # Token sequences of two or more tokens never generated, in every request (Hugging Face
    # ``bad_words_ids`` of several tokens; ``serving.generation.history_rules``): the model's
    # requests take the per-row path.
    bad_words: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        bad = [i for i in self.suppress_ids if not 0 <= i < self.vocab_size or i == self.eos_id]
        if bad:
            raise ValueError(
                f"suppress_ids {bad} must be token ids below vocab_size {self.vocab_size}, "
                f"other than eos_id {self.eos_id}"
            )
        wrong = [
            list(w)
            for w in self.bad_words
            if len(w) < 2 or not all(0 <= i < self.vocab_size for i in w)
        ]
        if wrong:
            raise ValueError(
                f"bad_words {wrong} must be sequences of two or more token ids below vocab_size "
                f"{self.vocab_size} (one token: suppress_ids)"
            )


Resample = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"]


@dataclass(frozen=True)
class ImageSpec:
    """Preprocessing of encoded images: RGB, resized to size x size, (x/255 - mean) / std."""

    size: int
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    # PIL filter of the resize (Hugging Face image processors' ``resample``).
    resample: Resample = "bilinear"


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """How serving reads a generator's tokenizer files and turns request text into source text.

    ``kind`` names the files of the version folder (``contract.text.load_text_tokenizer``):
    ``subword``: tokenizer.json of ``contract.tokenizer.SubwordTokenizer`` (models trained here);
    ``sentencepiece``: source.spm, target.spm and vocab.json (Marian); ``huggingface``:
    tokenizer.json of the ``tokenizers`` library (GPT-2's byte-level BPE).
    """

    kind: Literal["subword", "sentencepiece", "huggingface"] = "subword"
    # Written before the source text, "{}" standing for the target language: "<2{}>" gives
    # "<2de> forty-two", ">>{}<<" Marian's multilingual tags; "" writes no tag.
    language_tag: str = "<2{}>"
    # Steps applied to request text before tagging and tokenizing, in order
    # (contract.normalize.NORMALIZER_STEPS); the same steps the model was trained with.
    normalizer: tuple[str, ...] = ()
    # sentencepiece: tokens matched in the text before SentencePiece runs and dropped when
    # decoding; the end-of-sequence token appended to every source; the token of pieces that
    # vocab.json lacks.
    special_tokens: tuple[str, ...] = ()
    eos_token: str = "</s>"
    unk_token: str = "<unk>"
    # Decoded text gets transformers' clean_up_tokenization (" ," -> ",", ...).
    clean_up_spaces: bool = False

    def __post_init__(self) -> None:
        if self.language_tag and self.language_tag.count("{}") != 1:
            raise ValueError(
                f"language_tag {self.language_tag!r} must hold one '{{}}' (the language) or be ''"
            )
        check_steps(self.normalizer)


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """ONNX Runtime session settings."""

    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (all physical cores)
    execution_providers: tuple[str, ...] = ("CPUExecutionProvider",)  # tried in order
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    # Idle intra-op threads busy-wait for the next parallel section. Off by default in a server:
    # the spinning threads take the cores the gRPC event loop needs between decode steps.
    allow_spinning: bool = False
    # With allow_spinning: how long an idle thread spins before it sleeps, in microseconds (ONNX
    # Runtime's session.intra_op.spin_duration_us); 0 = ONNX Runtime's own spin, which lasts
    # long enough to take a core from the event loop between decode steps.
    spin_duration_us: int = 0
    # ONNX Runtime's CPU memory arena grows to the largest batch it has seen and never shrinks
    # (a 10-minute soak grew 5.9 % in steps with it, 0.5 % without); off, buffers go back to the
    # allocator after each call.
    cpu_memory_arena: bool = False
    # Generators: "inplace" decodes with the fixed-capacity cache written in place on the
    # provider's device (decoder_inplace.onnx; falls back to "growing" for exports without it or
    # runtimes that cannot load it); "growing" feeds the whole cache every step (decoder.onnx).
    kv_cache: Literal["inplace", "growing"] = "inplace"
    # Generators on CUDA with the in-place cache: decode steps replayed as CUDA graphs (ONNX
    # Runtime's enable_cuda_graph), one graph per batch bucket (1, 2, 4, ... rows) and cache
    # widths. Does nothing elsewhere (the CPU, the growing cache, TensorRT, classifiers). On by
    # default since an H100 run (2026-11-26) measured every batch faster with the graphs
    # (Marian-base fp32 ms per step, without / with: batch 1 2.36 / 0.86, 16 2.47 / 1.51,
    # 64 3.87 / 3.08, 256 6.34 / 5.55); exports before then wrote false into config.yaml.
    cuda_graph: bool = True
    # CUDA: how cuDNN picks a convolution's algorithm for each new input shape (ONNX Runtime's
    # cudnn_conv_algo_search, a parameter of Triton's ONNX Runtime backend too): "exhaustive"
    # times every algorithm the first time a shape runs (ONNX Runtime's default), "heuristic"
    # takes cuDNN's estimate at once, "default" the plain default algorithm. A dynamic batcher
    # makes every batch size a new shape of the ViT's patch embedding.
    cudnn_conv_algo_search: Literal["exhaustive", "heuristic", "default"] = "exhaustive"

    def __post_init__(self) -> None:
        _not_negative(self, "intra_op_threads", "spin_duration_us")

    @property
    def on_cpu(self) -> bool:
        """The CPU provider is the first to try (the sessions run on the CPU)."""
        providers = self.execution_providers
        return not providers or providers[0] == "CPUExecutionProvider"

    @property
    def captures_cuda_graphs(self) -> bool:
        """``cuda_graph`` on, with the CUDA provider among those to try (elsewhere it does
        nothing)."""
        return self.cuda_graph and "CUDAExecutionProvider" in self.execution_providers


# --- versions ---------------------------------------------------------------------------------

# a bound on versions served at once: each holds its own sessions and engine
MAX_SERVED_VERSIONS = 16


@dataclass(frozen=True, kw_only=True)
class LatestVersions:
    """Serve the newest ``num_versions`` version folders."""

    num_versions: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.num_versions <= MAX_SERVED_VERSIONS:
            raise ValueError(
                f"num_versions must be 1..{MAX_SERVED_VERSIONS}, got {self.num_versions}"
            )


@dataclass(frozen=True, kw_only=True)
class AllVersions:
    """Serve every version folder (``all: {}``)."""


@dataclass(frozen=True, kw_only=True)
class SpecificVersions:
    """Serve these version folders (each must exist)."""

    versions: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.versions) <= MAX_SERVED_VERSIONS:
            raise ValueError(f"versions must list 1..{MAX_SERVED_VERSIONS} version numbers")
        if any(v < 0 for v in self.versions) or len(set(self.versions)) != len(self.versions):
            raise ValueError(f"versions must be distinct numbers >= 0, got {list(self.versions)}")


@dataclass(frozen=True, kw_only=True)
class VersionPolicy:
    """Which version folders of the entry are served at once (Triton's ``version_policy``):
    exactly one of ``latest``, ``all`` and ``specific``."""

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("latest", "all", "specific") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of latest: {num_versions: N}, all: {} and specific: "
                f"{{versions: [...]}} (got {', '.join(given) or 'none'})"
            )

    def select(self, available: list[int]) -> list[int]:
        """The served versions of an entry's ``available`` ones (ascending), ascending.

        Raises:
            ValueError: a ``specific`` version the entry lacks.
        """
        if self.specific is not None:
            missing = sorted(set(self.specific.versions) - set(available))
            if missing:
                raise ValueError(
                    f"version_policy.specific names version(s) {missing} that the entry lacks "
                    f"(it has {available}); export them or edit the list"
                )
            return sorted(self.specific.versions)
        if self.all is not None:
            return list(available)
        assert self.latest is not None
        return list(available[-self.latest.num_versions :])


def served_versions(policy: VersionPolicy | None, available: list[int]) -> list[int]:
    """The versions an entry with ``policy`` (None: the newest only) serves of ``available``."""
    return available[-1:] if policy is None else policy.select(available)


# --- one repository entry, by kind ------------------------------------------------------------

Backend = Literal["onnxruntime", "tensorrt"]
Precision = Literal["fp32", "fp16", "int8"]


@dataclass(frozen=True, kw_only=True)
class ClassifierConfig:
    """A classifier entry (the ViT): one graph, dynamic batching, labels."""

    name: str
    kind: Literal["classifier"] = "classifier"
    task: Literal["classification"] = "classification"
    input: Literal["image"] = "image"
    backend: Backend = "onnxruntime"
    precision: Precision = "fp32"  # what the graph holds
    limits: ClassifierLimits = field(default_factory=ClassifierLimits)
    batching: DynamicBatching = field(default_factory=DynamicBatching)
    image: ImageSpec  # preprocessing of encoded images
    labels: tuple[str, ...] = ()  # class names in logit order
    onnxruntime: OnnxRuntimeOptions = field(default_factory=OnnxRuntimeOptions)
    # KServe ModelInfer answers kept in the server's response cache (serving.response_cache)
    response_cache: bool = False
    # the version folders served at once (null: the newest; Triton's version_policy)
    version_policy: VersionPolicy | None = None

    def __post_init__(self) -> None:
        _instances_need_onnxruntime(self.batching.instances, self.backend)


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """An encoder-decoder entry (translator, captioner): KV-cache decoding, in-flight batching."""

    name: str
    kind: Literal["seq2seq"] = "seq2seq"
    task: Literal["translation", "captioning"]
    input: Literal["text", "image"]
    backend: Backend = "onnxruntime"
    precision: Precision = "fp32"  # what the graphs hold
    limits: GeneratorLimits = field(default_factory=GeneratorLimits)
    batching: InFlightBatching = field(default_factory=InFlightBatching)
    decoder: DecoderSpec  # what the decode loop needs to know about the graphs
    image: ImageSpec | None = None  # image inputs: preprocessing
    languages: tuple[str, ...] = ()  # translation: target languages (tagged as tokenizer says)
    # The tokenizer files and the source-text preparation (text in, text out).
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    onnxruntime: OnnxRuntimeOptions = field(default_factory=OnnxRuntimeOptions)
    # KServe ModelInfer answers kept in the server's response cache (serving.response_cache;
    # a sampled request without a seed never is)
    response_cache: bool = False
    # the version folders served at once (null: the newest; Triton's version_policy)
    version_policy: VersionPolicy | None = None

    def __post_init__(self) -> None:
        if self.input == "image" and self.image is None:
            raise ValueError("a model with image input needs an `image` section")
        _instances_need_onnxruntime(self.batching.instances, self.backend)

    @property
    def decodes_in_blocks(self) -> bool:
        """Whether the engine decodes in blocks where the entry has the graph
        (``batching.decode_block``: true, or unset and the sessions on the CPU)."""
        setting = self.batching.decode_block
        return setting is True or (setting is None and self.onnxruntime.on_cpu)


def _instances_need_onnxruntime(instances: int, backend: str) -> None:
    if instances > 1 and backend != "onnxruntime":
        raise ValueError(
            f"batching.instances {instances} needs backend onnxruntime (got {backend}); "
            "set instances to 1"
        )


ModelConfig = ClassifierConfig | GeneratorConfig
CONFIG_CLASSES: dict[str, type[ClassifierConfig] | type[GeneratorConfig]] = {
    "classifier": ClassifierConfig,
    "seq2seq": GeneratorConfig,
}

# Fields that config.yaml files written before the per-kind sections carried for every kind and
# that never applied to that kind; they are dropped on reading so older repositories still load.
# Top-level ones only when empty (``decoder: null``, ``labels: []``): a real decoder section on a
# classifier is a mistake worth an error.
_LEGACY_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "classifier": {
        "": ("decoder", "languages"),
        "limits": ("max_source_length", "max_new_tokens", "max_texts_per_request"),
        "batching": ("in_flight", "max_active_sequences", "token_budget"),
    },
    "seq2seq": {"": ("labels",), "batching": ("max_queue_delay_us",)},
}


def model_config_from_mapping(data: Any) -> ModelConfig:
    """A config.yaml mapping as the config class of its ``kind``.

    Raises:
        SchemaError: no or an unknown ``kind``, or a bad field (named by its path).
    """
    if not isinstance(data, dict):
        raise SchemaError(f"expected a mapping of fields, got {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in CONFIG_CLASSES:
        raise SchemaError(
            f"kind: must be one of {', '.join(map(repr, CONFIG_CLASSES))}, got {kind!r}"
        )
    return from_mapping(CONFIG_CLASSES[kind], _without_legacy_fields(kind, data))


def _without_legacy_fields(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    cleaned = dict(data)
    for section, names in _LEGACY_FIELDS[kind].items():
        if not section:
            for name in names:
                if name in cleaned and not cleaned[name]:
                    del cleaned[name]
        elif isinstance(cleaned.get(section), dict):
            cleaned[section] = {k: v for k, v in cleaned[section].items() if k not in names}
    return cleaned
