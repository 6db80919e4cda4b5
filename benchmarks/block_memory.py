"""What a decode block costs in memory: a translation entry served with and without it.

    python -m benchmarks.block_memory [--entry DIR ...] [--batch 16] [--new-tokens 32]
                                      [--out DIR] [--tiny]

The decode block (``batching.decode_block``) is a second ONNX Runtime session with its own copy of
the decoder's weights. Per entry (default: the shipped translator, exported into the benchmark
cache on first use) and per setting (``decode_block`` false, then true), a fresh process loads
the entry as the server does (``make_backend``, ``serve``; the CPU) and decodes ``--new-tokens``
greedy tokens at ``--batch`` rows (in blocks where on), reading its resident set size (RSS,
``/proc/self/status``) before loading, after loading and after decoding. Writes
``benchmarks/results/block-memory-*.json``: per point the entry, the setting, whether the block
session loaded, the graph files' sizes and the RSS added by the load and by load and decode, in
MB.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import DEFAULT_RESULTS, write_probe

MB = 1 << 20


def rss_bytes() -> int:
    """This process's resident set size (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure_entry(entry: Path, decode_block: bool, batch: int, new_tokens: int) -> dict[str, Any]:
    """RSS added by serving ``entry`` with ``decode_block`` (run in a fresh process)."""
    start = rss_bytes()
    from benchmarks.attnserve_runner import fixed_greedy
    from benchmarks.serve_offline import served_config
    from contract.graphs import DECODER_BLOCK_FILE, DECODER_INPLACE_FILE
    from contract.repository import resolve_version
    from serving.repository import make_backend
    from serving.served import ServedGenerator, serve

    imported = rss_bytes()
    config = served_config(entry, 0, "cpu")
    config = replace(config, batching=replace(config.batching, decode_block=decode_block))
    version = resolve_version(entry)
    model = serve(config, version, make_backend(config, version))
    assert isinstance(model, ServedGenerator)  # a translation entry
    loaded = rss_bytes()
    engine: Any = model.engine  # its cache and runner, reached into directly
    cache, spec = engine.cache, model.config.decoder
    steps = getattr(cache, "block_steps", 0)
    ids = np.full((batch, 12), 5, dtype=np.int64)
    ids[:, -1] = spec.eos_id
    encoded = engine.runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    fixed_greedy(cache, encoded, spec, new_tokens, [spec.eos_id], block=bool(steps))
    decoded = rss_bytes()
    files = {name: version / name for name in (DECODER_INPLACE_FILE, DECODER_BLOCK_FILE)}
    return {
        "entry": entry.name,
        "decode_block": decode_block,
        "block_steps": steps,
        "graph_mb": {n: round(p.stat().st_size / MB, 1) for n, p in files.items() if p.is_file()},
        "imports_mb": round((imported - start) / MB, 1),
        "load_mb": round((loaded - imported) / MB, 1),
        "load_and_decode_mb": round((decoded - imported) / MB, 1),
        "batch": batch,
        "new_tokens": new_tokens,
    }


def _child(entry: Path, decode_block: bool, batch: int, new_tokens: int, out: Any) -> None:
    out.put(measure_entry(entry, decode_block, batch, new_tokens))


def in_fresh_process(entry: Path, decode_block: bool, batch: int, new_tokens: int) -> dict:
    """``measure_entry`` in a spawned process (nothing loaded before it)."""
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_child, args=(entry, decode_block, batch, new_tokens, out))
    process.start()
    try:
        return out.get(timeout=600)
    finally:
        process.join(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.block_memory")
    parser.add_argument(
        "--entry",
        type=Path,
        action="append",
        help="a translation entry (repeatable; default: the shipped translator)",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "block-memory")
    parser.add_argument("--tiny", action="store_true", help="the test suite's small models")
    args = parser.parse_args(argv)
    if not args.entry:
        from benchmarks.marian import default_cache
        from benchmarks.serve_setups import shipped_repository

        args.entry = [shipped_repository(default_cache()) / "translator"]
    points = [
        in_fresh_process(entry, setting, args.batch, args.new_tokens)
        for entry in args.entry
        for setting in (False, True)
    ]
    write_probe("block-memory", points, args.out, args.tiny, 0.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
