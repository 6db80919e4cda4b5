"""`attnserve serve` configuration: a YAML file, overridden by command-line flags."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from contract.schema import SchemaError, load_yaml
from serving.errors import InvalidArgument
from serving.tracing import TraceSettings, check_settings


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server reads at start; each field is also a `serve` flag."""

    repository: str = "model_repository"  # model repository directory
    host: str = "127.0.0.1"  # gRPC bind address (0.0.0.0 in containers)
    port: int = 50051  # gRPC port; 0 picks a free one
    # KServe v2 over HTTP/REST on this port of host (serving.rest; Triton's HTTP endpoint): 0
    # picks a free one, -1 turns it off
    http_port: int = -1
    metrics_host: str = "127.0.0.1"  # Prometheus /metrics bind address
    metrics_port: int = 8000  # Prometheus port; 0 picks a free one, -1 turns it off
    models: tuple[str, ...] = ()  # serve only these entries (default: all)
    grace_period_s: float = 10.0  # SIGTERM: in-flight requests get this long to finish
    max_message_bytes: int = 16 * 1024 * 1024  # largest gRPC message in either direction
    log_level: str = "INFO"
    tls_cert: str | None = None  # PEM certificate (chain): the gRPC port speaks TLS
    tls_key: str | None = None  # PEM private key of tls_cert (unencrypted)
    tls_client_ca: str | None = None  # PEM CA: clients must show a certificate it signed (mTLS)
    auth_token_file: str | None = None  # accepted bearer tokens, one a line (see serving.security)
    # gRPC frontend processes on the port (SO_REUSEPORT) in front of one engine process; 1 = one
    # process doing both, as a plain grpc.aio server; 0 = by the machine's CPUs
    # (auto_frontend_workers; README: Serving / Processes).
    frontend_workers: int = 0
    # shared memory (MiB) per frontend process for the arrays it hands the engine process
    # (images; serving.multiprocess.shm); 0: every array through the engine's socket
    frontend_shm_mb: int = 32
    # Python's garbage collector once the models are loaded (serving.gc_policy): the start-up
    # heap frozen, so that no collection rescans it; a young threshold (0: Python's 700)
    gc_freeze: bool = True
    gc_gen0_threshold: int = 0
    # Triton's system shared memory extension over KServe (serving.kserve.shared_memory): clients
    # on this host register POSIX shared memory regions and pass tensors through them. Off: a
    # client that registers regions can make the server read and write any shared memory object
    # its user may open, so turn it on only for clients trusted like the server.
    system_shared_memory: bool = False
    # Triton's model control: "explicit" serves RepositoryModelLoad / RepositoryModelUnload
    # (load, reload and unload models while the server runs; serving.model_control); "none":
    # the models loaded at start are served until the server stops, the two RPCs answer
    # FAILED_PRECONDITION; "poll": the server watches the repository folder every
    # repository_poll_secs and loads new entries, reloads changed ones and unloads removed ones
    # (the --models entries only, where given; serving.model_poll), and the two RPCs answer
    # FAILED_PRECONDITION.
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    # Request traces in Triton's format (serving.tracing; README: KServe v2 / request traces):
    # OFF or TIMESTAMPS; one request in trace_rate traced; trace_count traces at most (-1: no
    # limit); written to trace_file (every trace_log_frequency traces to trace_file.<n>; 0: all
    # in trace_file). The KServe TraceSetting RPC changes them (but the file) while serving.
    trace_level: str = "OFF"
    trace_rate: int = 1000
    trace_count: int = -1
    trace_file: str = ""
    trace_log_frequency: int = 0
    # Triton's response cache (serving.response_cache): bytes of KServe ModelInfer answers kept
    # per frontend process for the models whose config.yaml sets response_cache; 0: no cache
    # (Triton's flag --cache-config local,size=BYTES sets it too).
    response_cache_bytes: int = 0

    def trace_settings(self) -> TraceSettings:
        return TraceSettings(
            trace_level=self.trace_level.upper(),
            trace_rate=self.trace_rate,
            trace_count=self.trace_count,
            trace_file=self.trace_file,
            log_frequency=self.trace_log_frequency,
        )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if not -1 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be -1 (off) or 0..65535, got {self.http_port}")
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be -1 (off) or 0..65535, got {self.metrics_port}")
        if self.grace_period_s < 0:
            raise ValueError("grace_period_s must be >= 0")
        if self.max_message_bytes < 1024:
            raise ValueError("max_message_bytes must be >= 1024")
        if bool(self.tls_cert) != bool(self.tls_key):
            given, missing = ("tls_cert", "tls_key") if self.tls_cert else ("tls_key", "tls_cert")
            raise ValueError(f"{given} is set but {missing} is not; TLS needs both (or neither)")
        if self.frontend_workers < 0:
            raise ValueError(
                f"frontend_workers must be >= 1, or 0 (by the CPUs), got {self.frontend_workers}"
            )
        if self.response_cache_bytes < 0:
            raise ValueError(
                f"response_cache_bytes must be >= 0 (0: no cache), got {self.response_cache_bytes}"
            )
        if self.frontend_shm_mb < 0:
            raise ValueError(f"frontend_shm_mb must be >= 0 (0: off), got {self.frontend_shm_mb}")
        if self.gc_gen0_threshold < 0:
            raise ValueError(f"gc_gen0_threshold must be >= 0, got {self.gc_gen0_threshold}")
        if self.model_control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(
                f"model_control_mode must be one of {', '.join(MODEL_CONTROL_MODES)}, got "
                f"{self.model_control_mode!r}"
            )
        if not 0 < self.repository_poll_secs <= 86400:
            raise ValueError(
                "repository_poll_secs must be > 0 and at most 86400 (a day), got "
                f"{self.repository_poll_secs}"
            )
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca (mutual TLS) needs TLS: set tls_cert and tls_key too")
        try:
            check_settings(self.trace_settings())
        except InvalidArgument as err:
            raise ValueError(str(err)) from err


