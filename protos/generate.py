#!/usr/bin/env python3
"""Generate the Python gRPC code for every ``.proto`` under ``protos/`` into ``serving/proto_gen/``.

Usage::

    python protos/generate.py           # (re)write serving/proto_gen/
    python protos/generate.py --check   # exit 1 and list the stale files if it is out of date

``grpc_tools.protoc`` writes ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` in the layout of
the proto import paths (``attnserve/v1/attnserve_pb2.py``, ``inference/grpc_service_pb2.py``)
with absolute imports between them (``from attnserve.v1 import attnserve_pb2``), which only work
when the output folder itself is on ``sys.path``. This script then fixes the output so it works
as the package ``serving.proto_gen``:

- every import of a module generated here becomes a relative import (``from . import
  attnserve_pb2``); imports of anything else (``google.protobuf``) are left alone;
- the module name given to the protobuf builder becomes ``__name__``, so message classes carry
  their real ``__module__`` (pickle and multiprocessing need it);
- every folder gets an ``__init__.py``;
- the ``inference`` protos (package ``inference``, the KServe v2 / Triton protocol) are loaded
  into a private descriptor pool instead of the process-wide default one. tritonclient, KServe
  and Triton's Python packages register the very same message names (``inference.ModelInferRequest``
  and so on) in the default pool, and protobuf refuses a second definition of a name; the
  private pool lets our server and those clients share one process. The wire format does not
  depend on the pool.

The output is deterministic: the same protos and the same grpcio-tools version give
byte-identical files. ``--check`` generates into a temporary folder and compares.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
OUTPUT_DIR = REPO_ROOT / "serving" / "proto_gen"

# The committed code was generated with this version (pinned in pyproject.toml's dev extra);
# another version writes other version stamps, so --check would report every file as stale.
EXPECTED_GRPCIO_TOOLS = "1.81.1"

# Top-level proto folders loaded into a private descriptor pool (see the module docstring).
ISOLATED_PACKAGES = frozenset({"inference"})

IGNORED_NAMES = frozenset({"__pycache__"})

ROOT_INIT = '"""Generated gRPC code for the protos under protos/.\n\n{note}\n"""\n'
PACKAGE_INIT = '"""Generated package. {note}"""\n'
ISOLATED_INIT = (
    '"""Generated package, loaded into its own descriptor pool.\n\n{note}\n\n'
    "Protobuf refuses two definitions of one message name in a pool, and tritonclient / KServe\n"
    "register the same ``inference.*`` names in the default pool; this private pool keeps both\n"
    'usable in one process.\n"""\n\n'
    "from google.protobuf import descriptor_pool as _descriptor_pool\n\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
)
DO_NOT_EDIT = "Do not edit: run `python protos/generate.py`."

DEFAULT_POOL_CALL = "_descriptor_pool.Default().AddSerializedFile("
BUILDER_MODULE_NAME = re.compile(
    r"^(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'[\w.]+'(, _globals\))$",
    re.MULTILINE,
)
FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<package>[\w.]+) import (?P<rest>\w+ as \w+)$"
)
PLAIN_IMPORT = re.compile(r"^(?P<indent>[ \t]*)import (?P<module>\w+) as (?P<alias>\w+)$")
PB2_IMPORT = re.compile(r"^from (?P<package>[\w.]+) import (?P<module>\w+_pb2) as ", re.MULTILINE)


class GenerationError(RuntimeError):
    """protoc failed, or its output no longer looks the way this script expects."""


def find_protos(proto_root: Path) -> list[PurePosixPath]:
    """Every ``.proto`` file under ``proto_root``, as sorted import paths (relative, POSIX)."""
    return sorted(
        PurePosixPath(path.relative_to(proto_root).as_posix())
        for path in proto_root.rglob("*.proto")
    )


def run_protoc(proto_root: Path, protos: Sequence[PurePosixPath], out_dir: Path) -> None:
    """Run grpc_tools' protoc on ``protos`` and write the raw output into ``out_dir``.

    Raises:
        GenerationError: if protoc reports an error.
    """
    from grpc_tools import protoc  # dev-only dependency: imported here so --help needs none

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_root}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(proto_root / proto) for proto in protos),
    ]
    if protoc.main(args) != 0:
        raise GenerationError(f"protoc failed on {', '.join(map(str, protos))} (see above)")


