"""Throw-away TLS files for tests, made with the openssl command line tool (EC P-256, 2 days)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # CA certificate (trusted by clients, and by the server for client certificates)
    server_cert: Path  # for 127.0.0.1 and localhost, signed by ca
    server_key: Path
    client_cert: Path  # a client identity signed by ca (mutual TLS)
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)


def _self_signed_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _new_key(key)
    _openssl(
        "req", "-x509", "-new", "-key", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}"
    )
    return cert, key


def _signed(folder: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    extfile = folder / f"{name}.ext"
    extfile.write_text(extensions + "\n")
    _new_key(key)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", extfile,
    )  # fmt: skip
    return cert, key


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1 / localhost, a client certificate, another CA.

    Skips the calling test when the openssl tool is absent.
    """
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line tool is not installed (Debian package openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    ca = _self_signed_ca(folder, "test-ca")
    other_ca, _ = _self_signed_ca(folder, "other-ca")
    server = _signed(
        folder,
        "server",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
    )
    client = _signed(folder, "client", ca, "extendedKeyUsage=clientAuth")
    return TlsFiles(ca[0], server[0], server[1], client[0], client[1], other_ca)
