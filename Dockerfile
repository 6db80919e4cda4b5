# syntax=docker/dockerfile:1
# attnserve, CPU serving image (ONNX Runtime).
#
#   docker build -t attnserve:latest .
#   docker run --rm -p 50051:50051 -p 8000:8000 attnserve:latest
#
# Two stages:
#   export   python:3.11-slim + the export extra (PyTorch, CPU wheel): exports the three shipped
#            checkpoints into /models with `attnserve export-all` (parity-checked, ~minutes).
#   runtime  python:3.11-slim + the base install and the serve extra only (ONNX Runtime, gRPC,
#            prometheus-client); holds /models and the package code, runs as a non-root user.
# The pip commands are the README's (`pip install -e ".[...]"`), one extra set per stage.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS export

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app

# torch first, from PyTorch's CPU index: the PyPI wheel of the same version pulls GBs of CUDA
# libraries. The pinned version is the export extra's (pyproject.toml), so the next line keeps it.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md attnserve_cli.py ./
COPY contract contract
COPY models models
COPY export export
COPY serving serving
COPY benchmarks benchmarks
# export checks parity through ONNX Runtime, hence serve as well as export.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -e ".[serve,export]"

RUN attnserve export-all export/plans/shipped.yaml --repository /models

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app

COPY pyproject.toml README.md attnserve_cli.py ./
COPY contract contract
COPY models models
COPY export export
COPY serving serving
COPY benchmarks benchmarks
COPY deploy/healthcheck.py deploy/healthcheck.py
# Base install + serve extra only: the serving package never imports the training stack.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -e ".[serve]"

COPY --from=export /models /models

# A fixed numeric UID so Kubernetes' runAsNonRoot can verify it.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve
USER 10001

# gRPC (attnserve API, KServe v2, grpc.health.v1, reflection) and Prometheus /metrics.
EXPOSE 50051 8080 8000

# Loading three models takes a few seconds; health is SERVING once every model is loaded and
# NOT_SERVING while the server drains on SIGTERM.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/healthcheck.py", "--address", "127.0.0.1:50051", "--timeout", "3"]

# SIGTERM drains: in-flight requests get --grace-period seconds (default 10); `docker stop`
# waits 10 s before SIGKILL, so stop with `-t 15` (compose sets stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["attnserve", "serve", "--repository", "/models", "--host", "0.0.0.0", "--http-port", "8080", "--metrics-host", "0.0.0.0"]
