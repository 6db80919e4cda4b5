"""The client commands against an address where no server listens: a clear error, no hang."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import attnserve_cli


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("name", ["translate", "caption", "score"])
def test_no_server_names_the_address_and_how_to_start_one(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    image = tmp_path / "x.png"  # a real PNG: the image is read before the call
    Image.new("RGB", (8, 8)).save(image)
    given = {"translate": ["--to", "de", "five"], "score": ["--to", "de", "five", "fünf"]}.get(
        name, [str(image)]
    )
    address = f"127.0.0.1:{_closed_port()}"
    code = attnserve_cli.main([name, "--server", address, "--timeout", "5", *given])
    err = capsys.readouterr().err
    assert code == 1
    assert "UNAVAILABLE" in err
    assert f"no server answered at {address}" in err and "--server HOST:PORT" in err
