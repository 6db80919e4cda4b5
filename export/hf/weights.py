"""HF weight files and the mapping of HF weights onto our state dicts.

Only safetensors are read: pickled ``*.bin`` weights can run code when loaded, so they are refused
with a hint to re-save. ``Weights`` assembles our state dict from the HF one and remembers which
HF tensors it used: every HF weight must land somewhere or be checked redundant (tied copies, the
fixed sinusoidal table), so that nothing the HF model computes with is silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from export.errors import SourceError
from export.hf.common import read_json

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# transformers 4.x ViT parameter names -> the 5.x names the mappings use.
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


# --- weight files ------------------------------------------------------------------------------


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
    """The shard files named by a weights index, each checked to exist."""
    data = read_json(index)
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


# --- weight mapping ----------------------------------------------------------------------------


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


class Weights:
    """Our state dict, assembled from a HF state dict; remembers which HF tensors it used.

    Args:
        hf_model: The loaded HF model; its state dict is read under the transformers 5 names
            (``current_param_name``) so that one mapping serves both major versions.
        architecture: The HF architecture name, for error messages.
    """

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
        """The HF tensor ``name``, marked used.

        Raises:
            SourceError: when the HF model has no such weight.
        """
        if name not in self.hf:
            raise SourceError(
                f"unsupported {self.architecture}: expected weight {name!r} is not in the model"
            )
        self.used.add(name)
        return self.hf[name]

    def has(self, name: str) -> bool:
        """Whether the HF model has the weight ``name`` (does not mark it used)."""
        return name in self.hf

    def copy(self, ours: str, theirs: str) -> None:
        """Our tensor ``ours`` is the HF tensor ``theirs`` as it is."""
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
        """nn.LayerNorm -> nn.LayerNorm (weight and bias)."""
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
        """``name`` must hold the same values as ``reference`` (a tied copy); marks it used.

        Raises:
            SourceError: when ``name`` exists and differs; our models tie these weights.
        """
        if self.has(name) and not torch.equal(self.get(name), self.get(reference)):
            raise SourceError(
                f"unsupported {self.architecture}: {what} ({name}) is not tied to {reference}; "
                "our model ties them"
            )

    def ignore(self, pattern: str) -> None:
        """Mark the HF tensors whose name matches ``pattern`` as deliberately unused."""
        self.used.update(name for name in self.hf if re.search(pattern, name))

    def load_into(self, model: nn.Module) -> None:
        """Load the assembled state dict; refuse HF weights that landed nowhere.

        Raises:
            SourceError: for leftover HF weights, or a state dict that does not fit ``model``.
        """
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


def map_attention(weights: Weights, ours: str, theirs: str, out_name: str = "out_proj") -> None:
    """HF attention with separate q/k/v/output projections -> our attention block.

    Args:
        weights: The mapping being assembled.
        ours: Our attention module's prefix.
        theirs: The HF attention module's prefix.
        out_name: The HF name of the output projection ("o_proj" in ViT).

    Raises:
        SourceError: when a projection weight is missing (a missing bias becomes zeros).
    """
    for projection in _ATTENTION_PROJECTIONS:
        source = out_name if projection == "out_proj" else projection
        weights.linear(f"{ours}.{projection}", f"{theirs}.{source}", bias_optional=True)
