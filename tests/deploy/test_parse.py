"""Every YAML / JSON deployment file parses (compose, Prometheus, Grafana, Kubernetes, KServe),
embedded YAML (the prometheus-adapter rules) included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.deploy_files import K8S, ROOT, YAML_FILES, adapter_rules, dashboard, yaml_docs


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_files_parse(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs and all(isinstance(doc, dict) for doc in docs)


def test_json_and_embedded_yaml_parse() -> None:
    board = dashboard()
    assert board["panels"] and board["schemaVersion"] >= 39
    assert adapter_rules()
    assert len(yaml_docs(K8S / "service.yaml")) == 2  # ClusterIP + headless
