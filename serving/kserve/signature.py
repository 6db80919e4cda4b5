"""A model's KServe tensors: names, datatypes and shapes of its inputs and outputs, by task.

The table in the package docstring (``serving.kserve``) is what ``signature`` returns.
``Signature.inputs`` are the inputs ModelMetadata and ModelConfig declare, as Triton would
declare them: one string per batch item is BYTES with dims [1] (shape [-1, 1]). Load generators
such as perf_analyzer fill every declared input with generated data, so a model declares only
inputs whose generated data is valid: the image models declare their decoded-image input
``image`` (UINT8 HWC: any bytes are valid pixels). ``Signature.alternatives`` are further forms
a request may use instead (encoded PNG / JPEG bytes, normalised pixels) and optional inputs whose
generated data would not be valid (a generator's target prefix); they are accepted, and
ModelConfig lists them in its ``also_accepts`` parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.model_config import ClassifierConfig, GeneratorConfig, ModelConfig
from serving.kserve.tensors import BYTES, format_shape
from serving.proto_gen.inference import grpc_service_pb2 as pb

ONE_PER_ITEM = (1,)  # Triton's dims of a one-element-per-batch-item input (a string)
# a generator's optional text input its outputs start with (the attnserve API's field names)
PREFIX_INPUT = {"translation": "target_prefix", "captioning": "prefix"}
# a generator's optional lists of strings for the whole request (the attnserve API's
# DecodingOptions fields): BYTES [K], not one per item
WORD_INPUTS = ("bad_words", "stop")
# a generator's targets to score (``ServedGenerator.score``): with it the request is scored,
# not decoded; one string per element, accepted, not declared (as the prefix)
SCORE_INPUT = "target"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model.

    Attributes:
        name: tensor name.
        datatype: the advertised KServe datatype.
        dims: shape without the batch dimension; -1 = any size. BYTES inputs with dims [1]
            also accept shape [N] (one element per item either way).
        optional: an input that may be left out.
        accepts: every datatype accepted for an input (defaults to ``datatype`` only).
        layout: Triton's input format: "NCHW", "NHWC" or "" (none).
        per_item: the first dimension is the batch (N); False: a list for the whole request
            (K elements).
    """

    name: str
    datatype: str
    dims: tuple[int, ...] = ()
    optional: bool = False
    accepts: tuple[str, ...] = ()
    layout: str = ""
    per_item: bool = True

    @property
    def shape(self) -> tuple[int, ...]:
        """The full shape clients see: batch dimension -1 first."""
        return (-1, *self.dims)

    @property
    def datatypes(self) -> tuple[str, ...]:
        """The datatypes a request may send this tensor as."""
        return self.accepts or (self.datatype,)

    def shape_text(self) -> str:
        """The shape as messages show it: ``[N,3,32,32]``."""
        return format_shape(self.shape).replace("-1", "N" if self.per_item else "K", 1)

    def describe(self) -> str:
        """``'pixel_values' (FP32 [N,3,32,32])``."""
        return f"{self.name!r} ({'/'.join(self.datatypes)} {self.shape_text()})"

    def metadata(self) -> pb.ModelMetadataResponse.TensorMetadata:
        """The tensor as ModelMetadata declares it."""
        return pb.ModelMetadataResponse.TensorMetadata(
            name=self.name, datatype=self.datatype, shape=list(self.shape)
        )


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs as the KServe protocol shows them.

    Attributes:
        inputs: the declared inputs (ModelMetadata, ModelConfig).
        outputs: the outputs.
        alternatives: further accepted forms of inputs, not declared.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    alternatives: tuple[TensorSpec, ...] = ()

    @property
    def accepted(self) -> tuple[TensorSpec, ...]:
        """Every accepted input form: the declared ones first."""
        return self.inputs + self.alternatives

    def input(self, name: str) -> TensorSpec | None:
        """The declared input ``name``, else its first accepted form (None: unknown)."""
        return next((spec for spec in self.accepted if spec.name == name), None)

    def input_form(self, name: str, datatype: str) -> TensorSpec | None:
        """The accepted form of input ``name`` sent as ``datatype`` (None: not accepted)."""
        forms = [spec for spec in self.accepted if spec.name == name]
        return next((spec for spec in forms if datatype in spec.datatypes), None)

    def output(self, name: str) -> TensorSpec | None:
        """The output ``name`` (None: unknown)."""
        return next((spec for spec in self.outputs if spec.name == name), None)


