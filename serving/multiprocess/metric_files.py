"""Reading the metric files of a multi-process server without failing a scrape.

prometheus-client's ``MultiProcessCollector`` raises on the first file it cannot read, and that
fails the whole /metrics answer (HTTP 500). A file can be unreadable for a moment: a process
creates its ``*.db`` file empty and sizes it a moment later (prometheus/client_python#1199), and
a scrape in between reads a header that is not there (``struct.error``). A process killed in that
moment leaves the empty file for good. ``TolerantCollector`` reads again after a short wait,
and a file that still cannot be read is left out of the answer with a warning naming it, so the
other processes' metrics are still served.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import struct
import time
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)

# what reading a file that is being created or written can raise
TORN_READ = (struct.error, RuntimeError, UnicodeDecodeError, json.JSONDecodeError, OSError)
ATTEMPTS = 3
RETRY_WAIT_S = 0.005


def readable(path: str) -> bool:
    """Whether every entry of the metric file ``path`` reads and parses now."""
    try:
        for key, _value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
            json.loads(key)
    except TORN_READ:
        return False
    return True


class TolerantCollector(MultiProcessCollector):
    """``MultiProcessCollector`` whose scrape survives a metric file it cannot read."""

    def __init__(self, registry: object, path: str) -> None:
        super().__init__(registry, path=path)
        self._reported: set[str] = set()

    def _files(self) -> list[str]:
        return glob.glob(os.path.join(self._path, "*.db"))

    def collect(self) -> Iterable[Metric]:
        for _ in range(ATTEMPTS - 1):
            try:
                return self.merge(self._files(), accumulate=True)
            except TORN_READ:
                time.sleep(RETRY_WAIT_S)
        files = self._files()
        good = [path for path in files if readable(path)]
        for path in sorted(set(files) - set(good) - self._reported):
            self._reported.add(path)
            log.warning(
                "metrics: left %s out of /metrics: it cannot be read (empty or cut short, as "
                "a process killed while creating it leaves it); delete it if no process of "
                "this server writes it",
                path,
            )
        return self.merge(good, accumulate=True)
