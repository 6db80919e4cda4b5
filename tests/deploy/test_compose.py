"""docker-compose.yml: validates with docker-compose (skipped, with the apt command, where it is
not installed); its services agree with the server (ports, health check), with each other and
with the Prometheus / Grafana files they mount."""

from __future__ import annotations

import shutil

import pytest

from tests.deploy.deploy_files import (
    APT_HINT,
    COMPOSE,
    GRAFANA_PROVIDER,
    ROOT,
    dockerfile_cmd,
    run,
    serve_config,
    yaml_doc,
)


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
    ports = {cmd_config.port, cmd_config.http_port, cmd_config.metrics_port}
    assert published == ports == {50051, 8080, 8000}
    assert "/app/deploy/healthcheck.py" in server["healthcheck"]["test"]
    assert f"127.0.0.1:{cmd_config.port}" in server["healthcheck"]["test"]

    gpu = services["attnserve-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["dockerfile"] == "Dockerfile.gpu"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert {int(p.split(":")[1]) for p in gpu["ports"]} == {50051, 8080, 8000}

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
