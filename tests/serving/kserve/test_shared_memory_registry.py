"""The system shared memory registry without a server: keys never leave the shared memory
folder (property-based), links and non-files are refused, regions are shared by every registry
on one folder (as the frontend processes share it), reads and writes stay inside their slice,
and the input decoder pairs raw entries with the inputs outside shared memory."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from serving.kserve import shared_memory
from serving.kserve.shared_memory import SharedMemoryRegions, object_name
from serving.kserve.tensors import decode_inputs, input_tensor
from serving.proto_gen.inference import grpc_service_pb2 as pb


@given(st.text(max_size=300))
def test_a_key_names_a_file_directly_in_the_folder_or_is_refused(key: str) -> None:
    try:
        name = object_name(key)
    except InvalidArgument as err:
        assert "shm_open name" in str(err) or (
            "at most 255 bytes" in str(err) and len(key.lstrip("/").encode()) > 255
        )
        return
    assert name and "/" not in name and "\0" not in name and name not in (".", "..")
    assert Path("/dev/shm", name).parent == Path("/dev/shm")
    assert name == key.lstrip("/")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "shm"
    folder.mkdir()
    return folder


def registry(tmp_path: Path, root: Path, max_bytes: int = 1 << 20) -> SharedMemoryRegions:
    return SharedMemoryRegions(tmp_path / "regions", max_bytes, root)


def test_links_folders_and_unreadable_objects_are_refused(tmp_path: Path, root: Path) -> None:
    regions = registry(tmp_path, root)
    (tmp_path / "secret").write_bytes(b"x" * 64)
    (root / "link").symlink_to(tmp_path / "secret")
    (root / "folder").mkdir()
    (root / "locked").write_bytes(bytes(64))
    (root / "locked").chmod(0)
    with pytest.raises(InvalidArgument, match="cannot be opened"):
        regions.register("a", "/link", 0, 8)
    with pytest.raises(InvalidArgument):
        regions.register("b", "/folder", 0, 8)
    if os.geteuid() != 0:  # root opens anything
        with pytest.raises(InvalidArgument, match="may not open"):
            regions.register("c", "/locked", 0, 8)
    assert regions.status() == []


def test_frontends_sharing_a_folder_share_the_regions(tmp_path: Path, root: Path) -> None:
    (root / "obj").write_bytes(bytes(range(256)))
    first, second = registry(tmp_path, root), registry(tmp_path, root)
    first.register("r", "/obj", 16, 64)
    assert second.get("r") == shared_memory.Region("r", "/obj", 16, 64)
    with pytest.raises(AlreadyExists):
        second.register("r", "/obj", 0, 8)
    second.unregister("r")
    with pytest.raises(NotFound, match="no shared memory region named 'r'"):
        first.get("r")


def test_a_registry_folder_removed_meanwhile_is_made_again(tmp_path: Path, root: Path) -> None:
    """A long-idle server's folder in /tmp may be cleaned away: lookups find nothing, and the
    next registration works."""
    (root / "obj").write_bytes(bytes(8))
    regions = registry(tmp_path, root)
    regions.register("a", "/obj", 0, 8)
    shutil.rmtree(tmp_path / "regions")
    assert regions.status() == []
    with pytest.raises(NotFound):
        regions.get("a")
    regions.register("a", "/obj", 0, 8)
    assert [r.name for r in regions.status()] == ["a"]


def test_one_of_many_racing_registrations_of_a_name_wins(tmp_path: Path, root: Path) -> None:
    (root / "obj").write_bytes(bytes(64))
    regions = registry(tmp_path, root)
    outcomes: list[str] = []

    def attempt(offset: int) -> None:
        try:
            regions.register("same", "/obj", offset, 8)
            outcomes.append("ok")
        except AlreadyExists:
            outcomes.append("taken")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok"] + ["taken"] * 15
    assert len(regions.status()) == 1
    assert not list((tmp_path / "regions").glob("*.tmp"))  # no temporary file left behind


def test_reads_and_writes_stay_in_their_slice(tmp_path: Path, root: Path) -> None:
    (root / "obj").write_bytes(bytes(range(100)))
    regions = registry(tmp_path, root, max_bytes=32)
    regions.register("r", "obj", 10, 80)  # a key without its leading slash works too
    params = pb.ModelInferRequest.InferInputTensor().parameters
    params["shared_memory_region"].string_param = "r"
    params["shared_memory_byte_size"].int64_param = 8
    params["shared_memory_offset"].int64_param = 5
    piece = regions.slice(params, "input 'x'")
    assert regions.read(piece, "input 'x'") == bytes(range(15, 23))
    regions.write(piece, b"\xff" * 8, "output 'y'")
    data = (root / "obj").read_bytes()
    assert data[15:23] == b"\xff" * 8 and data[:15] == bytes(range(15)) and data[23] == 23
    with pytest.raises(InvalidArgument, match="is 9 bytes"):
        regions.write(piece, b"\x00" * 9, "output 'y'")
    params["shared_memory_byte_size"].int64_param = 40
    too_big = regions.slice(params, "input 'x'")
    with pytest.raises(InvalidArgument, match="at most 32 per tensor"):
        regions.read(too_big, "input 'x'")
    os.truncate(root / "obj", 20)  # shrunk after it was registered
    with pytest.raises(InvalidArgument, match="was shrunk"):
        regions.read(piece, "input 'x'")


def test_the_number_of_regions_is_bounded(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_memory, "MAX_REGIONS", 3)
    (root / "obj").write_bytes(bytes(8))
    regions = registry(tmp_path, root)
    for name in "abc":
        regions.register(name, "/obj", 0, 8)
    with pytest.raises(ResourceExhausted, match="3 regions are registered"):
        regions.register("d", "/obj", 0, 8)
    regions.unregister("")
    assert regions.status() == []


def test_raw_entries_belong_to_the_inputs_outside_shared_memory() -> None:
    request = pb.ModelInferRequest()
    values = {"a": np.arange(3, dtype=np.int32), "b": np.ones(2, np.float32), "c": np.zeros(1)}
    datatypes = {"a": "INT32", "b": "FP32", "c": "FP64"}
    for name in "abc":
        tensor, raw = input_tensor(name, datatypes[name], values[name])
        request.inputs.append(tensor)
        if name != "b":
            assert raw is not None
            request.raw_input_contents.append(raw)
    shared = {1: values["b"].tobytes()}
    decoded = decode_inputs(request, shared)
    for name in "abc":
        np.testing.assert_array_equal(decoded[name].data, values[name])
    with pytest.raises(InvalidArgument, match="2 inputs outside shared memory but 3"):
        request.raw_input_contents.append(b"")
        decode_inputs(request, shared)
