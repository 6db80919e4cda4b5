"""Security of the gRPC and HTTP/REST ports: TLS credentials and bearer-token authentication.

- TLS: ``ServerConfig.tls_cert`` / ``tls_key`` (PEM files) make the gRPC port (and the HTTP/REST
  port, where it is on) speak TLS; with
  ``tls_client_ca`` every client must also present a certificate signed by that CA (mutual TLS).
  The /metrics port stays plain HTTP.
- Tokens: ``ServerConfig.auth_token_file`` (one token a line, ``#`` comments) and / or the
  environment variable ``ATTNSERVE_AUTH_TOKENS`` (comma-separated). When either holds a token,
  every call must carry the metadata ``authorization: Bearer <token>``, else it fails with
  UNAUTHENTICATED (HTTP: the same header, else 401). grpc.health.v1, server reflection and the
  HTTP health routes stay open (load balancer and Kubernetes probes carry no token). Tokens
  never appear on a command line or in an error message.
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc

log = logging.getLogger(__name__)

AUTH_TOKENS_ENV = "ATTNSERVE_AUTH_TOKENS"  # server: accepted tokens, comma-separated
CLIENT_TOKEN_ENV = "ATTNSERVE_TOKEN"  # client CLI: the token to send
MIN_TOKEN_LENGTH = 16
# Services any caller may use: probes need no token, reflection describes the API only.
OPEN_SERVICES: tuple[str, ...] = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
AUTH_HINT = (
    "send the call metadata `authorization: Bearer <token>` (HTTP: that header; attnserve "
    f"client commands: set {CLIENT_TOKEN_ENV} or pass --token)"
)


class SecurityConfigError(ValueError):
    """A TLS or token setting that cannot be used; the message names the file or variable."""


class SecuritySettings(Protocol):
    """The ``ServerConfig`` fields this module reads."""

    @property
    def tls_cert(self) -> str | None: ...
    @property
    def tls_key(self) -> str | None: ...
    @property
    def tls_client_ca(self) -> str | None: ...
    @property
    def auth_token_file(self) -> str | None: ...


def read_secret_file(path: str | Path, what: str) -> bytes:
    """The bytes of a PEM / token file.

    Raises:
        SecurityConfigError: the file is missing, not a file, unreadable or empty (named).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SecurityConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise SecurityConfigError(f"{what} {path} is a directory, not a file") from None
    except OSError as err:
        raise SecurityConfigError(f"cannot read {what} {path}: {err.strerror}") from None
    if not data.strip():
        raise SecurityConfigError(f"{what} {path} is empty")
    return data


def _no_password() -> NoReturn:
    raise SecurityConfigError("the TLS private key is encrypted; grpc needs an unencrypted key")


def check_certificate_pair(cert: str | Path, key: str | Path) -> None:
    """Check that ``cert`` and ``key`` are PEM and belong together (with the ssl module).

    Raises:
        SecurityConfigError: naming both files and what OpenSSL said.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key), password=_no_password)
    except ssl.SSLError as err:
        raise SecurityConfigError(
            f"TLS certificate {cert} and key {key} do not load together ({err.reason or err}); "
            "both must be PEM and the key must be the certificate's"
        ) from None


def check_ca_file(path: str | Path, what: str) -> None:
    """Check that ``path`` holds PEM CA certificates.

    Raises:
        SecurityConfigError: naming the file.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(path))
    except ssl.SSLError as err:
        raise SecurityConfigError(
            f"{what} {path} holds no PEM certificate ({err.reason or err})"
        ) from None


