"""Import Hugging Face models from local ``save_pretrained`` directories into our model classes.

The HF model is loaded with ``transformers`` from the directory only (``local_files_only``,
safetensors weights; never the hub), then its weights are copied into the matching model of
``models`` so that the rest of the export path (graph specs, parity, repository) is unchanged:

- ``MarianMTModel`` -> ``models.translator.Translator`` (post-norm, sinusoidal positions, shared
  embeddings tied to the LM head, ``final_logits_bias``);
- ``ViTForImageClassification`` -> ``models.vit.ViT`` (pre-norm, class token, learned positions);
- ``VisionEncoderDecoderModel`` with a ViT encoder and a GPT-2 decoder (pre-norm, learned
  positions without offset, final norm, tied LM head: the shape of our captioner's decoder)
  -> ``models.captioner.Captioner``.

Everything the target model cannot express (another norm placement, an embedding norm, an untied
LM head, an activation we do not have, ...) is refused with a ``SourceError`` that names it,
rather than imported into a model that computes something else. Every HF weight must land
somewhere or be checked redundant (tied copies, the fixed sinusoidal table): leftovers are refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from export.errors import SourceError
from export.sources import LoadedSource, directory_checksum
from models.captioner import Captioner, CaptionerConfig
from models.layers import sinusoidal_table
from models.translator import Translator, TranslatorConfig
from models.vit import ViT, ViTConfig

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "MarianMTModel",
    "ViTForImageClassification",
    "VisionEncoderDecoderModel",
)
SUPPORTED_CAPTION_DECODERS: tuple[str, ...] = ("gpt2",)
# config.json without "architectures": the model_type decides.
MODEL_TYPES: dict[str, str] = {
    "marian": "MarianMTModel",
    "vit": "ViTForImageClassification",
    "vision-encoder-decoder": "VisionEncoderDecoderModel",
}
# HF activation names (transformers' ACT2FN) whose function is exactly one of ``models.layers``.
HF_ACTIVATIONS: dict[str, str] = {"gelu": "gelu", "relu": "relu", "swish": "swish", "silu": "silu"}
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
DEFAULT_MAX_NEW_TOKENS = 128  # serving limit when generation_config.json names none
POSITION_TOLERANCE = 1e-5  # HF's sinusoidal table against ours
KINDS: dict[str, str] = {
    "MarianMTModel": "translator",
    "ViTForImageClassification": "vit",
    "VisionEncoderDecoderModel": "captioner",
}
# transformers 4.x ViT parameter names -> the 5.x names the mappings below use.
_LEGACY_VIT_NAMES: tuple[tuple[str, str], ...] = (
    (r"(^|\.)encoder\.layer\.(\d+)\.", r"\1layers.\2."),
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
)
_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def load_hf_directory(directory: Path) -> LoadedSource:
    """Load a Hugging Face ``save_pretrained`` directory as one of our models.

    Args:
        directory: A local directory with config.json and safetensors weights.

    Returns:
        The imported model (eval mode) with kind "translator", "vit" or "captioner", no tokenizer
        of ours (``hf_tokenizer_dir`` points at the directory, whose tokenizer files are HF's) and
        a checksum over the directory's .safetensors and .json files.

    Raises:
        SourceError: for an unsupported architecture or configuration, missing or corrupt
            weights, or a missing ``transformers`` package; the message says which and why.
    """
    directory = Path(directory)
    architecture = hf_architecture(_read_json(directory / "config.json"))
    transformers = _import_transformers()
    hf_config = _load_hf_config(transformers, directory)
    builder = _BUILDERS[architecture]
    our_model = builder.make_model(hf_config, directory)
    weight_files = check_weight_files(directory)
    hf_model = _load_hf_model(transformers, architecture, directory, weight_files)
    builder.copy_weights(hf_model, our_model)
    return LoadedSource(
        kind=KINDS[architecture],
        model=our_model.eval(),
        tokenizer=None,
        origin=str(directory),
        checksum=directory_checksum(directory, (".safetensors", ".json")),
        hf_tokenizer_dir=directory,
        extra={"hf_architecture": architecture, "transformers": transformers.__version__},
    )


def hf_architecture(config: dict[str, Any]) -> str:
    """The supported architecture named by a config.json: ``architectures[0]`` or ``model_type``.

    Args:
        config: The parsed config.json.

    Returns:
        One of ``SUPPORTED_ARCHITECTURES``.

    Raises:
        SourceError: for any other architecture, listing the supported ones.
    """
    architectures = config.get("architectures") or []
    if architectures:
        name = str(architectures[0])
    else:
        model_type = str(config.get("model_type", ""))
        name = MODEL_TYPES.get(model_type, f"model_type {model_type!r}")
    if name not in SUPPORTED_ARCHITECTURES:
        raise SourceError(
            f"unsupported Hugging Face architecture {name!r}; supported: "
            + ", ".join(SUPPORTED_ARCHITECTURES)
        )
    return name


def check_weight_files(directory: Path) -> list[Path]:
    """The safetensors weight files of ``directory``, each checked to be readable.

    Args:
        directory: A ``save_pretrained`` directory.

    Returns:
        model.safetensors, or the shards named by model.safetensors.index.json.

    Raises:
        SourceError: when there are no safetensors weights (pickled ``*.bin`` weights are not
            loaded), a shard is missing, or a file is corrupt or truncated; names the file.
    """
    single = directory / WEIGHTS_FILE
    index = directory / WEIGHTS_INDEX
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = _shards(index)
    else:
        pickled = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (found {', '.join(pickled)}: pickled weights are not loaded)" if pickled else ""
        raise SourceError(
            f"{directory} has no {WEIGHTS_FILE} nor {WEIGHTS_INDEX}{hint}; re-save the model "
            "with save_pretrained(..., safe_serialization=True)"
        )
    for path in files:
        _check_safetensors(path)
    return files


def _shards(index: Path) -> list[Path]:
    data = _read_json(index)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise SourceError(f"corrupt weights index {index.name} in {index.parent}: no weight_map")
    files = [index.parent / name for name in sorted(set(map(str, weight_map.values())))]
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise SourceError(
            f"{index.name} in {index.parent} names missing weight files: {', '.join(missing)}"
        )
    return files


def _check_safetensors(path: Path) -> None:
    """Open ``path`` and read every tensor's header; truncated or garbled files fail here."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                handle.get_slice(name).get_shape()
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise SourceError(
            f"corrupt weights file {path.name} in {path.parent}: {err}; re-save the model with "
            "save_pretrained(..., safe_serialization=True)"
        ) from err


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SourceError(f"{path.parent} has no {path.name}") from None
    except (OSError, ValueError) as err:
        raise SourceError(f"{path.name} in {path.parent} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise SourceError(f"{path.name} in {path.parent} is not a JSON object")
    return data


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise SourceError(
            "importing a Hugging Face model needs the transformers package: "
            "pip install 'transformers>=4.50'"
        ) from err
    return transformers


def _load_hf_config(transformers: Any, directory: Path) -> Any:
    try:
        return transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # transformers raises many types for a bad config
        raise SourceError(f"cannot read the Hugging Face config in {directory}: {err}") from err


def _load_hf_model(
    transformers: Any, architecture: str, directory: Path, weight_files: list[Path]
) -> nn.Module:
    """``from_pretrained`` on the local directory; every weight the model needs must be there."""
    names = ", ".join(p.name for p in weight_files)
    model_class = getattr(transformers, architecture)
    try:
        model, info = model_class.from_pretrained(
            directory, local_files_only=True, use_safetensors=True, output_loading_info=True
        )
    except Exception as err:  # safetensors, torch and transformers errors alike
        raise SourceError(
            f"cannot load {architecture} weights from {names} in {directory}: {err}"
        ) from err
    problems = _loading_problems(info)
    if problems:
        raise SourceError(f"weights in {names} ({directory}) do not match config.json: {problems}")
    return model.eval()


def _loading_problems(info: dict[str, Any]) -> str:
    """Missing or wrongly shaped weights reported by ``from_pretrained`` ('' when none).

    Marian's sinusoidal tables are not stored: transformers computes them, so they do not count.
    """
    missing = sorted(k for k in info.get("missing_keys", ()) if "embed_positions" not in k)
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:8])}")
    if mismatched:
        parts.append(f"wrong shape {', '.join(mismatched[:8])}")
    return "; ".join(parts)