def generated_modules(protos: Sequence[PurePosixPath]) -> dict[str, tuple[str, ...]]:
    """Map each dotted module name protoc writes for ``protos`` to its folder parts.

    ``attnserve/v1/attnserve.proto`` gives ``attnserve.v1.attnserve_pb2`` and
    ``attnserve.v1.attnserve_pb2_grpc``, both in ``("attnserve", "v1")``.
    """
    modules: dict[str, tuple[str, ...]] = {}
    for proto in protos:
        folder = proto.parent.parts
        for suffix in ("_pb2", "_pb2_grpc"):
            modules[".".join((*folder, proto.stem + suffix))] = folder
    return modules


def relative_package(from_folder: tuple[str, ...], to_folder: tuple[str, ...]) -> str:
    """The relative package (``.``, ``..inference``, ...) from one generated folder to another."""
    common = 0
    while (
        common < min(len(from_folder), len(to_folder)) and from_folder[common] == to_folder[common]
    ):
        common += 1
    return "." * (len(from_folder) - common + 1) + ".".join(to_folder[common:])


def fix_imports(source: str, folder: tuple[str, ...], modules: dict[str, tuple[str, ...]]) -> str:
    """Rewrite absolute imports of generated modules in ``source`` into relative imports.

    Args:
        source: a generated ``.py`` or ``.pyi`` file.
        folder: the file's folder parts inside the output root.
        modules: the generated modules, from :func:`generated_modules`.

    Returns:
        The source with ``from a.b import x_pb2 as y`` / ``import x_pb2 as y`` lines that name a
        generated module turned into ``from <relative> import x_pb2 as y``.
    """
    lines = []
    for line in source.split("\n"):
        from_match = FROM_IMPORT.match(line)
        plain_match = PLAIN_IMPORT.match(line)
        if from_match:
            imported = from_match["rest"].split(" ")[0]
            target = modules.get(f"{from_match['package']}.{imported}")
            if target is not None:
                package = relative_package(folder, target)
                line = f"{from_match['indent']}from {package} import {from_match['rest']}"
        elif plain_match and plain_match["module"] in modules:
            package = relative_package(folder, modules[plain_match["module"]])
            line = (
                f"{plain_match['indent']}from {package} import "
                f"{plain_match['module']} as {plain_match['alias']}"
            )
        lines.append(line)
    return "\n".join(lines)


def use_module_name(source: str, path: Path) -> str:
    """Give the protobuf builder ``__name__`` instead of the import-path module name."""
    source, count = BUILDER_MODULE_NAME.subn(r"\1__name__\2", source)
    if count != 1:
        raise GenerationError(f"{path}: expected one BuildTopDescriptorsAndMessages call")
    return source


def use_private_pool(source: str, path: Path, folder: tuple[str, ...]) -> str:
    """Load a ``_pb2.py`` file's descriptors into the private ``POOL`` of its top-level package.

    Args:
        source: the ``_pb2.py`` source, imports already made relative.
        path: the file, for error messages.
        folder: the file's folder parts inside the output root; ``folder[0]`` is isolated.

    Raises:
        GenerationError: if the file imports a proto from outside its package (such as a
            ``google/protobuf`` well-known type): that file is not in the private pool, so the
            module would fail at import time.
    """
    for match in PB2_IMPORT.finditer(source):
        dots = len(match["package"]) - len(match["package"].lstrip("."))
        if dots == 0 or dots > len(folder):
            raise GenerationError(
                f"{path}: imports {match['package']}.{match['module']}, which is outside the "
                f"private descriptor pool of package {folder[0]!r}; isolated protos may only "
                "import protos of their own package"
            )
    if source.count(DEFAULT_POOL_CALL) != 1:
        raise GenerationError(f"{path}: expected one {DEFAULT_POOL_CALL!r}")
    pool_package = relative_package(folder, folder[:1])
    return source.replace(
        "DESCRIPTOR = " + DEFAULT_POOL_CALL,
        f"from {pool_package} import POOL as _POOL  # private pool, see protos/generate.py\n\n"
        "DESCRIPTOR = _POOL.AddSerializedFile(",
    )


