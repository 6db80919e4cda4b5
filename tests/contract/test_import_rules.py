"""The layering of the packages (docs/architecture.md, "Layers"), checked two ways.

- Statically: every ``import`` in every module (function-level ones included) against the rules:
  ``contract`` imports none of the project's packages and no torch; ``serving`` imports no torch,
  ``models`` or ``export``; ``models`` imports no ``export`` or ``serving``; ``export`` reaches
  ``serving`` only through ``export/serving_runner.py``; nothing but ``benchmarks`` imports
  ``benchmarks``.
- Dynamically: a fresh interpreter with torch, transformers, ``models`` and ``export`` made
  unimportable imports every module of ``contract`` and ``serving``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "models", "export", "serving", "benchmarks")
TORCH_STACK = ("torch", "transformers", "onnxscript", "safetensors.torch")
SERVING_TIE = "export/serving_runner.py"


@dataclass(frozen=True)
class Rule:
    """Modules under ``package`` may not import ``forbidden`` (top-level names or dotted)."""

    package: str
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()  # files (relative to ROOT) the rule does not apply to
    why: str = ""


RULES = (
    Rule("contract", (*PACKAGES, *TORCH_STACK), why="contract is the bottom layer"),
    Rule("serving", ("models", "export", "benchmarks", *TORCH_STACK), why="serving is torch-free"),
    Rule("models", ("export", "serving", "benchmarks"), why="models sits below export"),
    Rule(
        "export",
        ("serving", "benchmarks"),
        exempt=(SERVING_TIE,),
        why="export reaches serving only through its parity runner",
    ),
)


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source`` (``module``: its dotted name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _matches(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


def violations(files: dict[str, str]) -> list[str]:
    """Broken rules in ``files`` (path relative to ROOT -> source), one line each."""
    broken = []
    for path, source in sorted(files.items()):
        module = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        for rule in RULES:
            if not _matches(module, rule.package) or path in rule.exempt:
                continue
            for line, name in imported_modules(source, module):
                bad = next((f for f in rule.forbidden if _matches(name, f)), None)
                if bad is not None and not _matches(name, rule.package):
                    broken.append(f"{path}:{line} imports {name} ({rule.why})")
    return broken


def project_files() -> dict[str, str]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            files[str(path.relative_to(ROOT))] = path.read_text()
    return files


def test_the_project_keeps_its_layers() -> None:
    files = project_files()
    assert any(p.startswith("contract/") for p in files) and len(files) > 50
    assert violations(files) == []


def test_export_ties_to_serving_in_one_module() -> None:
    importers = {
        path
        for path, source in project_files().items()
        if path.startswith("export/")
        and any(_matches(name, "serving") for _, name in imported_modules(source, path))
    }
    assert importers == {SERVING_TIE}


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("contract/x.py", "import torch\n", "contract/x.py:1 imports torch"),
        ("contract/x.py", "from serving.errors import X\n", "imports serving.errors"),
        (
            "serving/a/b.py",
            "def f():\n    from models.data import shapes\n",
            "b.py:2 imports models",
        ),
        ("serving/x.py", "from transformers import AutoModel\n", "imports transformers"),
        ("models/x.py", "from export import spec\n", "imports export"),
        ("export/parity.py", "from serving.seq2seq import Seq2SeqRunner\n", "imports serving"),
        ("models/train/x.py", "from ...serving import runtime\n", "x.py:1 imports serving "),
        ("serving/x.py", "import benchmarks.loadgen\n", "imports benchmarks.loadgen"),
    ],
)
def test_a_broken_rule_is_reported(path: str, source: str, expected: str) -> None:
    (line,) = violations({path: source})
    assert expected in line


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("export/serving_runner.py", "from serving.seq2seq import Seq2SeqRunner\n"),
        ("export/x.py", "import torch\nfrom models.vit import ViT\nfrom contract import graphs\n"),
        ("serving/x.py", "from serving.errors import X\nfrom contract.graphs import kv_names\n"),
        ("benchmarks/x.py", "import torch\nfrom export.exporter import export\n"),
        ("serving/x.py", "import torchvision_like_name_but_not_torch\n"),
    ],
)
def test_allowed_imports_pass(path: str, source: str) -> None:
    assert violations({path: source}) == []


BLOCKED_IMPORT = """
import importlib, pkgutil, sys
BLOCKED = ("torch", "transformers", "onnxscript", "models", "export", "benchmarks")

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: serving and contract must not import it")
        return None

sys.meta_path.insert(0, Blocker())
imported = []
for package in ("contract", "serving"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
print(len(imported))
"""


def test_serving_and_contract_import_with_torch_blocked() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BLOCKED_IMPORT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 40  # every module, not an empty walk
