"""Fuzzing metadata, readiness, statistics and health with any model names and versions
(attnserve.v1 GetModel / ListModels, KServe Server* / Model* probes, metadata, statistics and
the repository index, grpc.health.v1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from hypothesis import example, given
from hypothesis import strategies as st

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from tests.reliability.fuzz.checker import Fuzz, budget
from tests.reliability.fuzz.strategies import model_names, versions

# the fuzz server's models and their served versions (the ViT serves two: fuzz/conftest.py)
SERVED = {"captioner": {1}, "translator": {1}, "vit": {1, 2}}


def served(name: str, version: str) -> bool:
    """Whether the fuzz server serves ``version`` of ``name`` (empty: the newest); a version is
    a decimal number, leading zeros allowed, as Triton parses it."""
    if name not in SERVED:
        return False
    number = version.isascii() and version.isdigit() and len(version) <= 18
    return version == "" or (number and int(version) in SERVED[name])


def test_fuzz_metadata(fuzz: Fuzz) -> None:
    @budget("metadata")
    @given(
        method=st.sampled_from(
            [
                "GetModel",
                "ListModels",
                "ServerLive",
                "ServerReady",
                "ModelReady",
                "ServerMetadata",
                "ModelMetadata",
                "ModelConfig",
                "ModelStatistics",
                "RepositoryIndex",
                "Health",
            ]
        ),
        name=model_names,
        version=versions,
    )
    @example("GetModel", "", "")
    @example("ModelConfig", "../../etc/passwd", "")
    @example("ModelMetadata", "vit", "99999999999999999999")
    @example("Health", "inference.GRPCInferenceService", "")
    @example("ModelStatistics", "", "1")
    def run(method: str, name: str, version: str) -> None:
        k, s = fuzz.kserve, fuzz.stub
        calls: dict[str, Callable[[float], Any]] = {
            "GetModel": lambda t: s.GetModel(
                pb.GetModelRequest(name=name, version=version), timeout=t
            ),
            "ListModels": lambda t: s.ListModels(pb.ListModelsRequest(), timeout=t),
            "ServerLive": lambda t: k.ServerLive(kpb.ServerLiveRequest(), timeout=t),
            "ServerReady": lambda t: k.ServerReady(kpb.ServerReadyRequest(), timeout=t),
            "ModelReady": lambda t: k.ModelReady(
                kpb.ModelReadyRequest(name=name, version=version), timeout=t
            ),
            "ServerMetadata": lambda t: k.ServerMetadata(kpb.ServerMetadataRequest(), timeout=t),
            "ModelMetadata": lambda t: k.ModelMetadata(
                kpb.ModelMetadataRequest(name=name, version=version), timeout=t
            ),
            "ModelConfig": lambda t: k.ModelConfig(
                kpb.ModelConfigRequest(name=name, version=version), timeout=t
            ),
            "ModelStatistics": lambda t: k.ModelStatistics(
                kpb.ModelStatisticsRequest(name=name, version=version), timeout=t
            ),
            "RepositoryIndex": lambda t: k.RepositoryIndex(
                kpb.RepositoryIndexRequest(repository_name=name, ready=bool(version)), timeout=t
            ),
            "Health": lambda t: fuzz.health.Check(
                health_pb2.HealthCheckRequest(service=name), timeout=t
            ),
        }
        code, details, result = fuzz.call(calls[method])
        fuzz.check("metadata", code, details, what=(method, name, version))
        real = served(name, version)
        if method in ("GetModel", "ModelMetadata", "ModelConfig"):
            assert (code == grpc.StatusCode.OK) == real, (method, name, version, code, details)
        if method == "ModelReady":
            assert code == grpc.StatusCode.OK and result.ready == real
        if method in ("ServerLive", "ServerReady", "ListModels", "ServerMetadata"):
            assert code == grpc.StatusCode.OK
        if method == "ModelStatistics":  # a real model, or every model (no name, no version)
            everyone = name == "" and version == ""
            assert (code == grpc.StatusCode.OK) == (real or everyone), (name, version, details)
            if code == grpc.StatusCode.OK:  # a name without a version: each served version
                every = sum(map(len, SERVED.values())) if everyone else len(SERVED[name])
                assert len(result.model_stats) == (1 if version else every)
        if method == "RepositoryIndex":  # the server's repository: empty, its path or name
            ok = code == grpc.StatusCode.OK
            assert ok or (name and code == grpc.StatusCode.NOT_FOUND), (name, code, details)
            if ok:
                assert [m.name for m in result.models] == [
                    name for name, served in sorted(SERVED.items()) for _ in served
                ]

    run()
    fuzz.assert_still_correct()