# --- weight mapping ----------------------------------------------------------------------------


class _Weights:
    """Our state dict, assembled from a HF state dict; remembers which HF tensors it used."""

    def __init__(self, hf_model: nn.Module, architecture: str) -> None:
        self.architecture = architecture
        self.hf = {
            current_param_name(name): tensor.detach().float()
            if tensor.is_floating_point()
            else tensor
            for name, tensor in hf_model.state_dict().items()
        }
        self.used: set[str] = set()
        self.ours: dict[str, Tensor] = {}

    def get(self, name: str) -> Tensor:
        """The HF tensor ``name``, marked used."""
        if name not in self.hf:
            raise SourceError(
                f"unsupported {self.architecture}: expected weight {name!r} is not in the model"
            )
        self.used.add(name)
        return self.hf[name]

    def has(self, name: str) -> bool:
        return name in self.hf

    def copy(self, ours: str, theirs: str) -> None:
        self.ours[ours] = self.get(theirs)

    def linear(self, ours: str, theirs: str, *, bias_optional: bool = False) -> None:
        """nn.Linear -> nn.Linear; a missing bias (``qkv_bias=False``) becomes zeros."""
        weight = self.get(f"{theirs}.weight")
        self.ours[f"{ours}.weight"] = weight
        if bias_optional and not self.has(f"{theirs}.bias"):
            self.ours[f"{ours}.bias"] = weight.new_zeros(weight.shape[0])
        else:
            self.copy(f"{ours}.bias", f"{theirs}.bias")

    def layer_norm(self, ours: str, theirs: str) -> None:
        self.copy(f"{ours}.weight", f"{theirs}.weight")
        self.copy(f"{ours}.bias", f"{theirs}.bias")

    def conv1d(self, ours: Iterable[str], theirs: str) -> None:
        """GPT-2 ``Conv1D`` (weight (in, k * out)) -> k nn.Linear layers (weight (out, in))."""
        targets = list(ours)
        weights = self.get(f"{theirs}.weight").chunk(len(targets), dim=1)
        biases = self.get(f"{theirs}.bias").chunk(len(targets), dim=0)
        for target, weight, bias in zip(targets, weights, biases, strict=True):
            self.ours[f"{target}.weight"] = weight.t().contiguous()
            self.ours[f"{target}.bias"] = bias

    def check_tied(self, name: str, reference: str, what: str) -> None:
        """``name`` must hold the same values as ``reference`` (a tied copy); marks it used."""
        if self.has(name) and not torch.equal(self.get(name), self.get(reference)):
            raise SourceError(
                f"unsupported {self.architecture}: {what} ({name}) is not tied to {reference}; "
                "our model ties them"
            )

    def ignore(self, pattern: str) -> None:
        """Mark the HF tensors whose name matches ``pattern`` as deliberately unused."""
        self.used.update(name for name in self.hf if re.search(pattern, name))

    def load_into(self, model: nn.Module) -> None:
        """Load the assembled state dict; refuse HF weights that landed nowhere."""
        leftovers = sorted(set(self.hf) - self.used)
        if leftovers:
            shown = ", ".join(leftovers[:8]) + (" ..." if len(leftovers) > 8 else "")
            raise SourceError(
                f"unsupported {self.architecture}: {len(leftovers)} weights have no counterpart "
                f"in our {type(model).__name__}: {shown}"
            )
        try:
            model.load_state_dict(self.ours, strict=True)
        except RuntimeError as err:
            raise SourceError(
                f"unsupported {self.architecture}: its weights do not fit our "
                f"{type(model).__name__}: {err}"
            ) from err