def postprocess(out_dir: Path, protos: Sequence[PurePosixPath]) -> None:
    """Turn protoc's raw output in ``out_dir`` into the importable package (see module docs)."""
    modules = generated_modules(protos)
    for path in sorted(out_dir.rglob("*")):
        if not path.is_file():
            continue
        folder = path.relative_to(out_dir).parent.parts
        source = fix_imports(path.read_text(encoding="utf-8"), folder, modules)
        if path.name.endswith("_pb2.py"):
            source = use_module_name(source, path)
            if folder and folder[0] in ISOLATED_PACKAGES:
                source = use_private_pool(source, path, folder)
        path.write_text(source, encoding="utf-8", newline="\n")
    write_init_files(out_dir)


def write_init_files(out_dir: Path) -> None:
    """Write an ``__init__.py`` into ``out_dir`` and each folder under it."""
    folders = sorted(path for path in out_dir.rglob("*") if path.is_dir())
    for folder in [out_dir, *folders]:
        parts = folder.relative_to(out_dir).parts
        if not parts:
            text = ROOT_INIT.format(note=DO_NOT_EDIT)
        elif len(parts) == 1 and parts[0] in ISOLATED_PACKAGES:
            text = ISOLATED_INIT.format(note=DO_NOT_EDIT)
        else:
            text = PACKAGE_INIT.format(note=DO_NOT_EDIT)
        (folder / "__init__.py").write_text(text, encoding="utf-8", newline="\n")


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate the package for every proto under ``proto_root`` into the empty ``out_dir``.

    Returns:
        The files written, relative to ``out_dir``, sorted.

    Raises:
        GenerationError: if there are no protos, protoc fails or its output is unexpected.
    """
    protos = find_protos(proto_root)
    if not protos:
        raise GenerationError(f"no .proto files under {proto_root}")
    run_protoc(proto_root, protos, out_dir)
    postprocess(out_dir, protos)
    return tree_files(out_dir)


def tree_files(root: Path) -> list[Path]:
    """Files under ``root`` (relative, sorted), leaving out ``__pycache__`` folders."""
    if not root.is_dir():
        return []
    files = (path.relative_to(root) for path in root.rglob("*") if path.is_file())
    return sorted(path for path in files if not IGNORED_NAMES.intersection(path.parts))


def stale_files(expected: Path, actual: Path) -> list[Path]:
    """Files that differ between two trees: changed, missing from ``actual`` or extra in it."""
    expected_files = set(tree_files(expected))
    actual_files = set(tree_files(actual))
    stale = expected_files ^ actual_files
    stale.update(
        path
        for path in expected_files & actual_files
        if (expected / path).read_bytes() != (actual / path).read_bytes()
    )
    return sorted(stale)


def check_tools_version() -> bool:
    """Whether grpcio-tools is installed; warns on stderr when it is not the pinned version."""
    try:
        installed = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        print(
            f"error: grpcio-tools is not installed; install grpcio-tools=={EXPECTED_GRPCIO_TOOLS} "
            "(the dev extra: pip install -e '.[dev]').",
            file=sys.stderr,
        )
        return False
    if installed != EXPECTED_GRPCIO_TOOLS:
        print(
            f"warning: grpcio-tools {installed} is installed, but serving/proto_gen/ is "
            f"generated with grpcio-tools=={EXPECTED_GRPCIO_TOOLS} (pyproject.toml pins it); "
            "the output differs between versions.",
            file=sys.stderr,
        )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list the stale files if "
        f"{OUTPUT_DIR.relative_to(REPO_ROOT)}/ is out of date",
    )
    args = parser.parse_args(argv)
    if not check_tools_version():
        return 2
    display = OUTPUT_DIR.relative_to(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="proto_gen_") as tmp:
        fresh = Path(tmp) / "proto_gen"
        fresh.mkdir()
        try:
            generate(fresh)
        except GenerationError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        stale = stale_files(fresh, OUTPUT_DIR)
        if args.check:
            if stale:
                print(f"{display}/ is out of date; run `python protos/generate.py`. Stale files:")
                for path in stale:
                    print(f"  {display / path}")
                return 1
            print(f"{display}/ is up to date ({len(tree_files(fresh))} files).")
            return 0
        if OUTPUT_DIR.exists():
            shutil.rmtree(OUTPUT_DIR)
        shutil.copytree(fresh, OUTPUT_DIR)
    print(f"wrote {display}/ ({len(stale)} files changed).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
