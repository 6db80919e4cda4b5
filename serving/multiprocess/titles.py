"""The names the server's processes show in ``ps -o comm`` / ``top`` / ``pgrep``.

``attnserve serve --frontend-workers N`` (N >= 2) runs a supervisor ``attnserve``, an engine
process ``attnserve-eng`` and frontends ``attnserve-fe0`` ... ``attnserve-fe{N-1}``. With one
frontend the server is one process, named as it was started.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

SUPERVISOR_TITLE = "attnserve"
ENGINE_TITLE = "attnserve-eng"
FRONTEND_TITLE = "attnserve-fe"  # + the frontend's index


def set_process_title(title: str) -> None:
    """Name this process for ``ps -o comm`` / ``top`` (Linux keeps 15 bytes; elsewhere a no-op);
    threads started afterwards inherit the name."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(title[:15])
