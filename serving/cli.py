"""`attnserve serve`, `translate`, `caption`, `classify`, `stats`, `models`, `trace`,
`trace-summary`. No torch is imported here."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from serving.cli_score import add_score_arguments, run_score
from serving.errors import InvalidArgument
from serving.security import AUTH_TOKENS_ENV, CLIENT_TOKEN_ENV
from serving.server_config import MODEL_CONTROL_MODES, ServerConfig

SHIPPED_PLAN = Path(__file__).resolve().parent.parent / "export" / "plans" / "shipped.yaml"
DEFAULTS = ServerConfig()
DEFAULT_SERVER = f"127.0.0.1:{DEFAULTS.port}"


def add_parsers(subparsers: Any) -> None:
    """Register serve and the client commands."""
    _add_serve_parser(subparsers)
    for name, helptext in (
        ("translate", "translate English text with a running server"),
        ("caption", "caption an image with a running server"),
        ("classify", "classify an image with a running server"),
        ("score", "score given translations or captions with a running server"),
        ("stats", "a running server's statistics per model (KServe ModelStatistics)"),
        ("models", "a running server's models: list, load, reload or unload them"),
        ("trace", "a running server's request trace settings: read or change them"),
    ):
        _add_client_parser(subparsers, name, helptext)
    summary = subparsers.add_parser(
        "trace-summary",
        help="where traced requests spent their time, per model (trace files in Triton's format)",
    )
    summary.add_argument("files", nargs="+", type=Path, help="trace files (serve --trace-file)")
    summary.add_argument("--json", action="store_true", help="one JSON object per model")
    summary.set_defaults(handler=run_trace_summary)


def _add_serve_parser(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve a model repository over gRPC (attnserve API + KServe v2) with /metrics",
        description="With no arguments: serves the shipped models from ./model_repository, "
        "exporting them there first if it does not exist (needs the export extra once).",
    )
    serve.add_argument("--config", type=Path, help="server YAML (fields as the flags below)")
    serve.add_argument("--repository", help=f"model repository (default {DEFAULTS.repository})")
    serve.add_argument("--host", help=f"gRPC bind address (default {DEFAULTS.host})")
    serve.add_argument("--port", type=int, help=f"gRPC port (default {DEFAULTS.port}; 0 = free)")
    serve.add_argument(
        "--http-port",
        type=int,
        help="KServe v2 HTTP/REST port on --host, beside gRPC (Triton's HTTP endpoint; default "
        f"{DEFAULTS.http_port}: off; 0 = free)",
    )
    serve.add_argument(
        "--metrics-host", help=f"metrics bind address (default {DEFAULTS.metrics_host})"
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        help=f"Prometheus port (default {DEFAULTS.metrics_port}; -1 off)",
    )
    serve.add_argument("--models", nargs="+", help="serve only these entries")
    serve.add_argument(
        "--grace-period",
        type=float,
        dest="grace_period_s",
        help=f"seconds in-flight requests get on SIGTERM (default {DEFAULTS.grace_period_s})",
    )
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        help="largest gRPC message either way and HTTP/REST request body (default "
        f"{DEFAULTS.max_message_bytes})",
    )
    serve.add_argument("--log-level", help=f"default {DEFAULTS.log_level}")
    serve.add_argument(
        "--frontend-workers",
        type=int,
        help="gRPC frontend processes on the port in front of one engine process; 1 = one "
        "process doing both; 0 (the default) = 1 below 8 CPUs, else half the CPUs, at most 8",
    )
    serve.add_argument(
        "--frontend-shm-mb",
        type=int,
        help="shared memory (MiB) per frontend process for the images it hands the engine "
        f"process; 0: through the engine's socket (default {DEFAULTS.frontend_shm_mb})",
    )
    serve.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="once the models are loaded, freeze the start-up heap so that no garbage "
        "collection rescans it (default: on)",
    )
    serve.add_argument(
        "--gc-gen0-threshold",
        type=int,
        help="Python's young-generation GC threshold (default 0: Python's own, 700)",
    )
    serve.add_argument(
        "--system-shared-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Triton's system shared memory extension over KServe: clients on this host pass "
        "tensors through registered POSIX shared memory regions; only for clients trusted like "
        "the server (default: off)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=MODEL_CONTROL_MODES,
        help="explicit: load, reload and unload models while the server runs (KServe "
        "RepositoryModelLoad / RepositoryModelUnload, tritonclient's load_model / unload_model); "
        "poll: load new entries of the repository folder, reload changed ones and unload "
        "removed ones as they appear; default none",
    )
    serve.add_argument(
        "--cache-config",
        dest="response_cache_bytes",
        type=_cache_config,
        metavar="local,size=BYTES",
        help="Triton's response cache: keep this many bytes of KServe ModelInfer answers (per "
        "frontend process) for the models whose config.yaml sets response_cache (default: none)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        help="with --model-control-mode poll: seconds between looks at the repository folder "
        f"(default {DEFAULTS.repository_poll_secs:g})",
    )
    trace = serve.add_argument_group(
        "request traces in Triton's format (README: KServe v2 / request traces); the KServe "
        "TraceSetting RPC changes them while the server runs"
    )
    trace.add_argument(
        "--trace-level",
        choices=("OFF", "TIMESTAMPS"),
        type=str.upper,
        help="TIMESTAMPS: trace sampled requests (default OFF)",
    )
    trace.add_argument(
        "--trace-rate", type=int, help=f"trace one request in N (default {DEFAULTS.trace_rate})"
    )
    trace.add_argument("--trace-count", type=int, help="traces to take at most (default -1: all)")
    trace.add_argument("--trace-file", help="the JSON file the traces go to")
    trace.add_argument(
        "--trace-log-frequency",
        type=int,
        help="write <trace-file>.<n> every N traces (default 0: all in <trace-file>)",
    )
    security = serve.add_argument_group("security (README: Serving / Security)")
    security.add_argument("--tls-cert", help="PEM certificate: the gRPC port speaks TLS")
    security.add_argument("--tls-key", help="PEM private key of --tls-cert")
    security.add_argument(
        "--tls-client-ca", help="PEM CA; clients must present a certificate it signed (mTLS)"
    )
    security.add_argument(
        "--auth-token-file",
        help=f"file of accepted bearer tokens, one a line (also: env {AUTH_TOKENS_ENV})",
    )
    serve.set_defaults(handler=run_serve)


def _cache_config(text: str) -> int:
    from serving.response_cache import parse_cache_config

    try:
        return parse_cache_config(text)
    except InvalidArgument as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _priority(text: str) -> int:
    """A --priority value: an integer >= 0 (argparse turns ValueError into a usage error)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _add_client_parser(subparsers: Any, name: str, helptext: str) -> None:
    command = subparsers.add_parser(name, help=helptext)
    command.add_argument("--server", default=DEFAULT_SERVER, help=f"default {DEFAULT_SERVER}")
    default_model = {"stats": "every model", "trace": "the server's settings"}.get(
        name, "the task's"
    )
    if name != "models":  # which names the model as an argument
        command.add_argument("--model", default="", help=f"model name (default: {default_model})")
    command.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    command.add_argument("--tls-ca", type=Path, help="PEM root certificate to trust (TLS)")
    command.add_argument(
        "--tls", action="store_true", help="TLS trusting the system's root certificates"
    )
    command.add_argument("--tls-client-cert", type=Path, help="PEM certificate for mTLS")
    command.add_argument("--tls-client-key", type=Path, help="PEM key of --tls-client-cert")
    command.add_argument(
        "--token",
        default=os.environ.get(CLIENT_TOKEN_ENV),
        help=f"bearer token (better: env {CLIENT_TOKEN_ENV}; flags show in `ps`)",
    )
    if name == "models":
        command.add_argument(
            "action",
            nargs="?",
            choices=("list", "load", "unload"),
            default="list",
            help="list (default): the repository's models and their states; load (or reload), "
            "unload: NAME (the server runs with --model-control-mode explicit)",
        )
        command.add_argument("name", nargs="?", default="", help="the model to load or unload")
    if name == "trace":
        command.add_argument(
            "settings",
            nargs="*",
            metavar="NAME=VALUE",
            help="settings to change: trace_level=TIMESTAMPS|OFF, trace_rate=N, trace_count=N, "
            "log_frequency=N; NAME= clears a model's own (--model); none: print them",
        )
    if name in ("stats", "models", "trace"):
        command.add_argument("--json", action="store_true", help="one JSON object per model")
        command.set_defaults(handler=run_client)
        return
    command.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="queue priority on a model with priority levels: 1 is the highest (default 0: "
        "the model's default level)",
    )
    command.add_argument(
        "--model-version",
        default="",
        help="a version the server serves of the model (default: the newest; see version_policy)",
    )
    if name == "score":
        add_score_arguments(command)
        command.set_defaults(handler=run_client)
        return
    if name == "translate":
        command.add_argument("text", nargs="+", help="one or more texts")
        command.add_argument("--to", required=True, help="target language: de, fr or es")
    else:
        command.add_argument("image", type=Path, help="PNG or JPEG file")
    if name == "classify":
        command.add_argument("--top-k", type=int, default=5)
    else:
        command.add_argument("--stream", action="store_true", help="print tokens as they come")
        command.add_argument(
            "--prefix",
            default="",
            help="the text each output starts with; decoding goes on from there (a target "
            "prefix; end it at a word boundary)",
        )
        command.add_argument("--max-new-tokens", type=int)
        command.add_argument("--beam-size", type=int)
        command.add_argument("--temperature", type=float)
        command.add_argument("--top-k", type=int)
        command.add_argument("--top-p", type=float)
        command.add_argument("--seed", type=int)
        command.add_argument(
            "--num-alternatives",
            type=int,
            help="also print this many beam runner-ups (with --beam-size) or further samples "
            "(with --temperature), each on a line of its own indented by a tab",
        )
        command.add_argument(
            "--repetition-penalty",
            type=float,
            help="the score of a token already in the output is divided by this (multiplied "
            "where negative); 1 = off, above 1 discourages repeats",
        )
        command.add_argument(
            "--no-repeat-ngram-size",
            type=int,
            help="no n-gram of this size occurs twice in the output (0 = off)",
        )
        command.add_argument(
            "--bad-word",
            dest="bad_words",
            action="append",
            metavar="TEXT",
            help="a text the output must not contain (repeat for more)",
        )
        command.add_argument(
            "--stop",
            action="append",
            metavar="TEXT",
            help="a stop string: the output ends just before it (repeat for more; not with "
            "--beam-size)",
        )
        command.add_argument(
            "--log-probs",
            dest="return_log_probs",
            action="store_const",
            const=True,
            help="also print the output's score and each token's log-probability "
            "(not with --stream; with beams the score is the beam score)",
        )
        command.add_argument(
            "--top-log-probs",
            type=int,
            metavar="K",
            help="with --log-probs: also print each token's K most likely tokens (1..20), a "
            "line per token: top INDEX: ID=LOGPROB ...",
        )
    command.set_defaults(handler=run_client)


