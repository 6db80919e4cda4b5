"""Bearer tokens, TLS and mutual TLS on the HTTP/REST port of real servers (loopback ports, real
certificates made with openssl): what the gRPC port enforces, the HTTP port enforces too.

Asserted: without an accepted token every route but /v2/health/* is 401 with
``WWW-Authenticate: Bearer`` and a message saying what to send (a wrong token, a wrong scheme),
and no path spelling slips past; an accepted token, from urllib or from the unmodified
tritonclient.http (``headers=``), is served. With TLS, HTTPS trusting the CA is served (urllib
and tritonclient.http), plain HTTP and a client trusting another CA are not; with mutual TLS a
client without a certificate is refused and one with the CA's client certificate is served.
"""

from __future__ import annotations

import http.client
import json
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.tls_files import TlsFiles, make_tls_files
from tests.serving.rest.conftest import OTHER_TOKEN, TOKEN, TRITON_HTTP, Answer, request
from tests.serving.server_thread import ServerThread

TIMEOUT = 30
VIT_JSON = {
    "inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 32, 32, 3], "data": [0] * 3072}]
}
# (method, path, body) of routes that need a token: one of each kind
GUARDED: list[tuple[str, str, Any]] = [
    ("GET", "/v2", None),
    ("GET", "/v2/models/vit", None),
    ("GET", "/v2/models/vit/ready", None),
    ("GET", "/v2/models/vit/config", None),
    ("GET", "/v2/models/stats", None),
    ("POST", "/v2/models/vit/infer", VIT_JSON),
    ("POST", "/v2/repository/index", {}),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/logging", {"log_verbose_level": 3}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("GET", "/v2/nothing", None),  # an unknown route says nothing either
]
# spellings of guarded routes under the open /v2/health/ prefix
SNEAKY_PATHS = (
    "/v2/health/../models/vit",
    "/v2/health/..%2Fmodels%2Fvit",
    "/v2/health/%2E%2E/models/vit/config",
    "/v2/health/live/../../models/vit/config",
    "/v2/health/./../models/vit",
    "//v2/models/vit",
    "/v2/models/vit/../../health/../models/vit",
)
NEEDS_TOKEN = "this server requires a bearer token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_unauthenticated(answer: Answer, words: str, what: str) -> None:
    assert answer.status == 401, f"{what}: {answer}"
    assert answer.headers.get("www-authenticate") == "Bearer", f"{what}: {answer.headers}"
    message = answer.json()["error"]
    assert words in message, f"{what}: {message}"
    assert TOKEN not in message and OTHER_TOKEN not in message, "a 401 must not echo a token"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_url(tiny_repository: Path, tls: TlsFiles) -> Iterator[str]:
    """The HTTPS base URL of a server with TLS (no client certificates)."""
    files = {"tls_cert": str(tls.server_cert), "tls_key": str(tls.server_key)}
    with ServerThread(
        tiny_repository, http_port=0, metrics_port=-1, models=("vit",), **files
    ) as running:
        yield running.http_url.replace("http://", "https://")


def client_context(ca: Path, identity: TlsFiles | None = None) -> ssl.SSLContext:
    """A TLS client context trusting ``ca`` (and presenting ``identity``'s client certificate)."""
    context = ssl.create_default_context(cafile=str(ca))
    if identity is not None:
        context.load_cert_chain(str(identity.client_cert), str(identity.client_key))
    return context


def https(url: str, context: ssl.SSLContext, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url, data=data)
    with urllib.request.urlopen(call, timeout=TIMEOUT, context=context) as response:
        return response.status, response.read()


# --- bearer tokens ------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "body"), GUARDED)
def test_no_token_is_401_with_www_authenticate(
    tokened: str, method: str, path: str, body: Any
) -> None:
    answer = request(tokened + path, body, method=method)
    assert_unauthenticated(answer, NEEDS_TOKEN, f"{method} {path} without a token")
    assert "Bearer <token>" in answer.json()["error"], "the 401 must say what to send"


@pytest.mark.parametrize(
    ("authorization", "words"),
    [
        (f"Bearer {secrets.token_urlsafe(24)}", "the bearer token is not accepted"),
        (f"Bearer {TOKEN[:-1]}", "the bearer token is not accepted"),
        (f"Basic {TOKEN}", "must read `Bearer <token>`"),
        ("Bearer ", "must read `Bearer <token>`"),
        (TOKEN, "must read `Bearer <token>`"),
    ],
    ids=["wrong token", "truncated token", "basic scheme", "no token", "no scheme"],
)
def test_a_token_not_accepted_is_401(tokened: str, authorization: str, words: str) -> None:
    for method, path, body in GUARDED[:6]:
        answer = request(tokened + path, body, {"Authorization": authorization}, method=method)
        assert_unauthenticated(answer, words, f"{method} {path} with {authorization[:6]}...")