def server_credentials(config: SecuritySettings) -> grpc.ServerCredentials | None:
    """TLS credentials for the gRPC port, or None when TLS is off.

    Raises:
        SecurityConfigError: a missing, unreadable or mismatched file (named).
    """
    if not config.tls_cert or not config.tls_key:
        return None
    cert = read_secret_file(config.tls_cert, "TLS certificate (tls_cert)")
    key = read_secret_file(config.tls_key, "TLS private key (tls_key)")
    check_certificate_pair(config.tls_cert, config.tls_key)
    client_ca = None
    if config.tls_client_ca:
        client_ca = read_secret_file(config.tls_client_ca, "client CA (tls_client_ca)")
        check_ca_file(config.tls_client_ca, "client CA (tls_client_ca)")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_ssl_context(config: SecuritySettings) -> ssl.SSLContext | None:
    """The HTTP/REST port's TLS: the same certificate, key and client CA as the gRPC port's
    (None when TLS is off).

    Raises:
        SecurityConfigError: as ``server_credentials``.
    """
    if server_credentials(config) is None:  # checks every file, as for the gRPC port
        return None
    assert config.tls_cert and config.tls_key
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(config.tls_cert, config.tls_key, password=_no_password)
    if config.tls_client_ca:
        context.load_verify_locations(cafile=config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def check_token(token: str, where: str) -> str:
    """``token`` if it is usable as a bearer token; ``where`` names its source, never the token.

    Raises:
        SecurityConfigError: too short, or characters that cannot go into gRPC metadata.
    """
    if not all("!" <= c <= "~" for c in token):
        raise SecurityConfigError(
            f"{where}: the token holds spaces or non-ASCII characters; use printable ASCII"
        )
    if len(token) < MIN_TOKEN_LENGTH:
        raise SecurityConfigError(
            f"{where}: the token is shorter than {MIN_TOKEN_LENGTH} characters; generate one "
            "with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token


def accepted_tokens(
    config: SecuritySettings, environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """Every accepted bearer token (file and environment); empty means authentication is off.

    Raises:
        SecurityConfigError: an unreadable or empty token file, or a bad token (by line number).
    """
    environ = os.environ if environ is None else environ
    tokens: list[str] = []
    if config.auth_token_file:
        path = config.auth_token_file
        raw = read_secret_file(path, "token file (auth_token_file)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SecurityConfigError(f"token file {path} is not UTF-8 text") from None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                tokens.append(check_token(line, f"{path} line {number}"))
        if not tokens:
            raise SecurityConfigError(f"token file {path} holds no token (only comments)")
    items = environ.get(AUTH_TOKENS_ENV, "").split(",")
    for number, item in enumerate(items, 1):
        if item.strip():
            tokens.append(check_token(item.strip(), f"{AUTH_TOKENS_ENV} (entry {number})"))
    return tuple(dict.fromkeys(tokens))


def _rejecting_handler(
    handler: grpc.RpcMethodHandler | None, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape as ``handler`` that fails with UNAUTHENTICATED."""

    async def reject(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    request_streaming = bool(handler and handler.request_streaming)
    response_streaming = bool(handler and handler.response_streaming)
    if request_streaming and response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject)
    if request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject)
    if response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject)
    return grpc.unary_unary_rpc_method_handler(reject)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only with ``authorization: Bearer <accepted token>`` metadata."""

    def __init__(self, tokens: Iterable[str], open_services: Sequence[str] = OPEN_SERVICES):
        self._tokens = [token.encode() for token in tokens]
        if not self._tokens:
            raise ValueError("BearerTokenInterceptor needs at least one token")
        self._open = frozenset(open_services)

    def problem(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
        """Why a call with this metadata is refused, or None when its token is accepted."""
        values = [value for key, value in metadata or () if key.lower() == "authorization"]
        if not values:
            return f"this server requires a bearer token: {AUTH_HINT}"
        value = values[-1]
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return f"the authorization metadata must read `Bearer <token>`: {AUTH_HINT}"
        presented = token.strip().encode("utf-8", "replace")
        accepted = False
        for candidate in self._tokens:  # compare with every token: no early exit, no timing hint
            accepted |= hmac.compare_digest(candidate, presented)
        return None if accepted else "the bearer token is not accepted by this server"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        service = handler_call_details.method.lstrip("/").rpartition("/")[0]
        if service in self._open:
            return await continuation(handler_call_details)
        problem = self.problem(handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if problem is None:
            return handler
        log.debug("refused %s: %s", handler_call_details.method, problem)
        return _rejecting_handler(handler, problem)
