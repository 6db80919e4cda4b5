"""``frontend_workers: 0`` (the default) picks the number of frontend processes by the CPUs the
server may run on; a number given is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.server_config import (
    ServerConfig,
    auto_frontend_workers,
    cgroup_cpu_limit,
    resolved,
    usable_cpus,
)


@pytest.mark.parametrize(
    ("cpus", "frontends"), [(1, 1), (2, 1), (4, 1), (7, 1), (8, 4), (12, 6), (16, 8), (96, 8)]
)
def test_one_process_below_8_cpus_then_half_the_cpus_at_most_8(cpus: int, frontends: int) -> None:
    assert auto_frontend_workers(cpus) == frontends


def test_the_default_is_resolved_and_a_given_number_kept() -> None:
    assert ServerConfig().frontend_workers == 0
    assert resolved(ServerConfig()).frontend_workers == auto_frontend_workers(usable_cpus())
    assert resolved(ServerConfig(frontend_workers=3)).frontend_workers == 3
    with pytest.raises(ValueError, match="frontend_workers"):
        ServerConfig(frontend_workers=-1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_the_cpus_counted_are_those_the_process_may_run_on() -> None:
    """A server started under ``taskset`` (or in a container's cpuset) counts only its CPUs."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from serving.server_config import usable_cpus; print(usable_cpus())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "max 100000\n"}, None),  # cgroup v2, no limit
        ({"cpu.max": "250000 100000\n"}, 2.5),  # a 2.5-CPU limit
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({"cpu.max": "garbage"}, None),
        ({"cpu.max": "100000 0\n"}, None),  # a zero period reads as no limit
        ({}, None),  # no cgroup files at all
    ],
)
def test_a_cgroup_cpu_limit_is_read(tmp_path: Path, files: dict[str, str], limit: float) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_limit(tmp_path) == limit


def test_a_container_cpu_limit_caps_the_cpus_counted(tmp_path: Path) -> None:
    """A pod limited to 2.5 CPUs on a large node counts 2 (one frontend process), not the
    node's cores; a limit above the affinity changes nothing."""
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert usable_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text(f"{1000 * 100000} 100000\n")
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("10000 100000\n")  # a tenth of a CPU: still one
    assert usable_cpus(tmp_path) == 1
