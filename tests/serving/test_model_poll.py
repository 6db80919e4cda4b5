"""Model polling (``--model-control-mode poll``): the server follows its repository folder.

Asserted on a real repository: a new entry is loaded, a changed one reloaded (its new config
served), a broken one leaves the served version serving and is not tried again until it changes,
a removed one is unloaded (NOT_FOUND saying why and how to serve it again); `--models` limits
what is watched. On real servers (one process; two frontend processes, where the engine process
polls and every frontend follows): the changes reach every connection, and the explicit model
control RPCs are refused with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from benchmarks.repository_copy import rewrite_config
from serving.errors import NotFound
from serving.metrics import ServingMetrics
from serving.model_control import LocalModelControl
from serving.model_poll import NOT_YET, RepositoryPoller, fingerprint
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.repository import REMOVED, ModelRepository
from serving.server_config import ServerConfig
from tests.reliability.harness import copy_repository, wait_until
from tests.serving.frontends import two_frontends
from tests.serving.server_thread import ServerThread
from tests.serving.test_model_control import index, load, refused, translate, unload, vit_request

TIMEOUT = 60
POLL_S = 0.2
Stub = pb_grpc.GRPCInferenceServiceStub


def only(tiny_repository: Path, target: Path, *names: str) -> Path:
    """A copy of the tiny repository holding only ``names``."""
    root = copy_repository(tiny_repository, target)
    for entry in root.iterdir():
        if entry.is_dir() and entry.name not in names:
            shutil.rmtree(entry)
    return root


@contextlib.asynccontextmanager
async def polled(
    root: Path, names: tuple[str, ...] = ()
) -> AsyncIterator[tuple[ModelRepository, RepositoryPoller]]:
    """``root``'s entries (``names``; empty: all) served here, and a poller of the folder."""
    repository = ModelRepository.load(root, ServingMetrics(), names)
    await repository.start()
    poller = RepositoryPoller(LocalModelControl(repository, grace=5), interval=60, names=names)
    try:
        yield repository, poller
    finally:
        await poller.stop()
        await repository.stop(0)


def add(tiny_repository: Path, root: Path, name: str) -> None:
    """The tiny repository's entry ``name`` copied into ``root`` (its own files)."""
    shutil.copytree(tiny_repository / name, root / name, copy_function=shutil.copy)


async def settle(poller: RepositoryPoller) -> list[tuple[str, str]]:
    """Two looks: the first sees the change and waits, the second (nothing changed since) acts."""
    assert await poller.look() == []
    return await poller.look()


def max_batch(stub: Stub, name: str) -> int:
    return stub.ModelConfig(pb.ModelConfigRequest(name=name), timeout=TIMEOUT).config.max_batch_size