def current_param_name(name: str) -> str:
    """A transformers 4.x ViT parameter name in its 5.x spelling; other names are unchanged.

    Args:
        name: A HF state-dict key.

    Returns:
        The key as transformers 5 names it (``vit.layers.0.attention.q_proj.weight``, ...).
    """
    for pattern, replacement in _LEGACY_VIT_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


def _map_attention(weights: _Weights, ours: str, theirs: str, out_name: str = "out_proj") -> None:
    for projection in _ATTENTION_PROJECTIONS:
        source = out_name if projection == "out_proj" else projection
        weights.linear(f"{ours}.{projection}", f"{theirs}.{source}", bias_optional=True)


# --- shared config checks ----------------------------------------------------------------------


def _unsupported(architecture: str, what: str) -> SourceError:
    return SourceError(f"unsupported {architecture}: {what}")


def _activation(architecture: str, name: Any, where: str = "activation") -> str:
    if name not in HF_ACTIVATIONS:
        raise _unsupported(
            architecture,
            f"{where} {name!r} has no exact counterpart in our layers; supported: "
            + ", ".join(sorted(HF_ACTIVATIONS)),
        )
    return HF_ACTIVATIONS[name]


def _token_id(architecture: str, field: str, *candidates: Any) -> int:
    """The first candidate that is set; a one-element list counts as its element."""
    for value in candidates:
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            raise _unsupported(architecture, f"{field}={value!r} (need one token id)")
    raise _unsupported(architecture, f"no {field} in config.json; set it")


