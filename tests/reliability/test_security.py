"""TLS, mutual TLS and bearer tokens on a real server (loopback port, real certificates)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import attnserve_cli
from contract.schema import SchemaError
from serving.client import AttnServeClient, ClientError
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from serving.security import AUTH_TOKENS_ENV, CLIENT_TOKEN_ENV, SecurityConfigError
from serving.server_config import ServerConfig, load_server_config
from tests.reliability.tls_files import TlsFiles, make_tls_files
from tests.serving.server_thread import ServerThread

HEALTHCHECK = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"
TOKEN = secrets.token_urlsafe(24)
OTHER_TOKEN = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    path.write_text(f"# accepted tokens\n\n{TOKEN}\n  {OTHER_TOKEN}  \n")
    return path


@pytest.fixture(scope="module")
def secured(tiny_repository: Path, tls: TlsFiles, token_file: Path) -> Iterator[ServerThread]:
    """TLS and bearer tokens: the recommended deployment."""
    config = {"tls_cert": str(tls.server_cert), "tls_key": str(tls.server_key)}
    with ServerThread(tiny_repository, auth_token_file=str(token_file), **config) as server:
        yield server


def tls_channel(server: ServerThread, tls: TlsFiles) -> grpc.Channel:
    return grpc.secure_channel(server.address, grpc.ssl_channel_credentials(tls.ca.read_bytes()))


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


# --- configuration errors -------------------------------------------------------------------------
def test_tls_needs_both_cert_and_key() -> None:
    with pytest.raises(ValueError, match="tls_cert is set but tls_key is not"):
        ServerConfig(tls_cert="server.pem")
    with pytest.raises(ValueError, match="tls_key is set but tls_cert is not"):
        ServerConfig(tls_key="server.key")
    with pytest.raises(ValueError, match=r"tls_client_ca \(mutual TLS\) needs TLS"):
        ServerConfig(tls_client_ca="ca.pem")


def test_security_fields_come_from_the_config_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("tls_cert: a.pem\ntls_key: a.key\nauth_token_file: null\n")
    config = load_server_config(path, {"auth_token_file": "tokens.txt", "tls_client_ca": None})
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == ("a.pem", "a.key", None)
    assert config.auth_token_file == "tokens.txt"
    path.write_text("tls_key: a.key\n")
    with pytest.raises(SchemaError, match="tls_key is set but tls_cert is not"):
        load_server_config(path, {})


def refusal(repository: Path, **config: str) -> str:
    """The SecurityConfigError message a server start with ``config`` fails with."""
    with pytest.raises(SecurityConfigError) as err, ServerThread(repository, **config):
        pass
    return str(err.value)


def test_missing_or_mismatched_tls_files_stop_the_start(
    tiny_repository: Path, tls: TlsFiles, tmp_path: Path
) -> None:
    key, cert = str(tls.server_key), str(tls.server_cert)
    missing = tmp_path / "nope.pem"
    message = refusal(tiny_repository, tls_cert=str(missing), tls_key=key)
    assert message == f"TLS certificate (tls_cert) {missing} does not exist"
    message = refusal(tiny_repository, tls_cert=cert, tls_key=str(tls.client_key))
    assert "do not load together (KEY_VALUES_MISMATCH)" in message
    message = refusal(tiny_repository, tls_cert=cert, tls_key=key, tls_client_ca=str(tmp_path))
    assert message == f"client CA (tls_client_ca) {tmp_path} is a directory, not a file"
    message = refusal(tiny_repository, tls_cert=cert, tls_key=key, tls_client_ca=key)
    assert "holds no PEM certificate" in message
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", encrypted],
        check=True,
        capture_output=True,
    )
    message = refusal(tiny_repository, tls_cert=cert, tls_key=str(encrypted))
    assert message == "the TLS private key is encrypted; grpc needs an unencrypted key"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("# nobody\n\n", "holds no token"),
        ("short-token\n", "line 1: the token is shorter than 16"),
        (f"{TOKEN}\nnot a token at all\n", "line 2: the token holds spaces"),
    ],
)
def test_bad_token_files_are_refused_without_echoing_tokens(
    tiny_repository: Path, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(content)
    refused = refusal(tiny_repository, auth_token_file=str(path))
    assert message in refused
    assert TOKEN not in refused and "short-token" not in refused


def test_every_server_config_field_has_a_serve_flag() -> None:
    parser = attnserve_cli.build_parser()
    serve = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    dests = {action.dest for action in serve.choices["serve"]._actions}
    missing = {name for name in ServerConfig.__dataclass_fields__} - dests
    assert not missing, f"ServerConfig fields without a serve flag: {missing}"


# --- TLS ------------------------------------------------------------------------------------------
def test_a_client_trusting_the_ca_is_served(secured: ServerThread, tls: TlsFiles) -> None:
    with AttnServeClient(secured.address, tls_ca=tls.ca, token=TOKEN) as client:
        assert [m.name for m in client.list_models()] == ["captioner", "translator", "vit"]
        assert len(client.translate(["doce", "trois cent douze"], to="de")) == 2
        assert isinstance("".join(client.translate_stream("doce", to="fr")), str)


@pytest.mark.parametrize(
    "client_options",
    [{}, {"tls_ca": "other_ca"}],
    ids=["plaintext client", "client trusting another CA"],
)
def test_clients_that_cannot_do_this_tls_are_refused(
    secured: ServerThread, tls: TlsFiles, client_options: dict[str, str]
) -> None:
    options = {key: getattr(tls, value) for key, value in client_options.items()}
    with (
        AttnServeClient(secured.address, timeout=5, token=TOKEN, **options) as client,
        pytest.raises(ClientError) as err,
    ):
        client.list_models()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate(tiny_repository: Path, tls: TlsFiles) -> None:
    config = {
        "tls_cert": str(tls.server_cert),
        "tls_key": str(tls.server_key),
        "tls_client_ca": str(tls.ca),
    }
    with ServerThread(tiny_repository, **config) as server:
        identity = {"tls_client_cert": tls.client_cert, "tls_client_key": tls.client_key}
        with AttnServeClient(server.address, tls_ca=tls.ca, **identity) as client:
            assert client.health() == "SERVING"
            assert len(client.list_models()) == 3
        with (
            AttnServeClient(server.address, timeout=5, tls_ca=tls.ca) as anonymous,
            pytest.raises(ClientError) as err,
        ):
            anonymous.list_models()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE


# --- bearer tokens ------------------------------------------------------------------------------
def _kserve_stream(channel: grpc.Channel, metadata: Any) -> Any:
    stub = kpb_grpc.GRPCInferenceServiceStub(channel)
    request = kpb.ModelInferRequest(model_name="vit")
    return list(stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=10))


CALLS: dict[str, Callable[[grpc.Channel, Any], Any]] = {
    "Translate": lambda ch, md: pb_grpc.AttnServeStub(ch).Translate(
        pb.TranslateRequest(texts=["doce"], target_language="de"), metadata=md, timeout=10
    ),
    "TranslateStream": lambda ch, md: list(
        pb_grpc.AttnServeStub(ch).TranslateStream(
            pb.TranslateStreamRequest(text="doce", target_language="de"), metadata=md, timeout=10
        )
    ),
    "ListModels": lambda ch, md: pb_grpc.AttnServeStub(ch).ListModels(
        pb.ListModelsRequest(), metadata=md, timeout=10
    ),
    "KServe ModelMetadata": lambda ch, md: kpb_grpc.GRPCInferenceServiceStub(ch).ModelMetadata(
        kpb.ModelMetadataRequest(name="vit"), metadata=md, timeout=10
    ),
    "KServe ServerLive": lambda ch, md: kpb_grpc.GRPCInferenceServiceStub(ch).ServerLive(
        kpb.ServerLiveRequest(), metadata=md, timeout=10
    ),
    "KServe ModelStreamInfer": _kserve_stream,
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "requires a bearer token: send the call metadata `authorization: Bearer <token>`"),
        (bearer(secrets.token_urlsafe(24)), "the bearer token is not accepted"),
        ((("authorization", f"Basic {TOKEN}"),), "must read `Bearer <token>`"),
    ],
    ids=["no token", "wrong token", "wrong scheme"],
)
def test_calls_without_an_accepted_token_are_unauthenticated(
    secured: ServerThread, tls: TlsFiles, call: str, metadata: Any, message: str
) -> None:
    with tls_channel(secured, tls) as channel, pytest.raises(grpc.RpcError) as err:
        CALLS[call](channel, metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in err.value.details()


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_accepted_token_works(secured: ServerThread, tls: TlsFiles, call: str) -> None:
    with tls_channel(secured, tls) as channel:
        for token in (TOKEN, OTHER_TOKEN):
            try:
                CALLS[call](channel, bearer(token))
            except grpc.RpcError as err:  # a refusal of the request itself, not of the caller
                assert err.code() != grpc.StatusCode.UNAUTHENTICATED, err.details()


def test_health_and_reflection_need_no_token(secured: ServerThread, tls: TlsFiles) -> None:
    with tls_channel(secured, tls) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        response = next(iter(reflection.ServerReflectionInfo(iter([request]), timeout=10)))
        names = {s.name for s in response.list_services_response.service}
        assert "attnserve.v1.AttnServe" in names


def test_the_docker_healthcheck_probes_over_tls_without_a_token(
    secured: ServerThread, tls: TlsFiles
) -> None:
    probe = [sys.executable, str(HEALTHCHECK), "--address", secured.address]
    result = subprocess.run([*probe, "--tls-ca", str(tls.ca)], capture_output=True, text=True)
    assert result.returncode == 0 and "SERVING" in result.stdout, result.stdout + result.stderr
    plaintext = subprocess.run([*probe, "--timeout", "2"], capture_output=True, text=True)
    assert plaintext.returncode == 1, plaintext.stdout


def test_tokens_from_the_environment(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTH_TOKENS_ENV, f"{TOKEN}, {OTHER_TOKEN},")
    with ServerThread(tiny_repository) as server:
        for token in (TOKEN, OTHER_TOKEN):
            with AttnServeClient(server.address, token=token) as client:
                assert len(client.list_models()) == 3
        with AttnServeClient(server.address) as client, pytest.raises(ClientError) as err:
            client.list_models()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


# --- the client command line --------------------------------------------------------------------
def test_client_cli_speaks_tls_with_a_token_from_the_environment(
    secured: ServerThread,
    tls: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["translate", "--server", secured.address, "--tls-ca", str(tls.ca), "--to", "de"]
    monkeypatch.delenv(CLIENT_TOKEN_ENV, raising=False)
    assert attnserve_cli.main([*command, "doce"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err

    monkeypatch.setenv(CLIENT_TOKEN_ENV, TOKEN)
    assert attnserve_cli.main([*command, "doce", "trois cent douze"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