def test_a_poller_follows_the_folder(
    tiny_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = only(tiny_repository, tmp_path / "repository", "vit")

    async def scenario() -> None:
        async with polled(root) as (repository, poller):
            assert await poller.look() == []
            # a new entry
            add(tiny_repository, root, "translator")
            assert await settle(poller) == [("load", "translator")]
            assert repository.get("translator").config.batching.max_batch_size > 0
            assert await poller.look() == []  # nothing changed since
            # a changed entry: reloaded, the new config served
            first = repository.get("translator")
            rewrite_config(root / "translator", batching={"max_batch_size": 3})
            assert await settle(poller) == [("load", "translator")]
            assert repository.get("translator") is not first
            assert repository.get("translator").config.batching.max_batch_size == 3
            # a broken entry: the version served stays, and it is not tried at every look
            served = repository.get("vit")
            (root / "vit" / "config.yaml").unlink()
            (root / "vit" / "config.yaml").write_text("kind: classifier\nname: [\n")
            with caplog.at_level(logging.WARNING, "serving.model_poll"):
                assert await settle(poller) == [("load", "vit")]
            assert "cannot load vit" in caplog.text and "config.yaml" in caplog.text
            assert await poller.look() == []
            assert repository.get("vit") is served
            assert "load failed" not in repository.unserved().get("vit", "")
            shutil.copy(tiny_repository / "vit" / "config.yaml", root / "vit" / "config.yaml")
            assert await settle(poller) == [("load", "vit")]
            assert repository.get("vit") is not served
            # a removed entry: unloaded, NOT_FOUND says why and how to serve it again
            shutil.rmtree(root / "translator")
            assert await settle(poller) == [("unload", "translator")]
            with pytest.raises(NotFound, match="entry left the repository folder") as err:
                repository.get("translator")
            assert "put the entry into the folder" in str(err.value)
            assert repository.unserved() == {"translator": REMOVED}
            # and back
            add(tiny_repository, root, "translator")
            assert await settle(poller) == [("load", "translator")]
            repository.get("translator")

    asyncio.run(scenario())


def test_a_change_is_acted_on_once_it_stays(tiny_repository: Path, tmp_path: Path) -> None:
    """A config.yaml deleted and written again between two looks does not unload the model,
    and an entry whose files still change at each look is not loaded half-way."""
    root = only(tiny_repository, tmp_path / "repository", "vit")

    async def scenario() -> None:
        async with polled(root) as (repository, poller):
            served = repository.get("vit")
            config = root / "vit" / "config.yaml"
            text = config.read_bytes()
            config.unlink()  # a tool saving by deleting and writing
            assert await poller.look() == []  # gone at one look: not unloaded
            config.write_bytes(text)
            assert await poller.look() == []  # there again, as a new file: wait
            assert repository.get("vit") is served
            assert await poller.look() == [("load", "vit")]  # the same twice: reloaded
            add(tiny_repository, root, "translator")
            growing = root / "translator" / "1" / "still-copying.bin"
            for size in (1, 2, 3):
                growing.write_bytes(b"x" * size)
                assert await poller.look() == []
            assert await poller.look() == [("load", "translator")]

    asyncio.run(scenario())


def test_a_poller_watches_only_the_named_entries(tiny_repository: Path, tmp_path: Path) -> None:
    root = only(tiny_repository, tmp_path / "repository", "vit", "translator")

    async def scenario() -> None:
        async with polled(root, ("vit",)) as (repository, poller):
            rewrite_config(root / "translator", batching={"max_batch_size": 3})
            add(tiny_repository, root, "captioner")
            assert await poller.look() == await poller.look() == []  # settled, not watched
            rewrite_config(root / "vit", batching={"max_batch_size": 5})
            assert await settle(poller) == [("load", "vit")]
            assert [m.name for m in repository.models()] == ["vit"]

    asyncio.run(scenario())


def test_a_fingerprint_sees_a_replaced_file_and_a_new_version(tmp_path: Path) -> None:
    entry = tmp_path / "m"
    (entry / "1").mkdir(parents=True)
    (entry / "config.yaml").write_text("a")
    (entry / "1" / "model.onnx").write_text("x")
    first = fingerprint(entry)
    assert fingerprint(entry) == first
    replacement = tmp_path / "new"
    replacement.write_text("a")
    stat = (entry / "config.yaml").stat()
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and time
    replacement.replace(entry / "config.yaml")
    second = fingerprint(entry)
    assert second != first  # a new inode
    shutil.copytree(entry / "1", entry / "2")
    assert len(fingerprint(entry)) == len(second) + 1


def test_a_polling_server_follows_its_folder_and_refuses_explicit_control(
    tiny_repository: Path, tmp_path: Path
) -> None:
    root = only(tiny_repository, tmp_path / "repository", "vit")
    with (
        ServerThread(
            root, metrics_port=-1, model_control_mode="poll", repository_poll_secs=POLL_S
        ) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = Stub(channel)
        for call in (load, unload):
            code, details = refused(call, stub, "vit")
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "poll" in details and "--model-control-mode explicit" in details
        add(tiny_repository, root, "translator")
        assert wait_until(lambda: "translator" in ready_models(stub), TIMEOUT)
        assert translate(stub)
        shutil.rmtree(root / "translator")
        assert wait_until(lambda: "translator" not in ready_models(stub), TIMEOUT)
        code, details = refused(translate, stub)
        assert code == grpc.StatusCode.NOT_FOUND and REMOVED in details
        assert index(stub)["translator"] == ("", "UNAVAILABLE", REMOVED)
        assert stub.ModelInfer(vit_request(), timeout=TIMEOUT).outputs


def ready_models(stub: Stub) -> set[str]:
    return {name for name, (_, state, _) in index(stub).items() if state == "READY"}


def test_two_frontends_follow_the_engine_processs_polling(
    tiny_repository: Path, tmp_path: Path
) -> None:
    root = only(tiny_repository, tmp_path / "repository", "vit")
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S))
    with two_frontends(root, *flags, models=()) as (_server, stubs):
        batch = max_batch(stubs[0], "vit")
        calls: list[bool] = []
        errors: list[str] = []
        stop = threading.Event()

        def traffic() -> None:  # requests on every connection while the model reloads
            while not stop.is_set():
                for stub in stubs:
                    try:
                        calls.append(bool(stub.ModelInfer(vit_request(), timeout=TIMEOUT).outputs))
                    except grpc.RpcError as err:
                        errors.append(f"{err.code()}: {err.details()}")

        client = threading.Thread(target=traffic)
        client.start()
        try:
            rewrite_config(root / "vit", limits={"max_batch_size": batch // 2})
            everywhere: Callable[[], bool] = lambda: all(  # noqa: E731
                max_batch(stub, "vit") == batch // 2 for stub in stubs
            )
            assert wait_until(everywhere, TIMEOUT, interval=0.1)
        finally:
            stop.set()
            client.join()
        assert len(calls) >= len(stubs) and all(calls) and not errors, errors
        for stub in stubs:
            assert stub.ModelInfer(vit_request(), timeout=TIMEOUT).outputs
        code, details = refused(load, stubs[0], "vit")
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "poll" in details
        shutil.rmtree(root / "vit")
        gone = lambda: all(not ready_models(stub) for stub in stubs)  # noqa: E731
        assert wait_until(gone, TIMEOUT, interval=0.1)
        for stub in stubs:
            code, details = refused(stub.ModelInfer, vit_request(), timeout=TIMEOUT)
            assert code == grpc.StatusCode.NOT_FOUND and REMOVED in details
            assert "put the entry into the folder" in details
        # an entry that cannot load: the frontends say it is not loaded yet, and where to look
        (root / "broken").mkdir()
        (root / "broken" / "config.yaml").write_text("kind: classifier\n")
        time.sleep(4 * POLL_S)  # two looks and more
        for stub in stubs:
            assert index(stub)["broken"] == ("", "UNAVAILABLE", NOT_YET)


@pytest.mark.parametrize("seconds", [0, -1, 86401])
def test_the_poll_interval_is_checked(seconds: float) -> None:
    with pytest.raises(ValueError, match="repository_poll_secs"):
        ServerConfig(model_control_mode="poll", repository_poll_secs=seconds)
    with pytest.raises(ValueError, match="none, explicit, poll"):
        ServerConfig(model_control_mode="watch")