def _require_equal(architecture: str, what: str, first: tuple[str, Any], second: tuple[str, Any]):
    if first[1] != second[1]:
        raise _unsupported(
            architecture,
            f"{what}: {first[0]}={first[1]!r} but {second[0]}={second[1]!r}; our model shares one",
        )


def _max_new_tokens(directory: Path, max_positions: int) -> int:
    """The serving limit on new tokens: generation_config.json's, else a default; fits positions."""
    path = directory / "generation_config.json"
    data = _read_json(path) if path.is_file() else {}
    limit = DEFAULT_MAX_NEW_TOKENS
    if isinstance(data.get("max_new_tokens"), int):
        limit = data["max_new_tokens"]
    elif isinstance(data.get("max_length"), int):
        limit = data["max_length"] - 1  # max_length counts the start token
    return max(1, min(limit, max_positions - 1))


# --- MarianMTModel -> Translator ---------------------------------------------------------------

_MARIAN = "MarianMTModel"
_MARIAN_REFUSED_FLAGS = (
    "normalize_before",
    "add_final_layer_norm",
    "normalize_embedding",
    "layernorm_embedding",
    "add_bias_logits",
)


def translator_config(hf: Any, directory: Path) -> TranslatorConfig:
    """Our TranslatorConfig for a HF ``MarianConfig``.

    Args:
        hf: The HF config.
        directory: The source directory (for generation_config.json).

    Returns:
        The config of the matching post-norm translator.

    Raises:
        SourceError: for anything our translator cannot express.
    """
    for flag in _MARIAN_REFUSED_FLAGS:
        if getattr(hf, flag, False):
            raise _unsupported(
                _MARIAN,
                f"{flag}=true (our translator is post-norm, without embedding or final "
                "layer norms or a logits bias layer)",
            )
    if not getattr(hf, "share_encoder_decoder_embeddings", True):
        raise _unsupported(_MARIAN, "separate encoder and decoder embeddings (we share one)")
    decoder_vocab = getattr(hf, "decoder_vocab_size", None) or hf.vocab_size
    _require_equal(
        _MARIAN, "vocabulary", ("vocab_size", hf.vocab_size), ("decoder_vocab_size", decoder_vocab)
    )
    _require_equal(
        _MARIAN,
        "attention heads",
        ("encoder_attention_heads", hf.encoder_attention_heads),
        ("decoder_attention_heads", hf.decoder_attention_heads),
    )
    _require_equal(
        _MARIAN,
        "feed-forward width",
        ("encoder_ffn_dim", hf.encoder_ffn_dim),
        ("decoder_ffn_dim", hf.decoder_ffn_dim),
    )
    pad_id = _token_id(_MARIAN, "pad_token_id", hf.pad_token_id)
    max_positions = int(hf.max_position_embeddings)
    return TranslatorConfig(
        vocab_size=int(hf.vocab_size),
        d_model=int(hf.d_model),
        num_heads=int(hf.encoder_attention_heads),
        encoder_layers=int(hf.encoder_layers),
        decoder_layers=int(hf.decoder_layers),
        ffn_dim=int(hf.encoder_ffn_dim),
        max_positions=max_positions,
        dropout=0.0,
        norm_first=False,
        activation=_activation(_MARIAN, hf.activation_function, "activation_function"),
        scale_embedding=bool(hf.scale_embedding),
        layer_norm_eps=1e-5,  # MarianEncoderLayer / MarianDecoderLayer: nn.LayerNorm defaults
        pad_id=pad_id,
        eos_id=_token_id(_MARIAN, "eos_token_id", hf.eos_token_id),
        decoder_start_id=_token_id(
            _MARIAN, "decoder_start_token_id", hf.decoder_start_token_id, pad_id
        ),
        max_source_length=max_positions,
        max_target_length=_max_new_tokens(directory, max_positions),
    )


