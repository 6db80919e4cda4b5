"""Deployment files parse, validate with the real tools and agree with the server and its metrics.

- Every YAML / JSON file parses; the compose file validates with docker-compose (skipped, with
  the apt command, where it is not installed); the Prometheus config, the alert rules and every
  PromQL expression of the dashboard and the prometheus-adapter rules pass promtool, and the alert
  rules fire (and stay quiet) as intended in promtool's rule unit tests.
- Every metric the dashboard, the alerts, the adapter rules and the HPA use is one a real
  ``ServingMetrics`` exports, with the labels they select or group by.
- Ports, paths and command lines agree with ``ServerConfig`` and the Dockerfile's CMD, parsed by
  the real ``attnserve`` argument parser; the runtime stage installs no training stack.
- ``deploy/healthcheck.py`` against a real grpc.health.v1 server: SERVING, NOT_SERVING, no server.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import fields
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

import attnserve_cli
from serving.metrics import METRIC_NAMES, ServingMetrics
from serving.model_config import (
    CONFIG_FILE,
    ImageSpec,
    ModelConfig,
    read_model_config,
    write_model_config,
)
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


# --- helpers ------------------------------------------------------------------------------------
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
        if isinstance(value, Counter):
            value.labels(**dict.fromkeys(value._labelnames, "x")).inc()
        elif isinstance(value, Gauge):
            value.labels(**dict.fromkeys(value._labelnames, "x")).set(1)
        elif isinstance(value, Histogram):
            value.labels(**dict.fromkeys(value._labelnames, "x")).observe(0.01)
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


# --- every file parses --------------------------------------------------------------------------
@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_files_parse(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs and all(isinstance(doc, dict) for doc in docs)


def test_json_and_embedded_yaml_parse() -> None:
    board = dashboard()
    assert board["panels"] and board["schemaVersion"] >= 39
    assert adapter_rules()
    assert len(yaml_docs(K8S / "service.yaml")) == 2  # ClusterIP + headless


# --- compose --------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_compose_file_validates_with_docker_compose(profile: list[str]) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip(f"docker-compose is not installed (Debian: {APT_HINT})")
    result = run([binary, "-f", str(COMPOSE), *profile, "config", "-q"], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    listed = run([binary, "-f", str(COMPOSE), *profile, "config", "--services"], cwd=ROOT)
    assert {"attnserve", "prometheus", "grafana"} <= set(listed.stdout.split()), listed.stderr


def test_compose_services_agree_with_the_server_and_each_other() -> None:
    services = yaml_doc(COMPOSE)["services"]
    cmd_config = serve_config(dockerfile_cmd())
    server = services["attnserve"]
    assert server["build"]["dockerfile"] == "Dockerfile"
    published = {int(p.split(":")[1]) for p in server["ports"]}
    assert published == {cmd_config.port, cmd_config.metrics_port} == {50051, 8000}
    assert "/app/deploy/healthcheck.py" in server["healthcheck"]["test"]
    assert f"127.0.0.1:{cmd_config.port}" in server["healthcheck"]["test"]

    gpu = services["attnserve-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["dockerfile"] == "Dockerfile.gpu"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert {int(p.split(":")[1]) for p in gpu["ports"]} == {50051, 8000}

    prometheus = services["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus")
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"] if v.startswith("./"))
    assert mounts["./deploy/prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]

    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert "3000:3000" in grafana["ports"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("./"))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    (provider,) = yaml_doc(GRAFANA_PROVIDER)["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]


def test_prometheus_scrapes_the_metrics_port_every_5s() -> None:
    config = yaml_doc(PROMETHEUS)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["attnserve"]
    assert job["static_configs"][0]["targets"] == [f"attnserve:{DEFAULTS.metrics_port}"]
    assert job["metrics_path"] == "/metrics" and job["scrape_interval"] == "5s"
    assert [(PROMETHEUS.parent / f).resolve() for f in config["rule_files"]] == [ALERTS]


def test_metrics_are_served_at_the_configured_path() -> None:
    metrics = ServingMetrics()
    server, port = metrics.start_http_server(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.stop()
    assert "# TYPE attnserve_queue_depth gauge" in text


def test_grafana_dashboard_uses_the_provisioned_datasource() -> None:
    (source,) = yaml_doc(GRAFANA_DATASOURCE)["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    board = dashboard()
    refs = [v["datasource"] for v in board["templating"]["list"]]
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        refs.append(panel["datasource"])
        refs += [t["datasource"] for t in panel["targets"]]
    assert refs and all(ref == {"type": "prometheus", "uid": source["uid"]} for ref in refs)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


# --- metrics cross-check ----------------------------------------------------------------------
def test_every_referenced_metric_and_label_is_exported() -> None:
    series = exported_series()
    problems = []
    for origin, expr in promql_expressions().items():
        names = set(METRIC_RE.findall(expr))
        if not names:  # only `up`, Prometheus' own series
            assert re.fullmatch(r"up\{[^}]*\} == 0", expr.strip()), f"{origin}: {expr!r}"
            continue
        selected, grouped = labels_used(expr)
        for name in names:
            if name not in series or base_name(name) not in METRIC_NAMES:
                problems.append(f"{origin}: {name} is not exported")
                continue
            own = series[name] | TARGET_LABELS
            for label in selected.get(name, set()) | grouped:
                if label not in own:
                    problems.append(f"{origin}: {name} has no label {label!r}")
    assert not problems, "\n".join(problems)


def test_dashboard_covers_every_metric_and_the_asked_panels() -> None:
    board = dashboard()
    text = json.dumps(board)
    used = {base_name(n) for n in METRIC_RE.findall(text)}
    assert used == set(METRIC_NAMES)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert any('code!="OK"' in e and "attnserve_requests_total" in e for e in exprs), (
        "errors by code"
    )
    quantiles = {
        float(q)
        for e in exprs
        if "attnserve_request_duration_seconds_bucket" in e
        for q in re.findall(r"histogram_quantile\(([\d.]+)", e)
    }
    assert quantiles == {0.5, 0.9, 0.99}
    assert any(
        "rate(attnserve_batch_size_sum" in e
        and "rate(attnserve_batch_size_count" in e
        and "stage" in e
        for e in exprs
    ), "average batch size by stage"


def test_hpa_metrics_come_from_adapter_rules_over_exported_series() -> None:
    hpa = yaml_doc(K8S / "hpa.yaml")
    deployment = yaml_doc(K8S / "deployment.yaml")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    exposed = {adapter_exposed_name(rule): rule for rule in adapter_rules()}
    assert exposed["attnserve_requests_per_second"]["seriesQuery"].startswith(
        "attnserve_requests_total"
    )
    kinds = {m["type"] for m in hpa["spec"]["metrics"]}
    assert kinds == {"Pods", "Resource"}
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Resource":
            assert metric["resource"]["name"] == "cpu"
            continue
        name = metric["pods"]["metric"]["name"]
        assert name in exposed, f"the HPA's {name} is served by no adapter rule"
        assert adapter_series(exposed[name]) in exported_series()
    for rule in adapter_rules():
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


# --- promtool: the real parser and rule engine -----------------------------------------------
def test_prometheus_config_and_alert_rules_pass_promtool() -> None:
    tool = promtool()
    result = run([tool, "check", "config", str(PROMETHEUS)])
    assert result.returncode == 0, result.stdout + result.stderr
    result = run([tool, "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_and_adapter_queries_are_valid_promql(tmp_path: Path) -> None:
    tool = promtool()
    rules = []
    for i, (origin, expr) in enumerate(sorted(promql_expressions().items())):
        series = METRIC_RE.search(expr)
        text = concrete_promql(label_values_query(expr), series.group(0) if series else "")
        rules.append({"record": f"check:expr_{i}", "expr": text, "labels": {"origin": origin}})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    result = run([tool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    labels = {"job": "attnserve", "instance": "attnserve:8000", **labels}
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def test_alert_rules_fire_on_trouble_and_stay_quiet_otherwise(tmp_path: Path) -> None:
    tool = promtool()
    descriptions = {
        rule["alert"]: rule["annotations"].get("description", "")
        for group in yaml_doc(ALERTS)["groups"]
        for rule in group["rules"]
    }
    latency = "attnserve_request_duration_seconds_bucket"
    trouble = [
        _series("up", "0x20"),
        _series("attnserve_kv_cache_usage_ratio", "0.95x20", model="translator"),
        _series("attnserve_queue_depth", "250x20", model="vit"),
        _series("attnserve_requests_total", "0+90x20", model="vit", method="Classify", code="OK"),
        _series(
            "attnserve_requests_total", "0+10x20", model="vit", method="Classify", code="INTERNAL"
        ),
        # every request of the captioner between 2.5 and 5 s: p99 = 2.5 + 0.99 * 2.5 s
        _series(latency, "0x20", model="captioner", method="Caption", le="2.5"),
        _series(latency, "0+100x20", model="captioner", method="Caption", le="5.0"),
        _series(latency, "0+100x20", model="captioner", method="Caption", le="+Inf"),
    ]
    calm = [
        _series("up", "1x20"),
        _series("attnserve_kv_cache_usage_ratio", "0.5x20", model="translator"),
        _series("attnserve_queue_depth", "3x20", model="vit"),
        _series("attnserve_requests_total", "0+100x20", model="vit", method="Classify", code="OK"),
        _series(latency, "0+100x20", model="captioner", method="Caption", le="0.1"),
        _series(latency, "0+100x20", model="captioner", method="Caption", le="+Inf"),
    ]

    def fired(alert: str, labels: dict[str, str], summary: str) -> dict[str, Any]:
        return {
            "eval_time": "15m",
            "alertname": alert,
            "exp_alerts": [
                {
                    "exp_labels": labels,
                    "exp_annotations": {"summary": summary, "description": descriptions[alert]}
                    if descriptions[alert]
                    else {"summary": summary},
                }
            ],
        }

    warning = {"severity": "warning"}
    expected = [
        fired(
            "AttnserveDown",
            {"severity": "critical", "job": "attnserve", "instance": "attnserve:8000"},
            "attnserve target attnserve:8000 is not answering /metrics",
        ),
        fired(
            "AttnserveKVCacheNearlyFull",
            {**warning, "model": "translator"},
            "translator KV cache 95% full",
        ),
        fired(
            "AttnserveQueueNearLimit",
            {**warning, "model": "vit"},
            "vit queue holds 250 requests (limit 256)",
        ),
        fired("AttnserveHighErrorRatio", {**warning, "model": "vit"}, "10% of vit requests fail"),
        fired(
            "AttnserveHighP99Latency",
            {**warning, "model": "captioner", "method": "Caption"},
            "p99 latency of captioner/Caption is 4.975s",
        ),
    ]
    quiet = [{"eval_time": "15m", "alertname": a, "exp_alerts": []} for a in descriptions]
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": trouble, "alert_rule_test": expected},
            {"interval": "1m", "input_series": calm, "alert_rule_test": quiet},
        ],
    }
    assert {t["alertname"] for t in expected} == set(descriptions)
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = run([tool, "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


# --- Dockerfiles, Kubernetes and KServe agree with the server ---------------------------------
def test_dockerfile_stages() -> None:
    stages = docker_stages(DOCKERFILE)
    assert list(stages) == ["export", "runtime"]
    export, runtime = stages["export"], stages["runtime"]
    pin = re.search(r'"(torch==[\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject's export extra pins torch"
    assert f"pip install {pin.group(1)} --index-url https://download.pytorch.org/whl/cpu" in export
    assert "attnserve export-all export/plans/shipped.yaml --repository /models" in export
    assert "torch" not in runtime.lower()
    installs = re.findall(r'pip install -e "\.\[([^\]]*)\]"', runtime)
    assert installs == ["serve"], installs
    assert "COPY --from=export /models /models" in runtime
    assert re.search(r"^USER\s+(?!root|0\b)\S+", runtime, re.MULTILINE), "non-root user"
    assert re.search(r"^EXPOSE\s+50051\s+8000\s*$", runtime, re.MULTILINE)
    healthcheck = re.search(r"^HEALTHCHECK .*?CMD (\[[^\n]*\])", runtime, re.M | re.DOTALL)
    assert healthcheck and "/app/deploy/healthcheck.py" in json.loads(healthcheck.group(1))
    config = serve_config(dockerfile_cmd())
    assert (config.repository, config.host, config.metrics_host) == ("/models", *["0.0.0.0"] * 2)
    assert (config.port, config.metrics_port) == (DEFAULTS.port, DEFAULTS.metrics_port)


@pytest.mark.parametrize("path", [DOCKERFILE, DOCKERFILE_GPU], ids=lambda p: p.name)
def test_dockerfile_copies_exist_and_are_not_dockerignored(path: Path) -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    sources = []
    for line in path.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line and "<<" not in line:
            sources += shlex.split(line)[1:-1]
    assert "deploy/healthcheck.py" in sources and "models" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        parts = Path(source).parts
        prefixes = {"/".join(parts[: i + 1]) for i in range(len(parts))}
        assert not prefixes & ignored, f"{source} is excluded by .dockerignore"


def test_gpu_dockerfile_builds_engines_and_serves_like_the_cpu_image() -> None:
    text = DOCKERFILE_GPU.read_text()
    assert re.search(r"^ARG TENSORRT_IMAGE=nvcr\.io/nvidia/tensorrt:\d\d\.\d\d-py3$", text, re.M)
    assert re.search(r'pip install -e "\.\[[^\]]*\bgpu\b[^\]]*\]"', text)
    assert "--tensorrt" in text
    assert exec_form(text, "CMD") == dockerfile_cmd()
    assert exec_form(text, "ENTRYPOINT") == ["/usr/local/bin/attnserve-gpu-entrypoint"]


def _gpu_entrypoint() -> str:
    match = re.search(
        r"^COPY <<'EOF' /usr/local/bin/attnserve-gpu-entrypoint\n(.*?)^EOF$",
        DOCKERFILE_GPU.read_text(),
        re.MULTILINE | re.DOTALL,
    )
    assert match
    return match.group(1)


@pytest.mark.parametrize("backend", ["tensorrt", "ort-tensorrt"])
def test_gpu_entrypoint_builds_missing_engines_and_switches_the_backend(
    tmp_path: Path, backend: str
) -> None:
    """Run the image's start script with a stub `attnserve` that records what it was asked."""
    repo, bin_dir = tmp_path / "models", tmp_path / "bin"
    bin_dir.mkdir()
    config = ModelConfig(
        name="vit", kind="classifier", task="classification", input="image", image=ImageSpec(32)
    )
    (repo / "vit" / "1").mkdir(parents=True)
    write_model_config(config, repo / "vit")
    stub = bin_dir / "attnserve"
    stub.write_text(
        '#!/bin/sh\necho "$@" >> "$STUB_LOG"\n'
        'if [ "$1" = export ]; then mkdir -p "$4/$2/1" && touch "$4/$2/1/model.plan"; fi\n'
    )
    stub.chmod(0o755)
    python = bin_dir / "python3"  # the test's interpreter (a venv's symlink would lose the venv)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    script = tmp_path / "entrypoint.sh"
    script.write_text(_gpu_entrypoint())
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "STUB_LOG": str(tmp_path / "calls.log"),
        "ATTNSERVE_REPOSITORY": str(repo),
        "ATTNSERVE_GPU_BACKEND": backend,
        "ATTNSERVE_GPU_MODELS": "vit",
    }
    result = run(["sh", str(script), "attnserve", "serve", "--repository", str(repo)], env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    served = read_model_config(repo / "vit")
    if backend == "tensorrt":
        assert calls[0].startswith("export vit --out") and "--tensorrt" in calls[0]
        assert served.backend == "tensorrt"
    else:
        assert not any("--tensorrt" in c for c in calls)
        assert served.onnxruntime.execution_providers[0] == "TensorrtExecutionProvider"
    assert calls[-1] == f"serve --repository {repo}"  # exec "$@" after the preparation
    assert (repo / "vit" / CONFIG_FILE).is_file()


def test_kubernetes_deployment_runs_the_image_command_with_grpc_probes() -> None:
    deployment = yaml_doc(K8S / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "attnserve:latest"
    assert container["args"] == dockerfile_cmd()
    config = serve_config(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.port, "metrics": config.metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": config.port}, probe
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > config.grace_period_s + float(pre_stop[1])
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"]
    env = {e["name"]: e for e in container["env"]}
    threads = env["ORT_INTRA_OP_NUM_THREADS"]["valueFrom"]["resourceFieldRef"]
    assert threads["resource"] == "limits.cpu"
    uid = re.search(r"useradd .*--uid (\d+)", DOCKERFILE.read_text())
    assert uid and pod["securityContext"]["runAsUser"] == int(uid.group(1))
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_kubernetes_services_expose_grpc_and_metrics() -> None:
    deployment = yaml_doc(K8S / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    cluster, headless = yaml_docs(K8S / "service.yaml")
    for service in (cluster, headless):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        for port in service["spec"]["ports"]:
            assert named[port["targetPort"]] == port["port"]
    assert headless["spec"]["clusterIP"] == "None"
    notes = cluster["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == DEFAULTS.metrics_port == named["metrics"]
    assert notes["prometheus.io/path"] == "/metrics"


def test_kserve_runtime_serves_grpc_v2_on_the_port_it_declares() -> None:
    runtime = yaml_doc(KSERVE / "serving-runtime.yaml")
    service = yaml_doc(KSERVE / "inference-service.yaml")
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    config = serve_config(container["args"])
    assert config.repository == "/mnt/models" and config.host == "0.0.0.0"
    (port,) = container["ports"]
    assert port["containerPort"] == config.port == 8081 and port["name"] == "h2c"
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == config.metrics_port
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"

    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert [p["containerPort"] for p in model["ports"]] == [config.port]


def test_serving_entry_points_import_without_the_training_stack() -> None:
    """What the runtime image runs (CLI, server, health probe) imports with torch unavailable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import attnserve_cli, serving.server\n"
        "attnserve_cli.build_parser().parse_args(['serve', '--help'])\n"
    )
    result = run([sys.executable, "-c", code], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "--metrics-host" in result.stdout


# --- deploy/healthcheck.py against a real grpc.health.v1 server -------------------------------
@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(HEALTHCHECK), *args], cwd=ROOT)


def test_healthcheck_exits_0_when_serving_and_1_when_not(
    health_server: tuple[str, health.HealthServicer],
) -> None:
    address, servicer = health_server
    status = health_pb2.HealthCheckResponse
    servicer.set("", status.SERVING)
    servicer.set("attnserve.v1.AttnServe", status.SERVING)
    result = healthcheck("--address", address)
    assert result.returncode == 0 and "SERVING" in result.stdout, result.stdout + result.stderr
    assert healthcheck("--address", address, "--service", "attnserve.v1.AttnServe").returncode == 0

    servicer.set("", status.NOT_SERVING)  # what the server sets when it starts draining
    result = healthcheck("--address", address)
    assert result.returncode == 1 and "NOT_SERVING" in result.stdout, result.stdout

    result = healthcheck("--address", address, "--service", "no.such.Service")
    assert result.returncode == 1 and "NOT_FOUND" in result.stdout, result.stdout


def test_healthcheck_exits_1_within_its_timeout_without_a_server() -> None:
    start = time.monotonic()
    result = healthcheck("--address", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNAVAILABLE" in result.stdout or "DEADLINE_EXCEEDED" in result.stdout, result.stdout
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_healthcheck_against_a_real_attnserve_server(tmp_path: Path) -> None:
    """The probe the image runs, against `create_server` on a tiny exported ViT (~10 s)."""
    from export.exporter import export
    from tests.serving.conftest import FAST, tiny_sources
    from tests.serving.server_thread import ServerThread

    (vit,) = [source for source in tiny_sources() if source.kind == "vit"]
    export(vit, tmp_path, FAST)
    with ServerThread(tmp_path) as server:
        for service in ("", "attnserve.v1.AttnServe", "inference.GRPCInferenceService"):
            result = healthcheck("--address", server.address, "--service", service)
            assert result.returncode == 0, f"{service!r}: {result.stdout}{result.stderr}"
        assert server.running is not None
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        server.call(server.running.health.set("", not_serving))  # as a drain does
        result = healthcheck("--address", server.address)
        assert result.returncode == 1 and "NOT_SERVING" in result.stdout, result.stdout


def test_healthcheck_defaults_match_the_server() -> None:
    source = HEALTHCHECK.read_text()
    assert f'"127.0.0.1:{DEFAULTS.port}"' in source
