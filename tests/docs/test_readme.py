"""The README's quickstart runs as printed on a fresh clone, and its links point inside the repo.

The quickstart block's client commands are run through the real CLI against a real server on the
shipped models (with ``--server`` pointing at the test's port); the comment after each command
is what it prints (a trailing "..." marks a prefix).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.server_thread import ServerThread

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLIENT = ".venv/bin/attnserve "


def quickstart_commands() -> list[tuple[list[str], str]]:
    """(argv after `attnserve`, expected output) of each client line in the README's code blocks
    before the first section heading."""
    intro = README.read_text().split("\n## ", 1)[0]
    commands = []
    for line in intro.splitlines():
        if not line.startswith(CLIENT):
            continue
        command, _, expected = line[len(CLIENT) :].partition("#")
        commands.append((shlex.split(command), expected.strip()))
    return commands


def test_the_quickstart_has_commands_for_every_task() -> None:
    tasks = [argv[0] for argv, _ in quickstart_commands()]
    assert {"translate", "caption", "classify"} <= set(tasks)
    assert all(expected for _, expected in quickstart_commands())


def test_files_the_quickstart_names_are_in_the_repository() -> None:
    for argv, _ in quickstart_commands():
        for arg in argv:
            if re.search(r"\.(png|jpe?g)$", arg):
                assert (ROOT / arg).is_file(), f"README names {arg}, which the repository lacks"


@pytest.mark.slow
def test_quickstart_commands_print_what_the_readme_says(shipped_repository: Path) -> None:
    with ServerThread(shipped_repository) as server:
        for argv, expected in quickstart_commands():
            done = subprocess.run(
                [sys.executable, "-m", "attnserve_cli", *argv, "--server", server.address],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            printed = " ".join(done.stdout.split())
            if expected.endswith("..."):
                assert printed.startswith(expected[:-3].strip()), (argv, printed)
            else:
                assert printed == expected, (argv, printed)


def test_readme_and_docs_point_only_inside_the_repository() -> None:
    texts = {path: path.read_text() for path in [README, *ROOT.glob("docs/*.md")]}
    for path, text in texts.items():
        assert "shared/" not in text and "FACTS" not in text, path
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def _yaml_blocks_after(heading: str) -> list[str]:
    section = README.read_text().split(heading, 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, re.S)


def test_configuration_examples_load_as_the_server_reads_them(tmp_path: Path) -> None:
    """The server.yaml and the generator's config.yaml shown under Configuration are what the
    server accepts: every field exists, and the values shown are the defaults export writes."""
    import yaml

    from contract.model_config import GeneratorConfig, model_config_from_mapping
    from serving.server_config import ServerConfig, load_server_config

    server_yaml, generator_yaml, _classifier = _yaml_blocks_after("### Configuration")
    (tmp_path / "server.yaml").write_text(server_yaml)
    server = load_server_config(tmp_path / "server.yaml", {})
    assert server == ServerConfig(host="127.0.0.1", metrics_host="127.0.0.1")
    generator = model_config_from_mapping(yaml.safe_load(generator_yaml))
    assert isinstance(generator, GeneratorConfig)
    assert generator.tokenizer is not None and generator.decoder.suppress_ids == ()
