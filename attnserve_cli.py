"""The `attnserve` command. Each package registers its own subcommands; heavy imports are lazy,
so serving commands never import torch."""

from __future__ import annotations

import argparse
import importlib
import sys

# Packages that contribute subcommands (module with an `add_parsers(subparsers)` function).
COMMAND_MODULES = ("models.cli", "export.cli", "serving.cli", "benchmarks.cli")
# Errors that mean "bad input": print the message, exit 2, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, PermissionError)
# Our own packages: their RuntimeErrors (export / backend failures) carry a message for the user.
OWN_PACKAGES = ("models", "export", "serving", "benchmarks")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="attnserve",
        description="Train, export and serve Transformer models (ONNX Runtime / TensorRT, gRPC).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parsers(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except USER_ERRORS as err:
        print(f"attnserve {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if type(err).__module__.split(".")[0] not in OWN_PACKAGES:
            raise
        print(f"attnserve {args.command}: failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
