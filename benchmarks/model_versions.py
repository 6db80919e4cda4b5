"""What serving several versions of a model at once costs (config.yaml ``version_policy``).

    python -m benchmarks.model_versions [--repository DIR] [--versions 1,2,3] [--rounds 2]
        [--duration 10] [--warmup 2] [--concurrency 1] [--out DIR]

For each count N of versions (the order alternates from round to round, as this VM's speed
drifts): a copy of the repository's ViT and translator whose version folder is linked as
versions 1..N, with ``version_policy: {latest: {num_versions: N}}``; ``attnserve serve`` on it;
the seconds until it answers; RSS and threads summed over its processes once every version has
answered; then closed-loop KServe ``ModelInfer`` (the ViT: one 32 × 32 image; the translator:
one short text) against the newest version and, with N > 1, the oldest, so that a request
naming a version is timed against one taking the newest; then, per model, the time of a
``RepositoryModelLoad`` that rebuilds all N versions (nothing changed: an explicit reload) and
of one that adds version N + 1 (the N unchanged versions kept; the folder and the policy are
put back after). Writes each server's figures and points to
``benchmarks/results/model-versions/model-versions-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Workload
from benchmarks.output import DEFAULT_RESULTS, log, write_probe
from benchmarks.repository_copy import linked_copy, rewrite_config
from benchmarks.response_cache import workloads
from benchmarks.served_pairs import add_pair_arguments, drive, repository_of
from benchmarks.server_process import ServeProcess
from contract.model_config import LatestVersions, VersionPolicy
from contract.repository import version_dirs

MODELS = ("vit", "translator")


def versioned_copy(repository: Path, folder: Path, count: int) -> Path:
    """``repository``'s ViT and translator with their newest version linked as 1..``count``
    and a policy serving all of them."""
    root = linked_copy(repository, folder / f"repository-{count}", MODELS)
    for name in MODELS:
        entry = root / name
        newest = entry / str(version_dirs(entry)[-1])
        for version in version_dirs(entry):  # the other exports: not measured
            if entry / str(version) != newest:
                shutil.rmtree(entry / str(version))
        newest.rename(entry / "1")
        for version in range(2, count + 1):
            shutil.copytree(entry / "1", entry / str(version), copy_function=_link)
        rewrite_config(entry, version_policy=latest(count))
    return root


def latest(count: int) -> VersionPolicy:
    return VersionPolicy(latest=LatestVersions(num_versions=count))


def reload_times(address: str, root: Path, count: int) -> dict[str, dict[str, float]]:
    """Per model, seconds of a load that rebuilds all ``count`` versions and of one that adds
    version ``count`` + 1 beside them (the entry is put back as it was after)."""
    import grpc

    from serving.proto_gen.inference import grpc_service_pb2 as kpb
    from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc

    times = {}
    with grpc.insecure_channel(address) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)

        def load(name: str) -> float:
            started = time.perf_counter()
            stub.RepositoryModelLoad(kpb.RepositoryModelLoadRequest(model_name=name), timeout=300)
            return round(time.perf_counter() - started, 3)

        for name in MODELS:
            entry = root / name
            rebuild = load(name)
            added = entry / str(count + 1)
            shutil.copytree(entry / "1", added, copy_function=_link)
            rewrite_config(entry, version_policy=latest(count + 1))
            add = load(name)
            shutil.rmtree(added)
            rewrite_config(entry, version_policy=latest(count))
            load(name)
            times[name] = {"rebuild_all_s": rebuild, "add_version_s": add}
    return times


def _link(origin: str, copy: str) -> None:
    Path(copy).hardlink_to(origin)


def rss_and_threads(pids: list[int]) -> tuple[int, int]:
    """Resident bytes and threads summed over ``pids`` (from /proc)."""
    rss = threads = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        rss += int(fields["VmRSS"].split()[0]) * 1024
        threads += int(fields["Threads"])
    return rss, threads


def versioned_workloads(count: int) -> dict[str, Workload]:
    """The newest version of each model by default ("") and, with several, the oldest ("1")."""
    chosen: dict[str, Workload] = {}
    for name, workload in workloads().items():
        chosen[f"{name}@newest"] = workload
        if count > 1:
            chosen[f"{name}@1"] = Workload(
                workload.method, workload.model, tensors=workload.tensors, version="1"
            )
    return chosen


def run_server(root: Path, count: int, settings: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    server = ServeProcess(
        root,
        *("--host", "127.0.0.1", "--metrics-port", "-1", "--log-level", "WARNING"),
        *("--model-control-mode", "explicit"),
        grace=2,
    ).start()
    ready_s = time.monotonic() - started
    try:
        chosen = versioned_workloads(count)
        points = asyncio.run(
            drive(server, chosen, settings.concurrency, settings.duration, settings.warmup)
        )
        rss, threads = rss_and_threads(server.processes())
        return {
            "versions": count,
            "ready_s": round(ready_s, 2),
            "rss_bytes": rss,
            "threads": threads,
            "reloads": reload_times(server.address, root, count),
            "points": points,
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_versions")
    add_pair_arguments(parser, DEFAULT_RESULTS / "model-versions", pairs=False)
    parser.add_argument(
        "--versions",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 2, 3),
        help="versions served at once, one server each (default 1,2,3)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    args.repository = repository_of(args)
    servers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnserve-model-versions-") as scratch:
        roots = {n: versioned_copy(args.repository, Path(scratch), n) for n in args.versions}
        for round_ in range(args.rounds):
            order = args.versions if round_ % 2 == 0 else tuple(reversed(args.versions))
            for count in order:
                log(f"round {round_}: {count} version(s) of each model")
                servers.append({"round": round_, **run_server(roots[count], count, args)})
    points = [
        {"round": s["round"], "versions": s["versions"], **p} for s in servers for p in s["points"]
    ]
    summary = [{k: v for k, v in s.items() if k != "points"} for s in servers]
    write_probe("model-versions", points, args.out, False, args.duration, servers=summary)
    for record in summary:
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
