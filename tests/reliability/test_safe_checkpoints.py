"""Weights load only from safetensors: no unpickling loader in the code, pickles are refused."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

from export.errors import SourceError
from export.hf import check_weight_files
from models import vit
from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("models", "export", "serving")
PICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
PICKLING_MODULES |= {"marshal"}
SAFE_PRETRAINED = ("Config", "Tokenizer", "Processor")  # JSON / text files, never weights


def _keyword_is_true(call: ast.Call, name: str) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _import_finding(node: ast.Import | ast.ImportFrom) -> str | None:
    if isinstance(node, ast.ImportFrom):
        if node.module == "torch" and any(a.name == "load" for a in node.names):
            return "from torch import load"
        modules = [node.module or ""]
    else:
        modules = [a.name for a in node.names]
    bad = [m for m in modules if m.split(".")[0] in PICKLING_MODULES]
    return f"imports {bad[0]}" if bad else None


def _call_finding(call: ast.Call) -> str | None:
    name = _dotted(call.func)
    if name == "torch.jit.load" or (
        name in ("torch.load", "torch.serialization.load")
        and not _keyword_is_true(call, "weights_only")
    ):
        return f"{name} without weights_only=True"
    if name.split(".")[0] in ("np", "numpy") and name.endswith(".load"):
        return f"{name}(allow_pickle=True)" if _keyword_is_true(call, "allow_pickle") else None
    if name.endswith("read_pickle"):
        return name
    pretrained = name.endswith(".from_pretrained") and not any(s in name for s in SAFE_PRETRAINED)
    if pretrained and not _keyword_is_true(call, "use_safetensors"):
        return f"{name} without use_safetensors=True"
    return None


def unsafe_loaders(source: str, filename: str = "<source>") -> list[str]:
    """Each place in ``source`` that could unpickle: 'file:line: what'."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        finding = None
        if isinstance(node, ast.Import | ast.ImportFrom):
            finding = _import_finding(node)
        elif isinstance(node, ast.Call):
            finding = _call_finding(node)
        if finding:
            found.append(f"{filename}:{node.lineno}: {finding}")
    return found


def test_no_unpickling_loader_in_models_export_serving() -> None:
    files = [p for package in SCANNED for p in sorted((ROOT / package).rglob("*.py"))]
    files = [p for p in files if "proto_gen" not in p.parts]
    assert len(files) > 50
    found = [f for p in files for f in unsafe_loaders(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize(
    "code",
    [
        "import pickle",
        "from joblib import load",
        "import torch\ntorch.load('w.pt')",
        "import torch\ntorch.load('w.pt', weights_only=False)",
        "from torch import load",
        "import numpy as np\nnp.load('a.npy', allow_pickle=True)",
        "import pandas as pd\npd.read_pickle('x')",
        "transformers.AutoModel.from_pretrained('dir')",
    ],
)
def test_the_scan_finds_unsafe_loaders(code: str) -> None:
    assert unsafe_loaders(code)


def test_the_scan_lets_safe_loaders_pass() -> None:
    code = (
        "torch.load('w.pt', weights_only=True)\nnp.load('a.npy')\n"
        "transformers.AutoConfig.from_pretrained('d')\n"
        "m.from_pretrained('d', local_files_only=True, use_safetensors=True)\n"
    )
    assert unsafe_loaders(code) == []


class Trap:
    """Unpickling this creates ``marker``: proof that a loader ran pickled code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def trap_files(folder: Path) -> dict[str, tuple[bytes, Path]]:
    """A plain pickle and a torch.save zip, each setting off its own marker when unpickled."""
    folder.mkdir(parents=True, exist_ok=True)
    payloads = {}
    for kind in ("pickle", "torch.save"):
        marker = folder / f"{kind}.fired"
        path = folder / f"{kind}.bin"
        if kind == "pickle":
            path.write_bytes(pickle.dumps({"weight": Trap(marker)}))
        else:
            torch.save({"weight": torch.zeros(2), "trap": Trap(marker)}, path)
        payloads[kind] = (path.read_bytes(), marker)
    pickle.loads(payloads["pickle"][0])  # the trap is live: loading it does fire
    assert payloads["pickle"][1].exists()
    payloads["pickle"][1].unlink()
    return payloads


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_a_pickle_posing_as_a_checkpoint_is_refused(tmp_path: Path, kind: str) -> None:
    checkpoint = tmp_path / "checkpoint"
    save_checkpoint(checkpoint, "vit", vit.ViT(vit.preset("tiny", image_size=32, patch_size=8)))
    payload, marker = trap_files(tmp_path / "traps")[kind]
    (checkpoint / "model.safetensors").write_bytes(payload)
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match config\.json"):
        load_checkpoint(checkpoint)
    assert not marker.exists(), "the checkpoint loader ran pickled code"


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_pickled_hugging_face_weights_are_refused(tmp_path: Path, kind: str) -> None:
    payload, marker = trap_files(tmp_path / "traps")[kind]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["MarianMTModel"]}')
    (model / "pytorch_model.bin").write_bytes(payload)
    with pytest.raises(SourceError, match=r"pytorch_model\.bin: pickled weights are not loaded"):
        check_weight_files(model)
    (model / "model.safetensors").write_bytes(payload)  # renamed, still a pickle
    with pytest.raises(SourceError, match=r"corrupt weights file model\.safetensors"):
        check_weight_files(model)
    assert not marker.exists(), "the Hugging Face import ran pickled code"