def float_datatype(config: ModelConfig) -> str:
    """The pixel datatype of the graph: FP16 for an fp16 export, else FP32."""
    return "FP16" if config.precision == "fp16" else "FP32"


def _image_forms(size: int, optional: bool) -> tuple[TensorSpec, TensorSpec]:
    """The image input: decoded RGB pixels (declared) and encoded PNG / JPEG bytes."""
    decoded = TensorSpec("image", "UINT8", (size, size, 3), optional=optional, layout="NHWC")
    encoded = TensorSpec("image", BYTES, ONE_PER_ITEM, optional=optional)
    return decoded, encoded


def signature(config: ModelConfig) -> Signature:
    """The KServe tensors of a model, by task (see the module docstring).

    Args:
        config: the model's configuration.

    Returns:
        Its declared inputs, outputs and alternative input forms.
    """
    token_ids = TensorSpec("token_ids", "INT32", (-1,))
    if isinstance(config, ClassifierConfig):
        size = config.image.size
        decoded, encoded = _image_forms(size, optional=True)
        pixels = TensorSpec(
            "pixel_values",
            float_datatype(config),
            (3, size, size),
            optional=True,
            accepts=("FP32", "FP16"),
            layout="NCHW",
        )
        classes = len(config.labels) or -1
        return Signature(
            inputs=(decoded,),
            outputs=(TensorSpec("probabilities", "FP32", (classes,)), TensorSpec("label", BYTES)),
            alternatives=(encoded, pixels),
        )
    if config.task == "translation":
        return Signature(
            inputs=(
                TensorSpec("text", BYTES, ONE_PER_ITEM),
                TensorSpec("target_language", BYTES, ONE_PER_ITEM, optional=True),
            ),
            outputs=(TensorSpec("translation", BYTES), token_ids),
            alternatives=(_prefix(config), _target(), *_word_lists()),
        )
    size = config.image.size if config.image is not None else -1
    decoded, encoded = _image_forms(size, optional=False)
    return Signature(
        inputs=(decoded,),
        outputs=(TensorSpec("caption", BYTES), token_ids),
        alternatives=(encoded, _prefix(config), _target(), *_word_lists()),
    )


def _prefix(config: ModelConfig) -> TensorSpec:
    """A generator's target prefix input: accepted, not declared (generic clients such as
    perf_analyzer fill every declared input with generated strings)."""
    return TensorSpec(PREFIX_INPUT[config.task], BYTES, ONE_PER_ITEM, optional=True)


def _target() -> TensorSpec:
    """A generator's target to score (``SCORE_INPUT``): accepted, not declared."""
    return TensorSpec(SCORE_INPUT, BYTES, ONE_PER_ITEM, optional=True)


def _word_lists() -> tuple[TensorSpec, ...]:
    """A generator's bad words and stop strings: accepted, not declared (generated strings
    would ban or stop on noise), BYTES [K] for the whole request."""
    return tuple(TensorSpec(name, BYTES, (), optional=True, per_item=False) for name in WORD_INPUTS)


def max_batch(config: ModelConfig) -> int:
    """The most elements (N) one request may carry."""
    if isinstance(config, GeneratorConfig) and config.task == "translation":
        return min(config.limits.max_batch_size, config.limits.max_texts_per_request)
    return config.limits.max_batch_size


def platform(config: ModelConfig) -> str:
    """Triton's platform name of the model's graphs."""
    return "tensorrt_plan" if config.backend == "tensorrt" else "onnxruntime_onnx"