def _make_translator(hf: Any, directory: Path) -> nn.Module:
    return Translator(translator_config(hf, directory))


def _copy_marian(hf_model: nn.Module, model: nn.Module) -> None:
    config: TranslatorConfig = model.config
    weights = _Weights(hf_model, _MARIAN)
    shared = "model.shared.weight"
    weights.copy("embed_tokens.weight", shared)
    weights.copy("decoder.embed_tokens.weight", shared)
    for name, what in (
        ("model.encoder.embed_tokens.weight", "the encoder embedding"),
        ("model.decoder.embed_tokens.weight", "the decoder embedding"),
        ("lm_head.weight", "the LM head"),
    ):
        weights.check_tied(name, shared, what)
    for side in ("encoder", "decoder"):
        _check_sinusoidal(weights, f"model.{side}.embed_positions.weight", config)
    for i in range(config.encoder_layers):
        _map_marian_layer(weights, f"encoder.layers.{i}", f"model.encoder.layers.{i}", False)
    for i in range(config.decoder_layers):
        _map_marian_layer(weights, f"decoder.layers.{i}", f"model.decoder.layers.{i}", True)
    weights.copy("decoder.final_logits_bias", "final_logits_bias")
    weights.load_into(model)


def _check_sinusoidal(weights: _Weights, name: str, config: TranslatorConfig) -> None:
    theirs = weights.get(name)
    ours = sinusoidal_table(config.max_positions, config.d_model)
    worst = (theirs - ours).abs().max().item() if theirs.shape == ours.shape else math.inf
    if not worst <= POSITION_TOLERANCE:
        raise _unsupported(
            _MARIAN,
            f"{name} is not the [sin | cos] sinusoidal table our translator uses "
            f"(max abs diff {worst:.3g})",
        )


