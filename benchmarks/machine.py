"""Facts about the machine a benchmark runs on, and how busy other processes keep it.

``machine_metadata`` is recorded in every result (CPU, memory, library versions, load, date).
``cpu_snapshot`` / ``foreign_cpu_share`` gauge the noise: the share of the machine's CPU time
that processes other than the benchmark's own used during a timed interval; ``wait_for_quiet``
waits for that share to drop before a measurement.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.output import log

LIBRARIES = (
    "onnxruntime",
    "onnxruntime-gpu",
    "ctranslate2",
    "torch",
    "transformers",
    "numpy",
    "grpcio",
    "aiohttp",
    "attnserve",
)
CPU_FLAG_PREFIXES = ("avx512", "avx2", "avx_vnni", "amx", "fma")


def machine_metadata(device: str) -> dict[str, Any]:
    """CPU model, cores, memory, library versions, date and device of this run."""
    cpu_model, flags = cpu_model_and_flags()
    return {
        "cpu_model": cpu_model,
        "cpu_flags": sorted(f for f in flags if f.startswith(CPU_FLAG_PREFIXES)),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "device": device,
        "gpu": gpu_name() if device == "cuda" else None,
        "load_average_start": load_average(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The first CPU's model name and flags from /proc/cpuinfo (platform's guess elsewhere)."""
    cpu_model, flags = "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu_model == "unknown":
                cpu_model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        cpu_model = platform.processor() or "unknown"
    return cpu_model, flags


def memory_gib() -> float | None:
    """Total memory in GiB (one decimal), from /proc/meminfo; None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def usable_cpus() -> int | None:
    """CPUs this process may run on (its affinity mask; all CPUs where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count()


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries the benchmarks use (None when missing)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in LIBRARIES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    if versions.get("onnxruntime") or versions.get("onnxruntime-gpu"):
        # the module that runs: where onnxruntime and onnxruntime-gpu are both installed, the
        # one first on the path shadows the other, whatever the metadata says
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    return versions


def gpu_name() -> str | None:
    """The first CUDA device's name, None without one."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover - broken CUDA installs
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (a multi-process server's children)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                queue.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:  # the thread or process ended meanwhile
                continue
    return found


def cpu_snapshot(pids: Sequence[int] = ()) -> tuple[float, float, float] | None:
    """(wall clock, busy CPU seconds of the machine, CPU seconds of this process, its finished
    children and the live processes ``pids``)."""
    import resource

    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:  # pragma: no cover - not Linux
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in fields]
    busy = (sum(values) - values[3] - (values[4] if len(values) > 4 else 0)) / ticks
    own = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    own += sum(process_cpu_seconds(pid) or 0.0 for pid in pids)
    return time.time(), busy, own


def foreign_cpu_share(
    start: tuple[float, float, float] | None, pids: Sequence[int] = ()
) -> float | None:
    """Share of the machine's CPU time used by other processes since ``start`` (noise gauge).

    0.0: nothing else ran; 0.5 on 2 CPUs: another process kept one core busy throughout.
    """
    end = cpu_snapshot(pids)
    if start is None or end is None:
        return None
    wall = end[0] - start[0]
    if wall < 0.1:  # /proc/stat counts 10 ms ticks: too coarse for shorter intervals
        return None
    foreign = (end[1] - start[1]) - (end[2] - start[2])
    return round(max(0.0, foreign) / (wall * (os.cpu_count() or 1)), 3)


def wait_for_quiet(
    limit: float, pids: Sequence[int] = (), max_wait_s: float = 300.0, window_s: float = 2.0
) -> float | None:
    """Wait until other processes use at most ``limit`` of the CPU over ``window_s``.

    Returns the last measured share (still above ``limit`` when ``max_wait_s`` ran out).
    """
    deadline = time.monotonic() + max_wait_s
    share = None
    waited = False
    while True:
        snapshot = cpu_snapshot(pids)
        time.sleep(window_s)
        share = foreign_cpu_share(snapshot, pids)
        if share is None or share <= limit or time.monotonic() >= deadline:
            if waited:
                shown = "n/a" if share is None else f"{share:.0%}"
                log(f"stopped waiting: other processes use {shown} of the CPU")
            return share
        if not waited:
            log(f"other processes use {share:.0%} of the CPU; waiting (up to {max_wait_s:.0f} s)")
            waited = True
