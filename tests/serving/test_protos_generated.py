"""The generated code under serving/proto_gen: in sync with protos/ (``protos/generate.py
--check``), importable as a package, exposing both services, picklable, and kept out of the
default descriptor pool (where tritonclient registers its own ``inference`` messages)."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool

from serving.proto_gen.attnserve.v1 import attnserve_pb2, attnserve_pb2_grpc
from serving.proto_gen.inference import grpc_service_pb2, grpc_service_pb2_grpc
from tests.serving.proto_descriptors import (
    ATTNSERVE_METHODS,
    GENERATE,
    REPO_ROOT,
    TRITON_METHODS,
    load_generate_script,
    make_infer_request,
    render_methods,
)


def test_generated_code_is_in_sync() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    result = subprocess.run(
        [sys.executable, str(GENERATE), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_changed_missing_and_extra_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    generate = load_generate_script()
    copy = tmp_path / "serving" / "proto_gen"
    shutil.copytree(generate.OUTPUT_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(generate, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(generate, "OUTPUT_DIR", copy)
    assert generate.main(["--check"]) == 0

    (copy / "attnserve" / "v1" / "attnserve_pb2.py").write_text("# edited by hand\n")
    (copy / "inference" / "grpc_service_pb2.pyi").unlink()
    (copy / "inference" / "old_pb2.py").write_text("")
    capsys.readouterr()
    assert generate.main(["--check"]) == 1
    report = capsys.readouterr().out
    for name in ("attnserve_pb2.py", "grpc_service_pb2.pyi", "old_pb2.py"):
        assert name in report
    assert "grpc_service_pb2.py\n" not in report


@pytest.mark.parametrize(
    ("folder", "line", "expected"),
    [
        (
            ("attnserve", "v1"),
            "from attnserve.v1 import attnserve_pb2 as attnserve_dot_v1_dot_attnserve__pb2",
            "from . import attnserve_pb2 as attnserve_dot_v1_dot_attnserve__pb2",
        ),
        (
            ("attnserve", "v1"),
            "from inference import grpc_service_pb2 as _grpc_service_pb2",
            "from ...inference import grpc_service_pb2 as _grpc_service_pb2",
        ),
        ((), "import top_pb2 as top__pb2", "from . import top_pb2 as top__pb2"),
        (
            ("attnserve", "v1"),
            "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
            "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
        ),
    ],
)
def test_generator_makes_imports_of_generated_modules_relative(
    folder: tuple[str, ...], line: str, expected: str
) -> None:
    generate = load_generate_script()
    modules = {
        "attnserve.v1.attnserve_pb2": ("attnserve", "v1"),
        "inference.grpc_service_pb2": ("inference",),
        "top_pb2": (),
    }
    assert generate.fix_imports(line, folder, modules) == expected


def test_generated_modules_import_as_package_and_expose_services() -> None:
    for module, service in [
        (attnserve_pb2_grpc, "AttnServe"),
        (grpc_service_pb2_grpc, "GRPCInferenceService"),
    ]:
        for name in (f"{service}Stub", f"{service}Servicer", f"add_{service}Servicer_to_server"):
            assert callable(getattr(module, name)), f"{module.__name__}.{name}"

    attnserve = attnserve_pb2.DESCRIPTOR.services_by_name["AttnServe"]
    assert attnserve.full_name == "attnserve.v1.AttnServe"
    assert render_methods(attnserve) == ATTNSERVE_METHODS
    inference = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert inference.full_name == "inference.GRPCInferenceService"
    assert render_methods(inference) == TRITON_METHODS


def test_generated_messages_carry_their_module_and_pickle() -> None:
    request = attnserve_pb2.TranslateRequest(texts=["forty two"], target_language="de")
    assert type(request).__module__ == attnserve_pb2.__name__
    assert pickle.loads(pickle.dumps(request)) == request
    infer = make_infer_request()
    assert type(infer).__module__ == grpc_service_pb2.__name__
    assert pickle.loads(pickle.dumps(infer)) == infer


def test_inference_protos_stay_out_of_the_default_descriptor_pool() -> None:
    """tritonclient registers inference.* in the default pool; ours must not collide with it."""
    from serving.proto_gen.inference import POOL, grpc_service_pb2

    # Our definitions live in a private pool (the default one may hold tritonclient's by now).
    assert grpc_service_pb2.DESCRIPTOR.pool is POOL
    assert POOL is not descriptor_pool.Default()
    # A Triton-like definition in the default pool first, then our module: both must load.
    # A fresh interpreter, so the fake never meets a real tritonclient in this one.
    script = (
        "from google.protobuf import descriptor_pb2, descriptor_pool\n"
        "proto = descriptor_pb2.FileDescriptorProto(\n"
        "    name='grpc_service.proto', package='inference', syntax='proto3')\n"
        "message = proto.message_type.add(name='ModelInferRequest')\n"
        "message.field.add(name='model_name', number=1, type=9, label=1)\n"
        "descriptor_pool.Default().AddSerializedFile(proto.SerializeToString())\n"
        "from serving.proto_gen.inference import grpc_service_pb2\n"
        "print(grpc_service_pb2.ModelInferRequest(model_name='vit').model_name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "vit"
