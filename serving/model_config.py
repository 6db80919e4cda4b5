"""The model repository's config.yaml: what a served model is and how it is batched.

Written by the export package, read by the server. Layout of a repository entry:

    REPOSITORY/NAME/config.yaml
    REPOSITORY/NAME/VERSION/encoder.onnx, decoder.onnx   (seq2seq)
    REPOSITORY/NAME/VERSION/model.onnx                   (classifier)
    REPOSITORY/NAME/VERSION/tokenizer.json, manifest.json, *.plan (TensorRT, when built)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from serving.schema import SchemaError, dump_yaml, load_yaml

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
CLASSIFIER_FILE = "model.onnx"

# A model name is a plain folder name: it can never be a path, hidden, empty or absurdly long.
MAX_MODEL_NAME_LENGTH = 128
MODEL_NAME_RULE = (
    f"1-{MAX_MODEL_NAME_LENGTH} characters of ASCII letters, digits, '.', '_' and '-', "
    "starting with a letter or digit"
)
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_valid_model_name(name: str) -> bool:
    """Whether ``name`` follows ``MODEL_NAME_RULE`` (so it cannot escape the repository)."""
    return len(name) <= MAX_MODEL_NAME_LENGTH and _MODEL_NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Limits:
    """Largest inputs a model accepts; larger requests are rejected with a clear status."""

    max_batch_size: int = 32  # most sequences / images in one graph call
    max_source_length: int = 64  # source tokens (translator) or encoder positions (captioner)
    max_new_tokens: int = 64  # generated tokens per sequence
    max_texts_per_request: int = 32  # texts in one Translate call
    max_image_bytes: int = 4 * 1024 * 1024  # encoded image size

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_source_length", "max_new_tokens", "max_image_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True)
class Batching:
    """Triton-style dynamic batching (one-shot work) and in-flight batching (decoding)."""

    max_batch_size: int = 32  # requests merged into one call
    # How long the first queued request waits for batch-mates. 0 (Triton's default too): a batch
    # leaves as soon as the model is free, and requests that arrive while it runs form the next
    # one, so batches grow with load without delaying a lone request.
    max_queue_delay_us: int = 0
    max_queue_size: int = 256  # queued requests beyond this get RESOURCE_EXHAUSTED
    timeout_ms: int = 30_000  # per-request deadline when the client sets none
    in_flight: bool = True  # seq2seq: new sequences join the running decode batch between steps
    max_active_sequences: int = 64  # KV-cache capacity in sequences (in-flight batching)
    token_budget: int = 4096  # most tokens (new prompt + decode) processed in one step

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_size < 0 or self.max_queue_delay_us < 0:
            raise ValueError(
                "max_batch_size must be >= 1, max_queue_size and max_queue_delay_us >= 0"
            )


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


@dataclass(frozen=True)
class ImageSpec:
    """Preprocessing of encoded images: RGB, resized to size x size, (x/255 - mean) / std."""

    size: int
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """ONNX Runtime session settings."""

    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (all physical cores)
    execution_providers: tuple[str, ...] = ("CPUExecutionProvider",)  # tried in order
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    # Idle intra-op threads busy-wait for the next parallel section. Off by default in a server:
    # the spinning threads take the cores the gRPC event loop needs between decode steps.
    allow_spinning: bool = False
    # ONNX Runtime's CPU memory arena grows to the largest batch it has seen and never shrinks
    # (a 10-minute soak grew 5.9 % in steps with it, 0.5 % without); off, buffers go back to the
    # allocator after each call.
    cpu_memory_arena: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """One entry of the model repository."""

    name: str
    kind: Literal["seq2seq", "classifier"]
    task: Literal["translation", "captioning", "classification"]
    input: Literal["text", "image"]
    backend: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    limits: Limits = field(default_factory=Limits)
    batching: Batching = field(default_factory=Batching)
    decoder: DecoderSpec | None = None  # seq2seq only
    image: ImageSpec | None = None  # image inputs only
    languages: tuple[str, ...] = ()  # translation: target languages, tagged "<2xx>"
    labels: tuple[str, ...] = ()  # classification: class names in logit order
    onnxruntime: OnnxRuntimeOptions = field(default_factory=OnnxRuntimeOptions)

    def __post_init__(self) -> None:
        if self.kind == "seq2seq" and self.decoder is None:
            raise ValueError("a seq2seq model needs a `decoder` section")
        if self.input == "image" and self.image is None:
            raise ValueError("an image model needs an `image` section")


def read_model_config(entry: str | Path) -> ModelConfig:
    """Read REPOSITORY/NAME/config.yaml.

    Raises:
        SchemaError: missing file or bad field, named.
    """
    return load_yaml(ModelConfig, Path(entry) / CONFIG_FILE)


def write_model_config(config: ModelConfig, entry: str | Path) -> Path:
    """Write REPOSITORY/NAME/config.yaml and return its path."""
    path = Path(entry) / CONFIG_FILE
    dump_yaml(config, path)
    return path


def version_dirs(entry: str | Path) -> list[int]:
    """The numeric version folders of an entry, ascending."""
    return sorted(
        int(p.name)
        for p in Path(entry).iterdir()
        if p.is_dir() and p.name.isascii() and p.name.isdigit()
    )


def resolve_version(entry: str | Path, version: int | None = None) -> Path:
    """The folder of ``version`` (default: the newest).

    Raises:
        SchemaError: when the entry has no such version.
    """
    versions = version_dirs(entry)
    if not versions:
        raise SchemaError(f"{entry} has no version folders (1/, 2/, ...); export a model into it")
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise SchemaError(f"{entry} has no version {chosen}; available: {versions}")
    return Path(entry) / str(chosen)
