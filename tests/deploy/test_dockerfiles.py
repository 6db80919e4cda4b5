"""Dockerfile and Dockerfile.gpu: stages, command lines parsed by the real ``attnserve`` parser,
COPY sources that exist and are not dockerignored, the GPU entrypoint (run with a stub
``attnserve``), and a runtime stage that installs and imports no training stack."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from contract.model_config import ClassifierConfig, ImageSpec
from contract.repository import CONFIG_FILE, read_model_config, write_model_config
from tests.deploy.deploy_files import (
    DEFAULTS,
    DOCKERFILE,
    DOCKERFILE_GPU,
    ROOT,
    docker_stages,
    dockerfile_cmd,
    exec_form,
    run,
    serve_config,
)


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
    assert re.search(r"^EXPOSE\s+50051\s+8080\s+8000\s*$", runtime, re.MULTILINE)
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
    config = ClassifierConfig(name="vit", image=ImageSpec(32))
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
