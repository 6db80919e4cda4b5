"""What the engine process and each frontend process run (started by ``supervisor``).

- The engine process loads the repository (graphs, in-flight engines, dynamic batchers) and
  serves the frontends' requests on it (``EngineServer``).
- A frontend process loads only configs and tokenizers, and runs the very grpc.aio server of the
  single-process mode (both APIs, health, reflection, TLS, tokens, limits, every input check and
  preprocessing step) with models whose engines and batchers are handles on the engine process.

Both report ``("ready", info)`` or ``("error", message)`` on their pipe, ignore SIGINT (the
supervisor owns shutdown) and stop on SIGTERM: a frontend drains like a single-process server,
the engine stops once the frontends are gone. Each names itself for ``ps`` / ``top`` (``comm``):
``attnserve-eng`` and ``attnserve-fe0``, ``attnserve-fe1``, ... under the supervisor
``attnserve``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path

from contract.model_config import ClassifierConfig, ModelConfig
from serving.gc_policy import settle
from serving.log_settings import LogChanges, LogControl
from serving.metrics import ServingMetrics
from serving.model_control import ModelControl, RemoteModelControl, frontend_changes
from serving.model_poll import PolledModelControl, RepositoryPoller, watch
from serving.multiprocess.engine_server import EngineServer
from serving.multiprocess.remote import EngineClient, RemoteBatcher, RemoteEngine
from serving.multiprocess.shm import ARENA_MIN_BYTES
from serving.multiprocess.titles import ENGINE_TITLE, FRONTEND_TITLE, set_process_title
from serving.repository import ModelFactory, ModelRepository, RepositoryError
from serving.served import ServedClassifier, ServedGenerator, ServedModel
from serving.server import create_server
from serving.server_config import ServerConfig
from serving.trace_control import TraceChanges
from serving.tracing import Tracer

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(processName)s %(levelname)s %(message)s"


def _setup(config: ServerConfig, title: str) -> None:
    logging.basicConfig(level=config.log_level, format=LOG_FORMAT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_process_title(title)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    return stop


# --- the engine process -------------------------------------------------------------------------


def engine_main(config: ServerConfig, address: str, ready: Connection) -> None:
    """Entry point of the engine process."""
    _setup(config, ENGINE_TITLE)
    asyncio.run(_engine(config, address, ready))


async def _engine(config: ServerConfig, address: str, ready: Connection) -> None:
    try:
        repository = ModelRepository.load(config.repository, ServingMetrics(), config.models)
    except RepositoryError as err:
        ready.send(("error", str(err)))
        raise SystemExit(1) from err
    await repository.start()
    settle(config.gc_freeze, config.gc_gen0_threshold)
    logs = LogControl.of_process(config.log_level)
    server = EngineServer(repository, address, config.grace_period_s, logs)
    await server.bind()
    stop = _stop_event()
    ready.send(("ready", repository.names()))
    poller = None
    if config.model_control_mode == "poll":  # this process follows the folder for all
        poller = RepositoryPoller(server.control, config.repository_poll_secs, config.models)
        poller.start()
    await stop.wait()
    if poller is not None:
        await poller.stop()
    await server.close()
    await repository.stop(config.grace_period_s)


# --- a frontend process -------------------------------------------------------------------------


def frontend_main(config: ServerConfig, address: str, engine_pid: int, ready: Connection) -> None:
    """Entry point of a frontend process (named ``attnserve-frontend-INDEX`` by the supervisor)."""
    index = multiprocessing.current_process().name.rsplit("-", 1)[-1]
    _setup(config, FRONTEND_TITLE + index)
    asyncio.run(_frontend(config, address, engine_pid, ready, index))


def remote_models(client: EngineClient) -> ModelFactory:
    """Served models whose engines and batchers run in the engine process behind ``client``."""

    def make(config: ModelConfig, version_dir: Path) -> ServedModel:
        version = int(version_dir.name)
        if isinstance(config, ClassifierConfig):
            batcher = RemoteBatcher(client, config.name, version)
            return ServedClassifier(config, version_dir, None, batcher=batcher)
        engine = RemoteEngine(client, config.name, version, config.batching.decode_rows)
        scorer = RemoteBatcher(client, config.name, version, kind="score")
        return ServedGenerator(config, version_dir, None, engine=engine, scorer=scorer)

    return make


async def _frontend(
    config: ServerConfig, address: str, engine_pid: int, ready: Connection, index: str
) -> None:
    metrics = ServingMetrics(aggregate_from=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    client = EngineClient(
        address, engine_pid, config.frontend_shm_mb << 20, ARENA_MIN_BYTES, metrics
    )
    await client.start()
    try:
        repository = ModelRepository.load(
            config.repository, metrics, config.models, factory=remote_models(client)
        )
        own = dataclasses.replace(config, metrics_port=-1)  # the supervisor serves /metrics
        client.on_model_change = frontend_changes(repository)
        control = frontend_control(config, repository, client)
        # each frontend samples and writes its own traces: <trace_file>.frontend<index>
        tracer = Tracer(config.trace_settings(), suffix=f".frontend{index}")
        logs = LogControl.of_process(config.log_level)
        client.on_settings = {"trace": tracer.update, "log": lambda _, s: logs.update(s)}
        running = await create_server(
            own,
            repository,
            metrics,
            reuse_port=True,
            control=control,
            traces=TraceChanges(tracer, client),
            logs=LogChanges(logs, client),
        )
        settle(config.gc_freeze, config.gc_gen0_threshold)
    except (RepositoryError, OSError, ValueError) as err:
        ready.send(("error", str(err)))
        await client.close()
        raise SystemExit(1) from err
    stop = _stop_event()
    watch = asyncio.create_task(_report_engine_loss(client, running.set_serving))
    ready.send(("ready", running.port))
    await stop.wait()
    watch.cancel()
    await running.stop(config.grace_period_s)
    await client.close()


def frontend_control(
    config: ServerConfig, repository: ModelRepository, client: EngineClient
) -> ModelControl | None:
    """A frontend's model control RPCs: asking the engine process (explicit), refused (poll:
    the engine process follows the folder), or off."""
    if config.model_control_mode == "explicit":
        return RemoteModelControl(client)
    if config.model_control_mode == "poll":
        watch(repository, config.repository_poll_secs)
        return PolledModelControl(config.repository_poll_secs)
    return None


async def _report_engine_loss(client: EngineClient, set_serving) -> None:  # type: ignore[no-untyped-def]
    """Health turns NOT_SERVING the moment the engine process is gone."""
    while client.alive:
        await asyncio.sleep(0.1)
    await set_serving(False)
