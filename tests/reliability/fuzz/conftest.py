"""The fuzz package's server: one for all fuzz tests (package scope, as the single module
had), the reference answers computed on it first, and the JSON summary written when the last
fuzz test is done (``fuzz_summary.json`` in pytest's base temp, ``$ATTNSERVE_FUZZ_SUMMARY``)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from benchmarks.server_process import ServeProcess
from contract.model_config import LatestVersions, QueuePolicy, VersionPolicy
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from tests.reliability.fuzz.checker import PROFILE, TOTAL_EXAMPLES, Fuzz
from tests.reliability.harness import BIG_MESSAGES, copy_repository
from tests.serving.server_thread import ServerThread

# every model with priority levels (level 1 with a queue of its own), so that fuzzed priorities
# reach the queues' ordering and limits, and with the response cache (the server has one), so
# that fuzzed KServe requests go through its keys
LEVELS = {
    "batching": {
        "priority_levels": 3,
        "default_priority_level": 2,
        "priority_queue_policy": (QueuePolicy(level=1, max_queue_size=64),),
    },
    "response_cache": True,
}
CACHE_BYTES = 1 << 20
TWO_VERSIONS = VersionPolicy(latest=LatestVersions(num_versions=2))


def fuzz_server(repository: Path, frontends: int) -> ServerThread | ServeProcess:
    """The server under fuzzing: in this process, or `attnserve serve` with frontend processes
    (system shared memory and the response cache on, so that their RPCs, request parameters and
    keys are fuzzed too)."""
    if frontends == 1:
        return ServerThread(
            repository,
            metrics_port=-1,
            system_shared_memory=True,
            response_cache_bytes=CACHE_BYTES,
        )
    workers = (
        *("--frontend-workers", str(frontends), "--metrics-port", "-1"),
        *("--system-shared-memory", "--cache-config", f"local,size={CACHE_BYTES}"),
    )
    return ServeProcess(repository, *workers)


@pytest.fixture(scope="package", params=[1, 2], ids=["one-process", "two-frontends"])
def fuzz(
    request: pytest.FixtureRequest,
    tiny_repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fuzz]:
    started = time.monotonic()
    frontends: int = request.param
    repository = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("fuzz") / "repository",
        **dict.fromkeys(("translator", "captioner"), LEVELS),
        vit={**LEVELS, "version_policy": TWO_VERSIONS},
    )
    # the ViT serves versions 1 and 2 (the same graphs), so that fuzzed versions reach both
    shutil.copytree(repository / "vit" / "1", repository / "vit" / "2", copy_function=os.link)
    with fuzz_server(repository, frontends) as server:
        channel = grpc.insecure_channel(server.address, options=BIG_MESSAGES)
        state = Fuzz(
            server,
            channel,
            pb_grpc.AttnServeStub(channel),
            kpb_grpc.GRPCInferenceServiceStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )
        state.reference = state.answers()
        state.assert_still_correct()  # deterministic, or the checks would mean nothing
        yield state
        state.assert_still_correct()
        channel.close()
    summary = {
        "frontend_workers": frontends,
        "profile": PROFILE,
        "examples_budget": TOTAL_EXAMPLES,
        "cases": sum(state.cases.values()),
        "cases_per_test": dict(state.cases),
        "status_codes": dict(state.codes),
        "liveness_checks": state.checks,
        "slowest_calls": [(round(s, 3), what) for s, what in reversed(state.slowest)],
        "seconds": round(time.monotonic() - started, 1),
    }
    text = json.dumps(summary, indent=2)
    suffix = "" if frontends == 1 else f"-{frontends}-frontends"
    (tmp_path_factory.getbasetemp() / f"fuzz_summary{suffix}.json").write_text(text)
    if os.environ.get("ATTNSERVE_FUZZ_SUMMARY"):
        target = Path(os.environ["ATTNSERVE_FUZZ_SUMMARY"])
        target.with_name(target.stem + suffix + target.suffix).write_text(text)
    print(f"\nfuzz summary: {text}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run test_fuzz_case_count after the other fuzz tests of its server (it checks the whole
    budget was spent), keeping each server's tests together."""
    here = Path(__file__).parent

    def server(item: pytest.Item) -> str:
        callspec = getattr(item, "callspec", None)
        return str(callspec.params.get("fuzz", "")) if callspec else ""

    counts = [
        i for i in items if i.name.startswith("test_fuzz_case_count") and i.path.parent == here
    ]
    for item in counts:
        items.remove(item)
    for item in counts:
        ours = [
            n
            for n, other in enumerate(items)
            if other.path.parent == here and server(other) == server(item)
        ]
        items.insert(ours[-1] + 1 if ours else len(items), item)
