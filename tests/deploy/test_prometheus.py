"""Prometheus: the scrape config and the metrics endpoint agree with the server; every metric and
label the dashboard, the alerts and the adapter rules use is one a real ``ServingMetrics``
exports; the config, the alert rules and every PromQL expression pass promtool, and the alert
rules fire (and stay quiet) as intended in promtool's rule unit tests."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from serving.metrics import METRIC_NAMES, ServingMetrics
from tests.deploy.deploy_files import (
    ALERTS,
    DEFAULTS,
    METRIC_RE,
    PROMETHEUS,
    TARGET_LABELS,
    base_name,
    concrete_promql,
    exported_series,
    label_values_query,
    labels_used,
    promql_expressions,
    promtool,
    run,
    yaml_doc,
)


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