def _map_marian_layer(weights: _Weights, ours: str, theirs: str, decoder: bool) -> None:
    _map_attention(weights, f"{ours}.self_attn", f"{theirs}.self_attn")
    weights.layer_norm(f"{ours}.self_attn_norm", f"{theirs}.self_attn_layer_norm")
    if decoder:
        _map_attention(weights, f"{ours}.cross_attn", f"{theirs}.encoder_attn")
        weights.layer_norm(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
    weights.linear(f"{ours}.ffn.fc1", f"{theirs}.fc1")
    weights.linear(f"{ours}.ffn.fc2", f"{theirs}.fc2")
    weights.layer_norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")


# --- ViTForImageClassification -> ViT ----------------------------------------------------------

_VIT = "ViTForImageClassification"


def _vit_geometry(architecture: str, hf: Any) -> dict[str, Any]:
    """The ViT encoder fields shared by ViTConfig and CaptionerConfig."""
    image_size = _square(architecture, "image_size", hf.image_size)
    patch_size = _square(architecture, "patch_size", hf.patch_size)
    if int(hf.num_channels) != 3:
        raise _unsupported(architecture, f"num_channels={hf.num_channels} (serving feeds RGB)")
    head_dim = getattr(hf, "head_dim", None)
    if head_dim is not None and head_dim * hf.num_attention_heads != hf.hidden_size:
        raise _unsupported(architecture, f"head_dim={head_dim} * heads != hidden_size")
    if image_size % patch_size:
        raise _unsupported(architecture, f"image_size {image_size} % patch_size {patch_size} != 0")
    return {"image_size": image_size, "patch_size": patch_size, "num_channels": 3}


def _square(architecture: str, field: str, value: Any) -> int:
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise _unsupported(architecture, f"non-square {field}={list(value)}")
        value = value[0]
    return int(value)


def image_normalisation(directory: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pixel mean and std from preprocessor_config.json, in our ``(x / 255 - mean) / std`` form.

    Args:
        directory: The source directory.

    Returns:
        (mean, std), 0.5 each when there is no preprocessor_config.json.

    Raises:
        SourceError: for a preprocessing our pipeline does not do (another rescale factor).
    """
    path = directory / "preprocessor_config.json"
    if not path.is_file():
        return (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    data = _read_json(path)
    rescale = float(data.get("rescale_factor", 1 / 255)) if data.get("do_rescale", True) else 1.0
    if not math.isclose(rescale, 1 / 255, rel_tol=1e-6):
        raise SourceError(
            f"unsupported {path.name} in {directory}: rescale factor {rescale} (serving "
            "divides pixels by 255)"
        )
    if not data.get("do_normalize", True):
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return _per_channel(path, data, "image_mean"), _per_channel(path, data, "image_std")


def _per_channel(path: Path, data: dict[str, Any], field: str) -> tuple[float, ...]:
    value = data.get(field, 0.5)
    values = [value] * 3 if isinstance(value, (int, float)) else list(value)
    if len(values) != 3:
        raise SourceError(f"{field} in {path} must have 3 entries, got {value!r}")
    return tuple(float(v) for v in values)


def vit_config(hf: Any, directory: Path) -> ViTConfig:
    """Our ViTConfig for a HF ``ViTConfig`` (and preprocessor_config.json).

    Args:
        hf: The HF config.
        directory: The source directory.

    Returns:
        The config of the matching ViT classifier.

    Raises:
        SourceError: for anything our ViT cannot express.
    """
    num_labels = int(hf.num_labels)
    if num_labels < 1:
        raise _unsupported(_VIT, "no classifier head (num_labels=0)")
    id2label = {int(k): str(v) for k, v in (hf.id2label or {}).items()}
    labels = tuple(id2label.get(i, str(i)) for i in range(num_labels))
    mean, std = image_normalisation(directory)
    return ViTConfig(
        **_vit_geometry(_VIT, hf),
        d_model=int(hf.hidden_size),
        num_heads=int(hf.num_attention_heads),
        num_layers=int(hf.num_hidden_layers),
        ffn_dim=int(hf.intermediate_size),
        num_classes=num_labels,
        dropout=0.0,
        activation=_activation(_VIT, hf.hidden_act, "hidden_act"),
        layer_norm_eps=float(hf.layer_norm_eps),
        labels=labels,
        image_mean=mean,
        image_std=std,
    )


def _make_vit(hf: Any, directory: Path) -> nn.Module:
    return ViT(vit_config(hf, directory))


def _map_vit_encoder(weights: _Weights, ours: str, theirs: str, num_layers: int) -> None:
    """HF ViTModel (prefix ``theirs``) -> our VisionEncoder (prefix ``ours``)."""
    weights.copy(f"{ours}.cls_token", f"{theirs}.embeddings.cls_token")
    positions = weights.get(f"{theirs}.embeddings.position_embeddings")  # (1, N + 1, D)
    weights.ours[f"{ours}.positions.weight"] = positions.reshape(-1, positions.shape[-1])
    patches = f"{theirs}.embeddings.patch_embeddings.projection"
    weights.linear(f"{ours}.patch_embed.projection", patches)
    for i in range(num_layers):
        dst, src = f"{ours}.encoder.layers.{i}", f"{theirs}.layers.{i}"
        _map_attention(weights, f"{dst}.self_attn", f"{src}.attention", out_name="o_proj")
        weights.layer_norm(f"{dst}.self_attn_norm", f"{src}.layernorm_before")
        weights.linear(f"{dst}.ffn.fc1", f"{src}.mlp.fc1")
        weights.linear(f"{dst}.ffn.fc2", f"{src}.mlp.fc2")
        weights.layer_norm(f"{dst}.ffn_norm", f"{src}.layernorm_after")
    weights.layer_norm(f"{ours}.encoder.final_norm", f"{theirs}.layernorm")


def _copy_vit(hf_model: nn.Module, model: nn.Module) -> None:
    weights = _Weights(hf_model, _VIT)
    _map_vit_encoder(weights, "encoder", "vit", model.config.num_layers)
    weights.linear("head", "classifier")
    weights.load_into(model)


# --- VisionEncoderDecoderModel (ViT + GPT-2) -> Captioner --------------------------------------

_VED = "VisionEncoderDecoderModel"


def captioner_config(hf: Any, directory: Path) -> CaptionerConfig:
    """Our CaptionerConfig for a HF ``VisionEncoderDecoderConfig`` (ViT encoder, GPT-2 decoder).

    Args:
        hf: The HF config.
        directory: The source directory.

    Returns:
        The config of the matching captioner.

    Raises:
        SourceError: for another encoder or decoder, or anything our captioner cannot express
            (it shares width, heads, feed-forward width, activation and layer-norm epsilon
            between encoder and decoder).
    """
    encoder, decoder = hf.encoder, hf.decoder
    if encoder.model_type != "vit":
        raise _unsupported(_VED, f"encoder {encoder.model_type!r}; supported: vit")
    if decoder.model_type not in SUPPORTED_CAPTION_DECODERS:
        raise SourceError(
            f"unsupported decoder {decoder.model_type!r} in {_VED}; supported: "
            + ", ".join(SUPPORTED_CAPTION_DECODERS)
        )
    _check_gpt2_decoder(decoder)
    ffn_dim = decoder.n_inner if decoder.n_inner is not None else 4 * decoder.n_embd
    activation = _activation(_VED, encoder.hidden_act, "encoder hidden_act")
    for what, first, second in (
        (
            "width (no encoder-to-decoder projection)",
            ("encoder hidden_size", encoder.hidden_size),
            ("decoder n_embd", decoder.n_embd),
        ),
        (
            "attention heads",
            ("encoder num_attention_heads", encoder.num_attention_heads),
            ("decoder n_head", decoder.n_head),
        ),
        (
            "feed-forward width",
            ("encoder intermediate_size", encoder.intermediate_size),
            ("decoder n_inner", ffn_dim),
        ),
        (
            "activation",
            ("encoder hidden_act", encoder.hidden_act),
            ("decoder activation_function", decoder.activation_function),
        ),
        (
            "layer-norm epsilon",
            ("encoder layer_norm_eps", encoder.layer_norm_eps),
            ("decoder layer_norm_epsilon", decoder.layer_norm_epsilon),
        ),
    ):
        _require_equal(_VED, what, first, second)
    generation = _generation_ids(directory)
    eos_id = _token_id(
        _VED,
        "eos_token_id",
        getattr(hf, "eos_token_id", None),
        decoder.eos_token_id,
        generation.get("eos_token_id"),
    )
    max_positions = int(decoder.n_positions)
    mean, std = image_normalisation(directory)
    return CaptionerConfig(
        **_vit_geometry(_VED, encoder),
        d_model=int(encoder.hidden_size),
        num_heads=int(encoder.num_attention_heads),
        encoder_layers=int(encoder.num_hidden_layers),
        decoder_layers=int(decoder.n_layer),
        ffn_dim=int(ffn_dim),
        vocab_size=int(decoder.vocab_size),
        max_positions=max_positions,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=float(encoder.layer_norm_eps),
        pad_id=_token_id(
            _VED,
            "pad_token_id",
            getattr(hf, "pad_token_id", None),
            decoder.pad_token_id,
            generation.get("pad_token_id"),
            eos_id,
        ),
        eos_id=eos_id,
        decoder_start_id=_token_id(
            _VED,
            "decoder_start_token_id",
            getattr(hf, "decoder_start_token_id", None),
            generation.get("decoder_start_token_id"),
            decoder.bos_token_id,
        ),
        max_target_length=_max_new_tokens(directory, max_positions),
        image_mean=mean,
        image_std=std,
    )


def _check_gpt2_decoder(decoder: Any) -> None:
    if not getattr(decoder, "add_cross_attention", False):
        raise _unsupported(_VED, "the GPT-2 decoder has no cross-attention (add_cross_attention)")
    if not getattr(decoder, "scale_attn_weights", True):
        raise _unsupported(_VED, "scale_attn_weights=false (we scale by 1/sqrt(head_dim))")
    if getattr(decoder, "scale_attn_by_inverse_layer_idx", False):
        raise _unsupported(_VED, "scale_attn_by_inverse_layer_idx=true")
    cross_size = getattr(decoder, "cross_attention_hidden_size", None)
    if cross_size not in (None, decoder.n_embd):
        raise _unsupported(_VED, f"cross_attention_hidden_size={cross_size} != n_embd")


def _generation_ids(directory: Path) -> dict[str, Any]:
    path = directory / "generation_config.json"
    return _read_json(path) if path.is_file() else {}


def _make_captioner(hf: Any, directory: Path) -> nn.Module:
    return Captioner(captioner_config(hf, directory))


def _copy_captioner(hf_model: nn.Module, model: nn.Module) -> None:
    config: CaptionerConfig = model.config
    weights = _Weights(hf_model, _VED)
    _map_vit_encoder(weights, "encoder", "encoder", config.encoder_layers)
    weights.ignore(r"^encoder\.pooler\.")  # ViTModel's pooler: unused by the decoder
    _map_gpt2_decoder(weights, "decoder", "decoder", config.decoder_layers)
    weights.load_into(model)


def _map_gpt2_decoder(weights: _Weights, ours: str, theirs: str, num_layers: int) -> None:
    """HF GPT2LMHeadModel with cross-attention (prefix ``theirs``) -> our TransformerDecoder."""
    body = f"{theirs}.transformer"
    embedding = f"{body}.wte.weight"
    weights.copy(f"{ours}.embed_tokens.weight", embedding)
    weights.copy(f"{ours}.positions.weight", f"{body}.wpe.weight")
    for i in range(num_layers):
        dst, src = f"{ours}.layers.{i}", f"{body}.h.{i}"
        self_attn, cross = f"{dst}.self_attn", f"{dst}.cross_attn"
        weights.conv1d(
            [f"{self_attn}.q_proj", f"{self_attn}.k_proj", f"{self_attn}.v_proj"],
            f"{src}.attn.c_attn",
        )
        weights.conv1d([f"{self_attn}.out_proj"], f"{src}.attn.c_proj")
        weights.layer_norm(f"{dst}.self_attn_norm", f"{src}.ln_1")
        weights.conv1d([f"{cross}.q_proj"], f"{src}.crossattention.q_attn")
        weights.conv1d([f"{cross}.k_proj", f"{cross}.v_proj"], f"{src}.crossattention.c_attn")
        weights.conv1d([f"{cross}.out_proj"], f"{src}.crossattention.c_proj")
        weights.layer_norm(f"{dst}.cross_attn_norm", f"{src}.ln_cross_attn")
        weights.conv1d([f"{dst}.ffn.fc1"], f"{src}.mlp.c_fc")
        weights.conv1d([f"{dst}.ffn.fc2"], f"{src}.mlp.c_proj")
        weights.layer_norm(f"{dst}.ffn_norm", f"{src}.ln_2")
    weights.layer_norm(f"{ours}.final_norm", f"{body}.ln_f")
    # transformers 4.x keeps the causal mask as buffers named attn.bias / attn.masked_bias.
    weights.ignore(r"\.(attn|crossattention)\.(bias|masked_bias)$")
    weights.check_tied(f"{theirs}.lm_head.weight", embedding, "the LM head")
    vocab = weights.get(embedding).shape[0]
    if weights.has(f"{theirs}.lm_head.bias"):
        weights.ours[f"{ours}.final_logits_bias"] = weights.get(f"{theirs}.lm_head.bias")[None]
    else:
        weights.ours[f"{ours}.final_logits_bias"] = torch.zeros(1, vocab)


class _Builder:
    """How one architecture becomes one of our models."""

    def __init__(
        self,
        make_model: Callable[[Any, Path], nn.Module],
        copy_weights: Callable[[nn.Module, nn.Module], None],
    ) -> None:
        self.make_model = make_model
        self.copy_weights = copy_weights


_BUILDERS: dict[str, _Builder] = {
    "MarianMTModel": _Builder(_make_translator, _copy_marian),
    "ViTForImageClassification": _Builder(_make_vit, _copy_vit),
    "VisionEncoderDecoderModel": _Builder(_make_captioner, _copy_captioner),
}
