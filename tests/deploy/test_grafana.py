"""The Grafana dashboard: uses the provisioned Prometheus datasource and covers every exported
metric with the panels asked for (errors by code, latency quantiles, batch size by stage)."""

from __future__ import annotations

import json
import re

from serving.metrics import METRIC_NAMES
from tests.deploy.deploy_files import GRAFANA_DATASOURCE, METRIC_RE, base_name, dashboard, yaml_doc


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
