"""Kubernetes and KServe manifests agree with the server and the image: the Deployment runs the
Dockerfile's command with gRPC probes, the Services expose gRPC and metrics, the HPA's metrics
come from prometheus-adapter rules over exported series, and the KServe ServingRuntime serves
grpc-v2 on the port it declares."""

from __future__ import annotations

import re

from tests.deploy.deploy_files import (
    DEFAULTS,
    DOCKERFILE,
    K8S,
    KSERVE,
    adapter_exposed_name,
    adapter_rules,
    adapter_series,
    dockerfile_cmd,
    exported_series,
    serve_config,
    yaml_doc,
    yaml_docs,
)


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


def test_kubernetes_deployment_runs_the_image_command_with_grpc_probes() -> None:
    deployment = yaml_doc(K8S / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "attnserve:latest"
    assert container["args"] == dockerfile_cmd()
    config = serve_config(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.port, "http": config.http_port, "metrics": config.metrics_port}
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
