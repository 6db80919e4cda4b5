"""A model repository copied for a benchmark to change (its files linked, not copied), and a
config.yaml rewritten in it without touching the source's."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from contract.repository import read_model_config, write_model_config
from serving.repository import model_entries


def linked_copy(source: Path, target: Path, names: tuple[str, ...] = ()) -> Path:
    """``source``'s entries (``names``; empty: all) under ``target``, each file a hard link (a
    symbolic link across file systems); returns ``target``."""

    def link(origin: str, copy: str) -> None:
        try:
            os.link(origin, copy)
        except OSError:  # another file system
            os.symlink(os.path.abspath(origin), copy)

    for entry in model_entries(source):
        if not names or entry.name in names:
            shutil.copytree(entry, target / entry.name, copy_function=link)
    return target


def rewrite_config(entry: Path, **changes: Any) -> None:
    """Replace fields of ``entry``'s config.yaml (a section's fields as a dict: ``batching={...}``)
    by a new file: the old one is a link to the source's, which stays as it was."""
    config = read_model_config(entry)
    fields = {
        name: dataclasses.replace(getattr(config, name), **value)
        if isinstance(value, dict)
        else value
        for name, value in changes.items()
    }
    (entry / "config.yaml").unlink()
    write_model_config(dataclasses.replace(config, **fields), entry)