MODEL_CONTROL_MODES = ("none", "explicit", "poll")
CGROUP = Path("/sys/fs/cgroup")
# The folder of the system shared memory registry that the frontend processes of one server
# share (set by the supervisor; a one-process server makes its own and removes it on stop).
REGIONS_FOLDER_ENV = "ATTNSERVE_SHARED_MEMORY_REGIONS"


def auto_frontend_workers(cpus: int) -> int:
    """``frontend_workers: 0`` on a machine of ``cpus`` usable CPUs: one process below 8 CPUs
    (on 2 cores a frontend process takes its CPU from ONNX Runtime's threads: one process served
    best), else half the CPUs, at most 8 (on a 16-core GPU host 8 frontends served the ViT 5.3×
    one process's images/s and 128 translation streams 1.6× its tokens/s; README: Processes)."""
    return 1 if cpus < 8 else min(8, cpus // 2)


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may run on (its affinity: taskset, a container's cpuset), fewer
    where its cgroup's CPU quota allows fewer (a container's or a Kubernetes pod's CPU limit)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup)
    return cpus if limit is None else max(1, min(cpus, math.floor(limit)))


def cgroup_cpu_limit(cgroup: Path = CGROUP) -> float | None:
    """CPUs' worth of time per period the cgroup allows (cgroup v2 ``cpu.max``, else v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None: no limit, or none readable."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
        period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return int(quota) / int(period) if int(quota) > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None


def resolved(config: ServerConfig) -> ServerConfig:
    """``config`` with ``frontend_workers: 0`` replaced by the machine's number."""
    if config.frontend_workers:
        return config
    return replace(config, frontend_workers=auto_frontend_workers(usable_cpus()))


def load_server_config(path: str | Path | None, overrides: dict[str, Any]) -> ServerConfig:
    """The config file (or defaults) with the flags that were given applied on top.

    Raises:
        SchemaError: a bad file or field, named.
    """
    config = load_yaml(ServerConfig, path) if path else ServerConfig()
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise SchemaError(f"unknown server option(s) {', '.join(unknown)}")
    try:
        return replace(config, **given)
    except ValueError as err:
        raise SchemaError(str(err)) from err
