"""Model names cannot reach the filesystem: path-like names through the real gRPC server.

Every name a client sends is only looked up among the loaded models; names that cannot be model
names (paths, empty, NUL, too long) get INVALID_ARGUMENT, unknown ones NOT_FOUND. A Python audit
hook watches the process while the calls run: no file is opened, listed or changed.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from export.errors import DestinationError
from export.repository import prepare_version_dir
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from serving.repository import ModelRepository, RepositoryError
from tests.serving.server_thread import ServerThread

SERVED = {"captioner", "translator", "vit"}
FILE_EVENTS = ("open", "os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.remove")
FILE_EVENTS += ("os.rename", "os.rmdir", "os.symlink", "os.link", "os.truncate", "os.chmod")


class FileWatch:
    """Records file-system audit events (PEP 578) of every thread while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.events: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.active and event in FILE_EVENTS:
            with self._lock:
                self.events.append((event, args[:1]))


WATCH = FileWatch()
sys.addaudithook(WATCH.hook)  # hooks cannot be removed; it records only while WATCH.active

PIECES = st.sampled_from(
    [
        *("..", ".", "/", "\\", "\0", "etc", "passwd", "vit", "translator", "config.yaml", "1"),
        *("~", "%2e%2e%2f", " ", "\n", "C:", "ä", "model.onnx", "*", "?"),
    ]
)
NAMES = st.one_of(
    st.lists(PIECES, min_size=1, max_size=8).map("".join),
    st.text(max_size=40),
    st.text(alphabet="./ab\\", min_size=100, max_size=400),
    st.sampled_from(["../x", "/etc/passwd", "a/b", "..", ".", "x\0y", "", ".hidden", "-vit"]),
    st.sampled_from(["vit/../vit", "./vit", "vit/", "VIT", "vit\0", "a" * 129, "a" * 10_000]),
)
PATH_MARKS = ("/", "\\", "\0")  # and a leading "." (".", "..", hidden), empty, > 128 chars


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository) as running:
        yield running


def call_code(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=NAMES)
def test_path_like_model_names_never_touch_the_filesystem(server: ServerThread, name: str) -> None:
    with grpc.insecure_channel(server.address) as channel:
        attnserve = pb_grpc.AttnServeStub(channel)
        kserve = kpb_grpc.GRPCInferenceServiceStub(channel)
        calls = {
            "GetModel": lambda: attnserve.GetModel(pb.GetModelRequest(name=name), timeout=10),
            "KServe ModelMetadata": lambda: kserve.ModelMetadata(
                kpb.ModelMetadataRequest(name=name), timeout=10
            ),
        }
        if name:  # an empty model field means the task's default model
            calls["Translate"] = lambda: attnserve.Translate(
                pb.TranslateRequest(texts=["doce"], target_language="de", model=name), timeout=10
            )
        WATCH.active, WATCH.events = True, []
        try:
            results = {method: call_code(call) for method, call in calls.items()}
        finally:
            WATCH.active = False
    assert WATCH.events == [], f"file access for model name {name!r}: {WATCH.events}"
    for method, (code, details) in results.items():
        if name in SERVED and method != "Translate":
            assert code == grpc.StatusCode.OK, (method, details)
        elif name in SERVED:  # vit and captioner do not translate
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), details
        elif any(m in name for m in PATH_MARKS) or name.startswith(".") or not 0 < len(name) <= 128:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, name, details)
        else:
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), details
        assert len(details) < 600, f"{method} echoes too much: {len(details)} characters"


def test_the_file_watch_sees_file_access_in_the_server_thread(
    server: ServerThread, tiny_repository: Path
) -> None:
    async def read_config() -> str:
        return (tiny_repository / "vit" / "config.yaml").read_text()

    WATCH.active, WATCH.events = True, []
    try:
        server.call(read_config())
    finally:
        WATCH.active = False
    assert ("open", (str(tiny_repository / "vit" / "config.yaml"),)) in WATCH.events


def test_invalid_and_unknown_names_say_what_to_send(server: ServerThread) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        code, details = call_code(lambda: stub.GetModel(pb.GetModelRequest(name="../vit")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("'../vit' is not a model name: model names are 1-128 characters")
        code, details = call_code(lambda: stub.GetModel(pb.GetModelRequest(name="vit2")))
        assert code == grpc.StatusCode.NOT_FOUND
        assert details == "no model named 'vit2'; this server has: captioner, translator, vit"


@pytest.mark.parametrize("folder", ["vit model", ".vit", "-vit", "vit~", "v" * 129, "vït"])
def test_a_repository_entry_with_an_invalid_folder_name_is_refused(
    tiny_repository: Path, tmp_path: Path, folder: str
) -> None:
    shutil.copytree(tiny_repository / "vit", tmp_path / folder)
    with pytest.raises(RepositoryError) as err:
        ModelRepository.load(tmp_path)
    assert f"the folder name {folder[:100]!r} is not a valid model name" in str(err.value)
    assert "rename the folder" in str(err.value)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "..", "x\0y", "", "a" * 129])
def test_export_refuses_names_that_are_not_plain_folders(tmp_path: Path, name: str) -> None:
    with pytest.raises(DestinationError, match="is not valid: use 1-128 characters"):
        prepare_version_dir(tmp_path / "repository", name, 1, force=False)
    assert not (tmp_path / "repository").exists() or not any(tmp_path.rglob("*"))