def test_every_accepted_token_is_served(tokened: str) -> None:
    for token in (TOKEN, OTHER_TOKEN):
        for method, path, body in GUARDED[:-1]:
            answer = request(tokened + path, body, bearer(token), method=method)
            assert answer.status == 200, f"{method} {path} with an accepted token: {answer}"
        answer = request(tokened + "/v2/nothing", None, bearer(token))
        assert answer.status == 404, "past the token, an unknown route is 404"
    answer = request(tokened + "/v2/models/vit", None, {"authorization": f"bearer  {TOKEN} "})
    assert answer.status == 200, "the scheme is case-insensitive and spaces around the token go"
    request(tokened + "/v2/logging", {"log_verbose_level": 0}, bearer(TOKEN))  # as it was


def test_health_needs_no_token(tokened: str) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert request(tokened + path).status == 200, f"GET {path} must not need a token"
        wrong = request(tokened + path, None, bearer("x" * 24))
        assert wrong.status == 200, f"GET {path} ignores the token: {wrong}"


@pytest.mark.parametrize("path", SNEAKY_PATHS)
def test_no_path_spelling_slips_past_the_token(tokened: str, path: str) -> None:
    host = tokened.removeprefix("http://")
    connection = http.client.HTTPConnection(host, timeout=TIMEOUT)
    try:
        connection.request("GET", path)  # sent as written: urllib would not touch it either
        response = connection.getresponse()
        status, body = response.status, response.read()
    finally:
        connection.close()
    assert status in (401, 404), f"GET {path} without a token: {status} {body[:200]!r}"
    assert b'"versions"' not in body and b'"input"' not in body, "a model's details leaked"


def test_tritonclient_http_with_and_without_headers(tokened: str) -> None:
    httpclient = pytest.importorskip("tritonclient.http", reason=TRITON_HTTP)
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(tokened.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()  # health: no token
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata("vit")
        assert err.value.status() == "401" and NEEDS_TOKEN in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata("vit", headers=bearer("y" * 32))
        assert err.value.status() == "401" and "not accepted" in err.value.message()

        headers = bearer(TOKEN)
        assert client.get_model_metadata("vit", headers=headers)["name"] == "vit"
        assert client.is_model_ready("vit", headers=headers)
        image = httpclient.InferInput("image", [1, 32, 32, 3], "UINT8")
        image.set_data_from_numpy(np.zeros((1, 32, 32, 3), np.uint8), binary_data=True)
        result = client.infer("vit", [image], headers=headers)
        assert result.as_numpy("probabilities").shape == (1, 10)
        assert client.get_log_settings(headers=headers)["log_info"] is True
        assert client.get_system_shared_memory_status(headers=headers) == []
    finally:
        client.close()


# --- TLS ------------------------------------------------------------------------------------------
def test_https_trusting_the_ca_is_served(tls_url: str, tls: TlsFiles) -> None:
    context = client_context(tls.ca)
    assert https(tls_url + "/v2/health/ready", context)[0] == 200
    status, body = https(tls_url + "/v2/models/vit", context)
    assert status == 200 and b'"name": "vit"' in body
    status, body = https(tls_url + "/v2/models/vit/infer", context, VIT_JSON)
    assert status == 200 and b'"probabilities"' in body
    localhost = tls_url.replace("127.0.0.1", "localhost")  # the certificate names both
    assert https(localhost + "/v2/health/live", context)[0] == 200


def test_tritonclient_http_over_tls(tls_url: str, tls: TlsFiles) -> None:
    httpclient = pytest.importorskip("tritonclient.http", reason=TRITON_HTTP)
    gevent_ssl = pytest.importorskip("gevent.ssl")
    client = httpclient.InferenceServerClient(
        tls_url.removeprefix("https://"),
        ssl=True,
        ssl_options={"ca_certs": str(tls.ca)},
        ssl_context_factory=gevent_ssl.create_default_context,
    )
    try:
        assert client.is_server_ready()
        assert client.get_model_metadata("vit")["name"] == "vit"
    finally:
        client.close()


def test_plain_http_to_the_tls_port_fails(tls_url: str) -> None:
    plain = tls_url.replace("https://", "http://") + "/v2/health/live"
    failures = (urllib.error.URLError, ConnectionError, http.client.HTTPException)
    with pytest.raises(failures), urllib.request.urlopen(plain, timeout=TIMEOUT) as response:
        pytest.fail(f"plain HTTP to the TLS port answered {response.status}")


def test_a_client_trusting_another_ca_is_refused(tls_url: str, tls: TlsFiles) -> None:
    with pytest.raises(urllib.error.URLError) as err:
        https(tls_url + "/v2/health/live", client_context(tls.other_ca))
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError), err.value


def test_mutual_tls_needs_a_client_certificate(tiny_repository: Path, tls: TlsFiles) -> None:
    files = {
        "tls_cert": str(tls.server_cert),
        "tls_key": str(tls.server_key),
        "tls_client_ca": str(tls.ca),
    }
    with ServerThread(
        tiny_repository, http_port=0, metrics_port=-1, models=("vit",), **files
    ) as running:
        url = running.http_url.replace("http://", "https://")
        with_identity = client_context(tls.ca, tls)
        assert https(url + "/v2/health/ready", with_identity)[0] == 200
        assert https(url + "/v2/models/vit", with_identity)[0] == 200
        for path in ("/v2/health/live", "/v2/models/vit"):
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                https(url + path, client_context(tls.ca))  # no client certificate
