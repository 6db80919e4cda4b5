"""One real server with KServe v2 over HTTP/REST for the tests of this package (package-scoped;
system shared memory on), the unmodified Triton HTTP and gRPC clients on it, and a plain HTTP
helper (urllib) for what those clients do not send."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.server_thread import ServerThread

TOKEN = secrets.token_urlsafe(24)
OTHER_TOKEN = secrets.token_urlsafe(24)
TRITON_HTTP = "tritonclient[http] is not installed (pip install 'tritonclient[http]>=2.50')"
TRITON_GRPC = "tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]>=2.50')"


@dataclass
class Answer:
    """An HTTP answer: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    url: str,
    body: bytes | dict[str, Any] | list[Any] | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    timeout: float = 60,
) -> Answer:
    """One HTTP request (POST when there is a body; a dict / list body is sent as JSON)."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    call = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            found = {k.lower(): v for k, v in response.headers.items()}
            return Answer(response.status, found, response.read())
    except urllib.error.HTTPError as err:
        found = {k.lower(): v for k, v in err.headers.items()}
        return Answer(err.code, found, err.read())


def requests_total(server: ServerThread, model: str, method: str, code: str) -> float:
    """attnserve_requests_total{model, method, code} from the server's /metrics."""
    text = request(server.metrics_url).body.decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "attnserve_requests_total"
        and sample.labels.get("model") == model
        and sample.labels.get("method") == method
        and sample.labels.get("code") == code
    )


@pytest.fixture(scope="package")
def server(tiny_repository: Path) -> Iterator[ServerThread]:
    with ServerThread(tiny_repository, http_port=0, system_shared_memory=True) as running:
        yield running


@pytest.fixture(scope="package")
def url(server: ServerThread) -> str:
    """The HTTP/REST base URL, e.g. http://127.0.0.1:PORT."""
    return server.http_url


@pytest.fixture(scope="package")
def triton_http(server: ServerThread) -> Iterator[tuple[ModuleType, Any]]:
    """(tritonclient.http, an InferenceServerClient of the HTTP port); skips without it."""
    httpclient = pytest.importorskip("tritonclient.http", reason=TRITON_HTTP)
    client = httpclient.InferenceServerClient(url=server.http_url.removeprefix("http://"))
    yield httpclient, client
    client.close()


@pytest.fixture(scope="package")
def triton_grpc(server: ServerThread) -> Iterator[tuple[ModuleType, Any]]:
    """(tritonclient.grpc, an InferenceServerClient of the gRPC port); skips without it."""
    grpcclient = pytest.importorskip("tritonclient.grpc", reason=TRITON_GRPC)
    client = grpcclient.InferenceServerClient(url=server.address)
    yield grpcclient, client
    client.close()


@pytest.fixture(scope="package")
def stub(server: ServerThread) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """A KServe stub of the same server's gRPC port (what HTTP answers are compared with)."""
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="package")
def tokened(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The HTTP base URL of a second server (the ViT and the translator, system shared memory
    on, plain HTTP) that takes TOKEN and OTHER_TOKEN."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    tokens.write_text(f"# accepted tokens\n{TOKEN}\n{OTHER_TOKEN}\n")
    with ServerThread(
        tiny_repository,
        http_port=0,
        metrics_port=-1,
        models=("vit", "translator"),
        system_shared_memory=True,
        auth_token_file=str(tokens),
    ) as running:
        yield running.http_url