# --- serve --------------------------------------------------------------------------------------
def run_serve(args: argparse.Namespace) -> int:
    """Start the server and block until SIGTERM / SIGINT, then drain."""
    from serving.server_config import load_server_config, resolved

    overrides = {f.name: getattr(args, f.name, None) for f in fields(ServerConfig)}
    if models := overrides.get("models"):
        overrides["models"] = tuple(models)
    config = resolved(load_server_config(args.config, overrides))
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(message)s")
    if args.config is None and args.repository is None:
        ensure_shipped_repository(Path(config.repository))
    if config.frontend_workers > 1:
        from serving.multiprocess.supervisor import serve_multiprocess

        return serve_multiprocess(config)
    return asyncio.run(_serve(config))


def ensure_shipped_repository(repository: Path) -> None:
    """Export the shipped models into ``repository`` when it holds none (first run).

    Runs the export in a child process: exporting needs torch, serving must not import it.

    Raises:
        RuntimeError: when the export fails (e.g. the export extra is not installed).
    """
    if repository.is_dir() and any(repository.glob("*/config.yaml")):
        return
    print(f"first run: exporting the shipped models into {repository}/ ...", file=sys.stderr)
    command = [
        sys.executable,
        "-m",
        "attnserve_cli",
        "export-all",
        str(SHIPPED_PLAN),
        "--repository",
        str(repository),
    ]
    if subprocess.run(command, check=False).returncode != 0:
        raise RuntimeError(
            "exporting the shipped models failed (see above); install the export extra "
            "(pip install -e '.[export]') or pass --repository with an exported repository"
        )


