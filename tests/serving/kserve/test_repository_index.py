"""KServe v2 / Triton RepositoryIndex on real servers: every served model READY with its
version; entries left out by ``models`` listed UNAVAILABLE with the reason; ``ready`` keeps the
ready ones; the repository named by path or folder name, or left empty; an unmodified
tritonclient reading it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.repository import NOT_LOADED
from tests.serving.kserve.infer_requests import TIMEOUT
from tests.serving.server_thread import ServerThread


def index(stub: pb_grpc.GRPCInferenceServiceStub, **request: Any) -> list[tuple[str, ...]]:
    reply = stub.RepositoryIndex(pb.RepositoryIndexRequest(**request), timeout=TIMEOUT)
    return [(m.name, m.version, m.state, m.reason) for m in reply.models]


def test_every_served_model_is_ready(
    stub: pb_grpc.GRPCInferenceServiceStub, tiny_repository: Path
) -> None:
    served = [(name, "1", "READY", "") for name in ("captioner", "translator", "vit")]
    assert index(stub) == served
    assert index(stub, ready=True) == served
    assert index(stub, repository_name=tiny_repository.name) == served
    assert index(stub, repository_name=str(tiny_repository)) == served
    with pytest.raises(grpc.RpcError) as err:
        index(stub, repository_name="elsewhere")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no repository named 'elsewhere'" in err.value.details()
    assert tiny_repository.name in err.value.details()


def test_entries_left_out_are_listed_unavailable(tiny_repository: Path) -> None:
    with (
        ServerThread(tiny_repository, metrics_port=-1, models=("vit",)) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert index(stub) == [
            ("captioner", "", "UNAVAILABLE", NOT_LOADED),
            ("translator", "", "UNAVAILABLE", NOT_LOADED),
            ("vit", "1", "READY", ""),
        ]
        assert index(stub, ready=True) == [("vit", "1", "READY", "")]


def test_tritonclient_reads_the_index(triton: tuple[ModuleType, Any]) -> None:
    _, client = triton
    models = client.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["version"], m["state"]) for m in models] == [
        ("captioner", "1", "READY"),
        ("translator", "1", "READY"),
        ("vit", "1", "READY"),
    ]
