"""`attnserve score` against a real server: the lines it prints are the Score call's answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import attnserve_cli
from serving.client import AttnServeClient
from tests.serving.hf_marian import load_marian
from tests.serving.server_thread import ServerThread

pytestmark = pytest.mark.usefixtures("offline_hub")


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    pytest.importorskip("transformers", reason="needs the export extra")
    return load_marian(hf_sources["marian"], 4, seed=5)


def test_pairs_print_score_mean_and_target(
    hf_server: ServerThread,
    hf_client: AttnServeClient,
    marian: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    texts = marian["texts"][:3]
    targets = ["eins", "zwei drei", ""]  # short: the random model's pieces are a few letters
    expected = hf_client.score(texts, targets, to="de", model="marian")
    pairs = [item for pair in zip(texts, targets, strict=True) for item in pair]
    args = ["score", "--to", "de", "--model", "marian", "--server", hf_server.address, *pairs]
    assert attnserve_cli.main([*args, "--log-probs"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert len(lines) == 2 * len(texts)
    for (summary, values), target, scored in zip(
        zip(lines[::2], lines[1::2], strict=True), targets, expected, strict=True
    ):
        score, mean, printed = summary.split("\t", 2)
        assert printed == target
        assert float(score) == pytest.approx(scored.score, abs=1e-4)
        assert float(mean) == pytest.approx(scored.score / (len(scored.token_ids) + 1), abs=1e-4)
        numbers = [float(v) for v in values.split("\t")]
        assert numbers == pytest.approx([*scored.token_log_probs, scored.eos_log_prob], abs=1e-4)
    assert [len(s.token_ids) for s in expected][2] == 0 and len(expected[1].token_ids) > 1


def test_an_odd_pair_list_and_a_missing_image_are_usage_errors(
    hf_server: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ["--server", hf_server.address, "--model", "marian"]
    assert attnserve_cli.main(["score", "--to", "de", *server, "one", "eins", "two"]) == 2
    assert "SOURCE TARGET pairs" in capsys.readouterr().err
    missing = tmp_path / "none.png"
    assert attnserve_cli.main(["score", "--image", str(missing), *server, "a caption"]) == 2
    assert f"image {missing} does not exist" in capsys.readouterr().err


def test_a_refusal_prints_the_status(
    hf_server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["score", "--to", "xx", "--model", "marian", "--server", hf_server.address]
    assert attnserve_cli.main([*args, "one", "eins"]) == 2
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "target_language 'xx'" in err
