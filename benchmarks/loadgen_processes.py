"""The load generator's clients spread over several processes.

One Python event loop issues a few thousand gRPC calls a second at most, so on a large host it,
not the server, would cap a load point (the GPU goals ask for 10,000 images/s at 256 clients).
``ClientProcesses`` starts ``count`` client processes once (spawned: no grpc state crosses a
fork) and runs each load point on all of them at once: every process opens its own channels,
warms up, waits at a common start time and then drives its share of the concurrency (closed
loop) or of the arrival rate (open loop: independent Poisson streams add up to one of the
summed rate). Their records come back to the parent, which summarises them as one point.

The start time is a ``time.perf_counter`` value: on Linux that is CLOCK_MONOTONIC, one clock for
every process on the machine, so the records' times compare across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import time
from dataclasses import astuple, dataclass
from multiprocessing.connection import Connection
from typing import Any

from benchmarks.loadgen import Client, Record, Workload, closed_loop, open_loop, process_cpu_seconds

START_MARGIN_S = 0.05  # between the last process being ready and the common start


@dataclass(frozen=True)
class Job:
    """One load point's share for one client process."""

    address: str
    workload: Workload
    connections: int
    duration: float
    warmup: float
    concurrency: int | None = None  # closed loop: this process's clients
    rate: float | None = None  # open loop: this process's arrivals per second
    seed: int = 0  # open loop: this process's arrival stream


@dataclass
class Spread:
    """A load point's outcome across the client processes."""

    records: list[Record]  # every process's, in no particular order
    begin: float  # the earliest process's window start (perf_counter, the machine's clock)
    cpu_seconds: float  # the processes' CPU time over their jobs
    pids: list[int]  # the processes that ran a share


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into at most ``parts`` positive, near-equal shares (largest first)."""
    used = max(1, min(parts, total))
    return [total // used + (1 if i < total % used else 0) for i in range(used)]


class _Stopped(Exception):
    """The parent stopped the processes while this one waited for the start."""


def _child(conn: Connection) -> None:
    """A client process: runs the jobs it receives until it gets None or the parent goes."""
    try:
        while (job := conn.recv()) is not None:
            try:
                conn.send(("done", *asyncio.run(_run_job(job, conn))))
            except _Stopped:
                return
            except Exception as err:  # reported to the parent, which raises it
                conn.send(("error", f"{type(err).__name__}: {err}"))
    except (EOFError, OSError):  # the parent is gone
        return


async def _run_job(job: Job, conn: Connection) -> tuple[list[tuple], float, float, int]:
    """(records as tuples, window start, CPU seconds of the whole job (the parent's figures of
    the machine's load span the warm-up too), this process's id)."""
    cpu = process_cpu_seconds() or 0.0
    client = Client(job.address, job.workload, job.connections)
    try:
        await client.wait_ready()
        if job.warmup > 0:
            clients = job.concurrency or max(1, math.ceil(job.rate or 1))
            await closed_loop(client, clients, job.warmup)
        conn.send(("ready",))
        start_at = await asyncio.to_thread(conn.recv)
        if start_at is None:
            raise _Stopped
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        if job.concurrency is not None:
            records, begin = await closed_loop(client, job.concurrency, job.duration)
        else:
            assert job.rate is not None
            records, begin = await open_loop(client, job.rate, job.duration, job.seed)
    finally:
        await client.close()
    return [astuple(r) for r in records], begin, (process_cpu_seconds() or 0.0) - cpu, os.getpid()


class ClientProcesses:
    """``count`` client processes, started once, that run load points together."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"client processes must be >= 1, got {count}")
        context = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._closed = False
        for i in range(count):
            parent, child = context.Pipe()
            proc = context.Process(target=_child, args=(child,), name=f"loadgen-{i}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def count(self) -> int:
        return len(self._procs)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    @property
    def alive(self) -> int:
        """How many of the processes still run."""
        return sum(proc.is_alive() for proc in self._procs)

    async def run(
        self,
        address: str,
        workload: Workload,
        connections: int,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        duration: float,
        warmup: float = 0.0,
        seed: int = 0,
    ) -> Spread:
        """One load point on the processes (see ``Spread``).

        ``concurrency`` is split into near-equal shares (fewer processes than clients leave the
        rest idle); ``rate`` into equal rates with a seed per process.
        """
        if (concurrency is None) == (rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if concurrency is not None:
            jobs = [
                Job(address, workload, connections, duration, warmup, concurrency=share)
                for share in shares(concurrency, self.count)
            ]
        else:
            assert rate is not None
            jobs = [
                Job(
                    address,
                    workload,
                    connections,
                    duration,
                    warmup,
                    None,
                    rate / self.count,
                    seed * self.count + i,
                )
                for i in range(self.count)
            ]
        if self._closed:
            raise RuntimeError("the load generator processes were stopped")
        conns = self._conns[: len(jobs)]
        try:
            for conn, job in zip(conns, jobs, strict=True):
                conn.send(job)
            await asyncio.gather(*(self._expect(conn, "ready") for conn in conns))
            start_at = time.perf_counter() + START_MARGIN_S
            for conn in conns:
                conn.send(start_at)
            replies = await asyncio.gather(*(self._expect(conn, "done") for conn in conns))
        except BaseException:
            self.close()  # the others may wait for a start that never comes: stop them all
            raise
        return Spread(
            records=[Record(*fields) for reply in replies for fields in reply[0]],
            begin=min(reply[1] for reply in replies),
            cpu_seconds=sum(reply[2] for reply in replies),
            pids=[reply[3] for reply in replies],
        )

    async def _expect(self, conn: Connection, kind: str) -> tuple:
        message = await asyncio.to_thread(conn.recv)
        if message[0] == "error":
            raise RuntimeError(f"a load generator process failed: {message[1]}")
        if message[0] != kind:
            raise RuntimeError(f"a load generator process answered {message[0]!r}, not {kind!r}")
        return message[1:]

    def close(self) -> None:
        """Stop the processes (they finish the job they run first, for up to 10 s)."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for conn, proc in zip(self._conns, self._procs, strict=True):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()

    def __enter__(self) -> ClientProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
