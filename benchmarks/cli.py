"""`attnserve bench engine | serve | report`. Heavy imports happen only when a command runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks.serve_settings import SETUPS  # light: the setups' names for --help

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,8,16, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 5,10,20, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _words(text: str) -> tuple[str, ...]:
    return tuple(v for v in text.replace(",", " ").split() if v)


def add_parsers(subparsers: Any) -> None:
    """Register `bench` with its engine, serve and report subcommands."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks: decoding engines, the gRPC server under load, the results table",
        description="Results land as JSON (validated against a schema) and PNG plots in --out "
        "(default benchmarks/results/); `bench report` renders the README table from the latest.",
    )
    commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    _engine_parser(commands)
    _serve_parser(commands)
    _report_parser(commands)


def _engine_parser(commands: Any) -> None:
    engine = commands.add_parser(
        "engine",
        help="greedy decoding speed of attnserve vs CTranslate2 vs HF generate (one random "
        "Marian-base model)",
    )
    _common(engine)
    engine.add_argument("--batches", type=_ints, help="batch sizes (default 1,8,16,32)")
    engine.add_argument("--repetitions", type=int, help="timed rounds per batch (default 3)")
    engine.add_argument("--warmup", type=int, help="untimed runs per engine and batch (default 1)")
    engine.add_argument("--source-length", type=int, help="source tokens (default 32)")
    engine.add_argument("--new-tokens", type=int, help="generated tokens, EOS suppressed (64)")
    engine.add_argument(
        "--engines",
        type=_words,
        help="engine families to run: attnserve,ctranslate2,hf (default all)",
    )
    engine.add_argument(
        "--precisions", type=_words, help="fp32,int8 (default both); fp16 with --device cuda"
    )
    engine.add_argument(
        "--decode-attentions",
        type=_words,
        help="the in-place decoder's attentions per precision: fused,matmul (default: the "
        "precision's own, and on the CPU also the other one for fp32 and int8)",
    )
    engine.add_argument(
        "--decode-block",
        type=int,
        metavar="K",
        help="also run the in-place runners in decode blocks of K greedy steps "
        "(batching.decode_block; the entries get a decoder_block graph of K steps)",
    )
    engine.add_argument(
        "--fast-int8",
        action="store_true",
        default=None,
        help="int8 = quantised copy of the fp32 export instead of a second export (--tiny does)",
    )
    engine.set_defaults(handler=run_engine)


def _serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="gRPC load generator against attnserve servers it starts (closed and open loop, "
        "batching on / off)",
    )
    _common(serve)
    serve.add_argument(
        "--repository",
        type=Path,
        help="exported repository with the translator and vit entries (default: the shipped "
        "models, exported into the cache on first use)",
    )
    serve.add_argument(
        "--concurrency",
        type=_ints,
        help="closed-loop clients (default 1,2,4,...,64; with --device cuda also 128 and 256)",
    )
    serve.add_argument(
        "--rates",
        type=_floats,
        help="open-loop Poisson rates in requests/s (default: 25/50/75/90%% of the closed-loop "
        "peak of the same setup)",
    )
    serve.add_argument("--duration", type=float, help="seconds per load point (default 5)")
    serve.add_argument("--new-tokens", type=int, help="tokens per translation (default 64)")
    serve.add_argument("--models", type=_words, help="translator,vit (default both)")
    serve.add_argument(
        "--setups",
        type=_words,
        help=f"server setups: {','.join(SETUPS)} (default all; four_frontends and "
        "eight_frontends(_overlap) where the machine has 2 CPUs per frontend, cuda_graphs, "
        "no_cuda_graphs, conv_heuristic and no_batch_buckets with --device cuda only)",
    )
    serve.add_argument(
        "--connections",
        type=int,
        help="TCP connections the load generator spreads each point's calls over (default 4)",
    )
    serve.add_argument(
        "--gpu-goals",
        action="store_true",
        help="only the loads the goals are judged on (setups batching, two_frontends, "
        "instances, stream_interval, and four_frontends / eight_frontends where the machine "
        "has 2 CPUs per frontend; 1, 32, 128 and 256 clients; no open loop, no Triton peer; "
        "3 s points): what a short GPU lease has time for; other flags still apply on top",
    )
    serve.add_argument(
        "--client-processes",
        type=int,
        help="processes the load generator's clients run in, each with --connections "
        "connections (default: 1 below 8 CPUs, else a quarter of the CPUs, at most 8)",
    )
    serve.add_argument(
        "--peer-concurrency",
        type=_ints,
        help="concurrencies of the KServe ViT load on attnserve and the Triton peer, and of the "
        "perf_analyzer runs (default 1,8,32)",
    )
    serve.add_argument(
        "--perf-analyzer",
        action="store_true",
        default=None,
        help="also drive Triton's perf_analyzer (vit with no flags, translator with --streaming "
        "and input data) against attnserve and the Triton peer; installed by `make "
        "perf-analyzer`, else with pip on first use",
    )
    serve.add_argument(
        "--no-triton",
        dest="triton",
        action="store_false",
        default=None,
        help="skip the Triton peer (PyTriton serving the same ViT ONNX model in the same run)",
    )
    serve.add_argument(
        "--triton-python",
        help="a Python with nvidia-pytriton and onnxruntime for the Triton peer (default: a "
        "virtual environment in the cache, created on first use; --tiny only uses an existing one)",
    )
    serve.set_defaults(handler=run_serve)