async def _serve(config: ServerConfig) -> int:
    from serving.gc_policy import settle
    from serving.log_settings import LogChanges, LogControl
    from serving.server import create_server

    logs = LogChanges(LogControl.of_process(config.log_level))
    running = await create_server(config, logs=logs)
    settle(config.gc_freeze, config.gc_gen0_threshold)
    metrics = (
        f", metrics on {config.metrics_host}:{running.metrics_port}" if running.metrics_port else ""
    )
    security = ", ".join(
        word for word, on in (("TLS", running.tls), ("bearer tokens", running.authenticated)) if on
    )
    http = f", HTTP/REST on port {running.http_port}" if running.http_port is not None else ""
    print(
        f"attnserve serving {', '.join(running.repository.names())} on "
        f"{config.host}:{running.port}{f' ({security})' if security else ''}{http}{metrics}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"draining (grace period {config.grace_period_s:g} s)", flush=True)
    await running.stop(config.grace_period_s)
    return 0


# --- clients ------------------------------------------------------------------------------------
def run_client(args: argparse.Namespace) -> int:
    """Call a running server; prints the answer (or streams it)."""
    from serving.client import AttnServeClient, ClientError
    from serving.stats_table import render, statistics_row

    options: dict[str, Any] = {
        key: getattr(args, key, None)
        for key in (
            "max_new_tokens",
            "beam_size",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "num_alternatives",
            "repetition_penalty",
            "no_repeat_ngram_size",
            "return_log_probs",
            "top_log_probs",
            "bad_words",
            "stop",
        )
    }
    routing: dict[str, Any] = {
        "model": getattr(args, "model", ""),
        "priority": getattr(args, "priority", 0),
        "model_version": getattr(args, "model_version", ""),
    }
    client = AttnServeClient(
        args.server,
        timeout=args.timeout,
        tls=args.tls,
        tls_ca=args.tls_ca,
        tls_client_cert=args.tls_client_cert,
        tls_client_key=args.tls_client_key,
        token=args.token,
    )
    with client:
        try:
            if args.command == "models":
                return _models(client, args)
            if args.command == "trace":
                return _trace(client, args)
            if args.command == "stats":
                now = time.time()
                rows = [statistics_row(s, now) for s in client.statistics(args.model)]
                print("\n".join(render(rows, args.json)))
                return 0
            if args.command == "score":
                image = _read(args.image) if args.image is not None else None
                return run_score(client, args, routing, image)
            if args.command == "classify":
                image = _read(args.image)
                labels = client.classify(image, top_k=args.top_k, **routing)
                for label in labels:
                    print(f"{label.label}\t{label.score:.4f}")
                return 0
            if getattr(args, "stream", False) and options.get("return_log_probs"):
                print(
                    f"attnserve {args.command}: --log-probs prints whole outputs; leave out "
                    "--stream (a stream's messages carry them for API clients)",
                    file=sys.stderr,
                )
                return 2
            routing["prefix"] = args.prefix
            if args.command == "translate":
                if args.stream:
                    for text in args.text:
                        _print_stream(client.translate_stream(text, args.to, **routing, **options))
                    return 0
                for result in client.translate(args.text, args.to, **routing, **options):
                    _print_result(result, bool(options["return_log_probs"]))
                return 0
            image = _read(args.image)
            if args.stream:
                _print_stream(client.caption_stream(image, **routing, **options))
            else:
                caption = client.caption(image, **routing, **options)
                _print_result(caption, bool(options["return_log_probs"]))
            return 0
        except ClientError as err:
            print(f"attnserve {args.command}: {err}", file=sys.stderr)
            if err.code.name == "UNAVAILABLE" and "failed to connect" in err.details:
                print(
                    f"attnserve {args.command}: no server answered at {args.server}: start one "
                    "with `make run` or `attnserve serve`, or name another with --server "
                    "HOST:PORT",
                    file=sys.stderr,
                )
            return 2 if err.code.name in ("INVALID_ARGUMENT", "NOT_FOUND") else 1


def _print_result(result: Any, log_probs: bool) -> None:
    """A generated text; with ``log_probs`` also its score and its tokens' log-probabilities
    (a tab-separated line: score, then one value per token) and, where asked for, each token's
    most likely tokens (a line per token); then its alternatives, each on a line that starts
    with a tab."""
    print(result.text)
    if log_probs:
        values = [f"{result.score:.4f}", *(f"{p:.4f}" for p in result.token_log_probs)]
        print("\t".join(values))
    for index, top in enumerate(result.top_log_probs):
        print(f"top {index}: " + " ".join(f"{token}={value:.4f}" for token, value in top))
    for text in result.alternatives:
        print(f"\t{text}")


def _models(client: Any, args: argparse.Namespace) -> int:
    """`attnserve models`: list the repository index, or load / unload a model."""
    from serving.stats_table import render

    if args.action == "list":
        rows = [
            {"model": m.name, "version": m.version, "state": m.state, "reason": m.reason}
            for m in client.repository_index()
        ]
        print("\n".join(render(rows, args.json, ("model", "version", "state", "reason"))))
        return 0
    if not args.name:
        print(
            f"attnserve models {args.action}: name the model (attnserve models {args.action} NAME)",
            file=sys.stderr,
        )
        return 2
    if args.action == "load":
        client.load_model(args.name)
        print(f"loaded {args.name}")
    else:
        client.unload_model(args.name)
        print(f"unloaded {args.name}")
    return 0


def _trace(client: Any, args: argparse.Namespace) -> int:
    """`attnserve trace`: print the trace settings, after changing the ones given."""
    changes: dict[str, list[str]] = {}
    for assignment in args.settings:
        name, equals, value = assignment.partition("=")
        if not equals or not name:
            print(f"attnserve trace: {assignment!r} is not NAME=VALUE", file=sys.stderr)
            return 2
        changes[name] = [value] if value else []
    settings = client.trace_settings(args.model, changes)
    if args.json:
        print(
            json.dumps(
                {
                    name: values[0] if len(values) == 1 else values
                    for name, values in settings.items()
                }
            )
        )
    else:
        for name, values in settings.items():
            print(f"{name}\t{','.join(values)}")
    return 0


def run_trace_summary(args: argparse.Namespace) -> int:
    """`attnserve trace-summary`: per model, the traced requests' times."""
    from serving.stats_table import render
    from serving.trace_summary import COLUMNS, TraceFileError, read_traces, summary_rows

    try:
        rows = summary_rows(read_traces(args.files))
    except (TraceFileError, OSError) as err:
        print(f"attnserve trace-summary: {err}", file=sys.stderr)
        return 2
    print("\n".join(render(rows, args.json, COLUMNS)))
    return 0


def _print_stream(deltas: Any) -> None:
    for delta in deltas:
        print(delta, end="", flush=True)
    print()


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"image {path} does not exist")
    return path.read_bytes()
