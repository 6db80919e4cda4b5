"""Shared helpers of the deployment tests: the deploy files' paths, YAML / JSON loading, Dockerfile
stages and command lines (parsed by the real ``attnserve`` parser), the PromQL of the dashboard,
alerts and adapter rules, the series a real ``ServingMetrics`` exports, and promtool."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

import attnserve_cli
from serving.metrics import METRIC_NAMES, ServingMetrics
from serving.server_config import ServerConfig, load_server_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERFILE_GPU = ROOT / "Dockerfile.gpu"
HEALTHCHECK = DEPLOY / "healthcheck.py"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "attnserve.json"
GRAFANA_DATASOURCE = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
GRAFANA_PROVIDER = DEPLOY / "grafana" / "provisioning" / "dashboards" / "attnserve.yml"
K8S = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
YAML_FILES = [
    COMPOSE,
    PROMETHEUS,
    ALERTS,
    GRAFANA_DATASOURCE,
    GRAFANA_PROVIDER,
    K8S / "deployment.yaml",
    K8S / "service.yaml",
    K8S / "hpa.yaml",
    K8S / "prometheus-adapter-rules.yaml",
    KSERVE / "serving-runtime.yaml",
    KSERVE / "inference-service.yaml",
]
DEFAULTS = ServerConfig()
APT_HINT = "apt-get install -y docker-compose prometheus"
# Labels Prometheus attaches to every scraped series (target labels), not the server.
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
METRIC_RE = re.compile(r"\battnserve_[a-z_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def yaml_doc(path: Path) -> dict[str, Any]:
    (doc,) = yaml_docs(path)
    return doc


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def adapter_rules() -> list[dict[str, Any]]:
    configmap = yaml_doc(K8S / "prometheus-adapter-rules.yaml")
    return yaml.safe_load(configmap["data"]["config.yaml"])["rules"]


def docker_stages(path: Path) -> dict[str, str]:
    """Stage name (or index) -> its instructions, from a Dockerfile's FROM lines."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in path.read_text().splitlines():
        match = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?\s*$", line, re.IGNORECASE)
        if match:
            current = stages.setdefault(match.group(1) or str(len(stages)), [])
        elif stages:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in stages.items()}


def exec_form(text: str, instruction: str) -> list[str]:
    """The JSON (exec) form of the last INSTRUCTION line, e.g. CMD [...]."""
    lines = re.findall(rf"^{instruction}\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert lines, f"no {instruction} in exec form"
    return json.loads(lines[-1])


def serve_config(argv: list[str]) -> ServerConfig:
    """What `attnserve serve` would run with for this command line (the real parser and loader)."""
    assert argv[:2] == ["attnserve", "serve"], argv
    args = attnserve_cli.build_parser().parse_args(argv[1:])
    overrides = {f.name: getattr(args, f.name, None) for f in fields(ServerConfig)}
    if args.models:
        overrides["models"] = tuple(args.models)
    return load_server_config(args.config, overrides)


def dockerfile_cmd() -> list[str]:
    return exec_form(DOCKERFILE.read_text(), "CMD")


def promql_expressions() -> dict[str, str]:
    """Every PromQL expression of the dashboard, the alerts and the adapter rules, by origin."""
    exprs: dict[str, str] = {}
    board = dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            exprs[f"dashboard '{panel['title']}' {target['refId']}"] = target["expr"]
    for variable in board["templating"]["list"]:
        exprs[f"dashboard variable {variable['name']}"] = variable["definition"]
    for group in yaml_doc(ALERTS)["groups"]:
        for rule in group["rules"]:
            exprs[f"alert {rule['alert']}"] = rule["expr"]
    for i, rule in enumerate(adapter_rules()):
        exprs[f"adapter rule {i} seriesQuery"] = rule["seriesQuery"]
        # the template filled in as the adapter does: the rule's series, per-pod matchers
        exprs[f"adapter rule {i} metricsQuery"] = concrete_promql(
            rule["metricsQuery"], adapter_series(rule)
        )
    return exprs


def concrete_promql(expr: str, series: str = "") -> str:
    """Grafana variables and adapter templates filled in, so the text is plain PromQL."""
    expr = expr.replace("$__rate_interval", "1m").replace("$model", ".*")
    expr = expr.replace("<<.Series>>", series)
    expr = expr.replace("<<.LabelMatchers>>", 'namespace="ns",pod="p"')
    return expr.replace("<<.GroupBy>>", "pod")


def label_values_query(expr: str) -> str:
    """Grafana's label_values(metric, label) as the PromQL it stands for."""
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr.strip())
    return f"count by ({match.group(2)}) ({match.group(1)})" if match else expr


def adapter_series(rule: dict[str, Any]) -> str:
    match = METRIC_RE.search(rule["seriesQuery"])
    assert match, rule
    return match.group(0)


def adapter_exposed_name(rule: dict[str, Any]) -> str:
    """The custom-metrics name a rule serves: name.matches applied to the series, as name.as."""
    series = adapter_series(rule)
    pattern = re.compile(rule["name"]["matches"])
    assert pattern.search(series), (rule["name"], series)
    replacement = re.sub(r"\$\{(\d+)\}", r"\\\1", rule["name"]["as"])
    return pattern.sub(replacement, series)


def exported_series() -> dict[str, set[str]]:
    """Sample name -> label names, from a real ServingMetrics with every metric observed once."""
    metrics = ServingMetrics()
    for value in vars(metrics).values():
        if not isinstance(value, Counter | Gauge | Histogram):
            continue
        child = (
            value.labels(**dict.fromkeys(value._labelnames, "x")) if value._labelnames else value
        )
        if isinstance(value, Counter):
            child.inc()
        elif isinstance(value, Gauge):
            child.set(1)
        else:
            child.observe(0.01)
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def labels_used(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """(labels selected per metric name, labels of by/without/on/ignoring clauses)."""
    selected: dict[str, set[str]] = {}
    for name, body in re.findall(r"\b(attnserve_[a-z_]+)\s*\{([^}]*)\}", expr):
        selected.setdefault(name, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body))
    for name, label in re.findall(r"label_values\((attnserve_[a-z_]+),\s*(\w+)\)", expr):
        selected.setdefault(name, set()).add(label)
    grouped: set[str] = set()
    for _, body in re.findall(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        grouped.update(label.strip() for label in body.split(",") if label.strip())
    return selected, grouped - PROMQL_KEYWORDS


def base_name(sample: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if sample.endswith(suffix) and sample[: -len(suffix)] in METRIC_NAMES:
            return sample[: -len(suffix)]
    return sample


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(f"promtool is not installed (Debian: {APT_HINT})")
    return path
