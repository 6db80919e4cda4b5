"""`attnserve stats` against a real server: the table and the JSON lines count what was sent;
an unknown model is a usage error (exit 2) naming the served ones."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

import attnserve_cli
from contract.images import encode_png
from serving.client import AttnServeClient, ClientError
from serving.stats_table import COLUMNS
from tests.serving.kserve.infer_requests import digit_images
from tests.serving.server_thread import ServerThread


def test_stats_counts_what_was_sent(
    tiny_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ServerThread(tiny_repository, metrics_port=-1) as server:
        image = encode_png(digit_images(1)[0])
        with AttnServeClient(server.address, timeout=30) as client:
            for _ in range(2):
                client.classify(image)
            with pytest.raises(ClientError) as err:
                client.classify(b"not an image")
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        sent = time.time()

        assert attnserve_cli.main(["stats", "--server", server.address, "--json"]) == 0
        rows = {
            row["model"]: row for row in map(json.loads, capsys.readouterr().out.split("\n")[:-1])
        }
        assert sorted(rows) == ["captioner", "translator", "vit"]
        vit = rows["vit"]
        assert (vit["version"], vit["ok"], vit["failed"]) == ("1", 2, 1)
        assert vit["compute_ms"] > 0 and vit["queue_ms"] >= 0 and vit["per_execution"] == 1.0
        assert vit["cache_hits"] == 0  # no response cache on this server
        assert vit["compute_ms"] + vit["queue_ms"] <= vit["latency_ms"]
        assert 0 <= vit["last_s_ago"] <= time.time() - sent + 1
        assert rows["translator"]["ok"] == 0 and rows["translator"]["latency_ms"] is None

        assert attnserve_cli.main(["stats", "--server", server.address, "--model", "vit"]) == 0
        header, line = capsys.readouterr().out.splitlines()
        assert header.split() == list(COLUMNS)
        assert line.split()[:4] == ["vit", "1", "2", "1"]

        code = attnserve_cli.main(["stats", "--server", server.address, "--model", "nope"])
        assert code == 2
        assert "no model named 'nope'" in capsys.readouterr().err