def _report_parser(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="render the README results table from the latest JSON results"
    )
    report.add_argument(
        "--results",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder with the JSON results (default {DEFAULT_OUT})",
    )
    report.add_argument(
        "--out",
        type=Path,
        help="markdown file to write (default RESULTS/README-table.md)",
    )
    report.add_argument(
        "--readme",
        type=Path,
        help="also splice the tables into this README between its bench-report markers",
    )
    report.add_argument(
        "--include-tiny",
        action="store_true",
        help="also consider --tiny results (otherwise only when no full result exists)",
    )
    report.add_argument(
        "--section",
        help="splice between the README's markers of this section instead of the main ones, "
        "e.g. gpu: <!-- attnserve bench report (gpu): begin ... -->",
    )
    report.set_defaults(handler=run_report)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny models and loads (CI): finishes in seconds, numbers mean nothing",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="where models, exports and conversions are kept between runs (default "
        "$ATTNSERVE_BENCH_CACHE or ~/.cache/attnserve-bench)",
    )
    parser.add_argument("--threads", type=int, help="total threads per engine (default: all CPUs)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _given(args: argparse.Namespace, **names: str) -> dict[str, Any]:
    """Settings overrides from the flags that were given (attribute -> settings field)."""
    return {
        field: getattr(args, attr)
        for attr, field in names.items()
        if getattr(args, attr, None) is not None
    }


def run_engine(args: argparse.Namespace) -> int:
    from benchmarks.engine import EngineSettings, main

    overrides = _given(
        args,
        batches="batches",
        repetitions="repetitions",
        warmup="warmup",
        source_length="source_length",
        new_tokens="new_tokens",
        engines="engines",
        precisions="precisions",
        decode_attentions="decode_attentions",
        decode_block="decode_block",
        threads="threads",
        device="device",
        fast_int8="fast_int8",
    )
    settings = (
        EngineSettings.tiny_settings(**overrides) if args.tiny else EngineSettings(**overrides)
    )
    path = main(settings, args.out, args.cache, plots=not args.no_plots)
    print(path)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from benchmarks.serve import main

    settings = serve_settings(args)
    path = main(settings, args.out, args.cache, args.repository, plots=not args.no_plots)
    print(path)
    return 0


def serve_settings(args: argparse.Namespace) -> Any:
    """The ServeSettings of `bench serve`'s flags (``--gpu-goals`` first, given flags on top)."""
    from benchmarks.serve_settings import ServeSettings, gpu_goal_loads

    overrides = _given(
        args,
        concurrency="concurrency",
        rates="rates",
        duration="duration_s",
        new_tokens="new_tokens",
        models="models",
        setups="setups",
        connections="connections",
        client_processes="client_processes",
        threads="threads",
        device="device",
        peer_concurrency="peer_concurrency",
        perf_analyzer="perf_analyzer",
        triton="triton",
        triton_python="triton_python",
    )
    if getattr(args, "gpu_goals", False):
        overrides = {**gpu_goal_loads(), **overrides}
    return ServeSettings.tiny_settings(**overrides) if args.tiny else ServeSettings(**overrides)


def run_report(args: argparse.Namespace) -> int:
    from benchmarks.report import update_readme, write_report

    out = args.out or args.results / "README-table.md"
    path = write_report(args.results, out, include_tiny=args.include_tiny)
    print(path)
    if args.readme is not None:
        print(
            update_readme(
                args.results, args.readme, include_tiny=args.include_tiny, section=args.section
            )
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser with only `bench` (python -m benchmarks.cli ...)."""
    parser = argparse.ArgumentParser(prog="attnserve")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_parsers(subparsers)
    return parser


if __name__ == "__main__":  # pragma: no cover - the attnserve command is the main entry
    import sys

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    parsed = build_parser().parse_args()
    sys.exit(parsed.handler(parsed))
