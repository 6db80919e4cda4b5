"""The in-flight engine's own ceiling: decode steps per second when the model costs nothing.

    python -m benchmarks.engine_loop [--streams 1 32 128 256] [--duration 3] [--repository R]

On a GPU a decode step of the shipped translator takes about 1.2 ms at batch 128 (2026-11-26,
H200), so what the engine does in Python for every row of every step (choose the token, count
it, hand it to the caller's event loop) decides how close served decoding gets to the model's
offline rate. This measures that work alone: a real ``InFlightEngine`` over the translator's
real in-place cache (rows, widths, re-layouts, cross keys written by the real graphs) whose
decoder step returns precomputed logits (or their greedy tokens) at once. ``--streams``
clients in this process's event loop each decode 64-token greedy requests one after another
(closed loop, exactly 64 tokens: EOS never wins), for ``--duration`` seconds after a warm-up.

Writes ``benchmarks/results/engine-loop-*.json``: per stream count, new tokens/s, decode steps/s,
rows per step, and wall time per step and per row-step with the encoder's time (real, on this
machine's CPU) taken out, i.e. the ceiling the engine and its callers' event loop put on a model
whose step costs nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marian import default_cache
from benchmarks.output import write_probe
from contract.model_config import GeneratorConfig

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
NEW_TOKENS = 64
SOURCE = [5, 17, 42, 8, 99, 23, 61, 7, 30, 12, 3]  # 11 token ids, as the serve benchmark's text


class _Collections:
    """Counts the garbage collector's runs and seconds (``gc.callbacks``) while installed."""

    def __init__(self) -> None:
        self.runs, self.seconds, self.longest, self._started = 0, 0.0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self.runs += 1
            self.seconds += pause
            self.longest = max(self.longest, pause)

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class _Timed:
    """Wraps a callable, summing the seconds spent in it."""

    def __init__(self, function: Any) -> None:
        self.function, self.seconds = function, 0.0

    def __call__(self, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.function(*args)
        finally:
            self.seconds += time.perf_counter() - started


def instant_engine(
    entry: Path,
    rows: int,
    instant_encoder: bool = False,
    device: _Device | None = None,
    join_interval_steps: int = 1,
    max_new_tokens: int = NEW_TOKENS,
    overlap: bool = False,
    block: int = 0,
) -> tuple[Any, _Timed]:
    """The translator's engine with ``rows`` cache rows, its decoder step answering at once with
    logits in which EOS never wins; and its timed encoder (with ``instant_encoder``, the real
    encoder's output for ``SOURCE``, computed once, repeated for every joiner: the cache
    admission still writes it into the joiners' rows).

    With ``device``, an emulated device: each decoder step answers after ``device.step_s``
    seconds in which the engine thread does not hold the GIL (a GPU step's wait), and the cache's
    re-layouts only change its widths (on a device they are device work, and nothing reads this
    cache). With ``overlap``, ``batching.overlap_steps``: greedy steps start before the last
    one's bookkeeping. With ``block``, ``batching.decode_block`` with an emulated block graph of
    that many steps (one device wait of that many steps, its picks the single step's)."""
    from contract.repository import resolve_version
    from serving.metrics import ServingMetrics
    from serving.repository import make_backend
    from serving.served.generator import local_engine

    config = engine_config(entry, rows, join_interval_steps, max_new_tokens, overlap)
    # Any: the emulation below replaces the engine's decoder, runner and block by hand
    engine: Any = local_engine(
        config, make_backend(config, resolve_version(entry)), ServingMetrics()
    )
    spec = config.decoder
    logits = np.random.default_rng(0).standard_normal((rows, 1, spec.vocab_size))
    logits = logits.astype(np.float32)
    logits[:, :, spec.eos_id] = -1e9

    tokens, best = logits.argmax(-1), logits.max(-1)  # what the greedy_pick graph gives

    def step(input_ids: np.ndarray, *_: Any) -> np.ndarray:
        if device is not None:
            device.wait()
        return logits[: len(input_ids), 0]

    def step_greedy(input_ids: np.ndarray, *_: Any, **__: Any) -> tuple[np.ndarray, np.ndarray]:
        if device is not None:
            device.wait()
        return tokens[: len(input_ids), 0], best[: len(input_ids), 0]

    decoder = engine.cache.decoder
    decoder.step, decoder.step_greedy = step, step_greedy
    if device is not None:
        decoder.resize = device.resize_of(decoder)
    decoder.last_logits = lambda: logits[:, 0]
    decoder.greedy = True  # as on a GPU: large greedy steps take the pick's ids, not the logits
    if block:
        decoder.block = _Block(block, tokens, best, device)
        engine._block = engine.cache  # the entry has no block graph: the emulated one runs
    encode = _Timed(_repeated(engine.runner.encode) if instant_encoder else engine.runner.encode)
    engine.runner.encode = encode
    return engine, encode


class _Block:
    """An emulated ``DecodeBlock``: one wait of ``steps`` device steps (one run), the single
    step's picks for each."""

    def __init__(
        self, steps: int, tokens: np.ndarray, best: np.ndarray, device: _Device | None
    ) -> None:
        self.steps, self.device = steps, device
        self.tokens, self.best = np.repeat(tokens, steps, axis=1), np.repeat(best, steps, axis=1)

    def run(self, input_ids: np.ndarray, *_: Any) -> tuple[np.ndarray, np.ndarray]:
        if self.device is not None:
            self.device.wait(self.steps)
        return self.tokens[: len(input_ids)], self.best[: len(input_ids)]


class _Device:
    """An emulated device step: ``step_s`` seconds of sleep (the GIL released, as while ONNX
    Runtime waits for a GPU), the seconds actually slept summed."""

    def __init__(self, step_ms: float) -> None:
        self.step_s, self.seconds, self.steps = step_ms / 1e3, 0.0, 0
        self.idle = 0.0  # seconds between one step's end and the next one's start, summed
        self._ended: float | None = None

    def wait(self, steps: int = 1) -> None:
        """``steps`` steps in one wait (a decode block: one run of the device)."""
        started = time.perf_counter()
        if self._ended is not None:
            self.idle += started - self._ended
        time.sleep(self.step_s * steps)
        self._ended = time.perf_counter()
        self.seconds += self._ended - started
        self.steps += steps

    def totals(self) -> tuple[float, int, float]:
        """Seconds in steps, steps, seconds between steps (for deltas over a point)."""
        return self.seconds, self.steps, self.idle

    @staticmethod
    def resize_of(decoder: Any) -> Any:
        def resize(which: str, width: int, rows: int) -> None:
            for buffer in (decoder.past if which == "past" else decoder.cross).values():
                buffer.width = width

        return resize


def device_of(step_ms: float | None) -> _Device | None:
    return _Device(step_ms) if step_ms else None


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device-step-ms",
        type=float,
        help="emulate a device: each decoder step takes this long without holding the GIL "
        "(e.g. 0.95, the H200's batch-128 step) and cache re-layouts are device work; the "
        "points then give the device's busy share (served / offline). Default: instant steps",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="batching.overlap_steps: each greedy step starts before the last one's bookkeeping",
    )
    parser.add_argument(
        "--decode-block",
        type=int,
        default=0,
        metavar="K",
        help="batching.decode_block with an emulated block graph of K steps (default 0: one "
        "step per run)",
    )


def device_figures(
    device: _Device | None, before: tuple[float, int, float], wall: float
) -> dict[str, Any]:
    """What the emulated device did over a point (``before``: its ``totals()`` at the start):
    the share of the wall time a device whose step takes ``step_s`` would have been busy (the
    served rate against the offline one at the same rows per step), the engine thread's mean
    wait per step (the sleep, its overshoot, and taking the GIL back after it, as after a GPU
    step) and the mean time between a step's end and the next one's start (the host's part of
    a step's cycle: what overlapping could hide)."""
    if device is None:
        return {}
    seconds, steps, idle = (now - then for now, then in zip(device.totals(), before, strict=True))
    if not steps:
        return {}
    return {
        "device_step_ms": round(device.step_s * 1e3, 3),
        "device_busy_share": round(steps * device.step_s / wall, 4),
        "device_wait_ms": round(seconds / steps * 1e3, 4),
        "host_gap_ms": round(idle / steps * 1e3, 4),
    }


def engine_config(
    entry: Path,
    rows: int,
    join_interval_steps: int = 1,
    max_new_tokens: int = NEW_TOKENS,
    overlap: bool = False,
) -> GeneratorConfig:
    """The entry's config with ``rows`` cache rows (and as many joiners and 4x queued),
    ``join_interval_steps``, ``max_new_tokens`` as its token limit and ``overlap_steps``; one
    step per run (``decode_block`` off)."""
    from contract.repository import read_model_config

    config = read_model_config(entry)
    if not isinstance(config, GeneratorConfig):
        raise SystemExit(f"{entry} is not a generator entry")
    batching = replace(
        config.batching,
        max_active_sequences=rows,
        max_batch_size=rows,
        max_queue_size=4 * rows,
        join_interval_steps=join_interval_steps,
        overlap_steps=overlap,
        decode_block=False,  # the real block graph would not answer at once (--decode-block
        # sets an emulated one)
    )
    return replace(
        config, batching=batching, limits=replace(config.limits, max_new_tokens=max_new_tokens)
    )


def _repeated(encode: Any) -> Any:
    """``encode`` answering every batch of ``SOURCE`` rows with its output for one, repeated."""
    source = np.array([SOURCE], dtype=np.int64)
    one = encode({"input_ids": source, "attention_mask": np.ones_like(source)})

    def repeated(feeds: dict[str, np.ndarray], device: Any = None) -> Any:
        batch = len(feeds["input_ids"])  # (the cache is on the host here: numpy arrays)
        return type(one)([np.repeat(c, batch, axis=0) for c in one.cross], feeds["attention_mask"])

    return repeated


async def _client(engine: Any, until: float, counts: list[int]) -> None:
    from serving.engine.requests import GenerationRequest, TokenEvent
    from serving.generation.options import DecodingOptions

    options = DecodingOptions(max_new_tokens=NEW_TOKENS)
    while time.perf_counter() < until:
        request = GenerationRequest(options=options, source_ids=np.array(SOURCE, dtype=np.int64))
        async for chunk in engine.generate_chunks(request):
            counts[0] += sum(isinstance(event, TokenEvent) for event in chunk)
        counts[1] += 1


async def _point(
    engine: Any,
    encode: _Timed,
    streams: int,
    duration: float,
    warmup: float,
    device: _Device | None = None,
) -> dict[str, Any]:
    counts = [0, 0]  # tokens, requests
    until = time.perf_counter() + warmup
    await asyncio.gather(*(_client(engine, until, counts) for _ in range(streams)))
    counts[:], encode.seconds = [0, 0], 0.0
    steps = engine.steps
    before = device.totals() if device else (0.0, 0, 0.0)
    started = time.perf_counter()
    until = started + duration
    with _Collections() as collections:
        await asyncio.gather(*(_client(engine, until, counts) for _ in range(streams)))
    wall = time.perf_counter() - started
    steps = engine.steps - steps
    busy = wall - encode.seconds  # the encoder is real (this CPU); a GPU's is far cheaper
    rows = counts[0] / steps if steps else 0.0
    return {
        "streams": streams,
        "tokens": counts[0],
        "requests": counts[1],
        "seconds": round(wall, 3),
        "tokens_per_s": round(counts[0] / wall, 1),
        "steps_per_s": round(steps / wall, 1),
        "rows_per_step": round(rows, 2),
        "encoder_share": round(encode.seconds / wall, 4),
        "ms_per_step": round(busy / steps * 1e3, 4) if steps else None,
        "us_per_row_step": round(busy / counts[0] * 1e6, 2) if counts[0] else None,
        "tokens_per_s_without_encoder": round(counts[0] / busy, 1) if busy > 0 else None,
        "gc_collections": collections.runs,  # both threads
        "gc_seconds": round(collections.seconds, 4),
        "gc_longest_ms": round(collections.longest * 1e3, 2),  # a pause no stream moves in
        **device_figures(device, before, wall),
    }


def measure(
    entry: Path,
    streams: list[int],
    duration: float,
    warmup: float,
    gc_freeze: bool = True,
    gc_gen0_threshold: int = 0,
    instant_encoder: bool = False,
    device_step_ms: float | None = None,
    overlap: bool = False,
    block: int = 0,
) -> list[dict]:
    """One engine with rows for the most streams; each stream count driven in turn. The garbage
    collector is set as a serving process sets it (``serving.gc_policy``)."""
    from serving.gc_policy import settle

    device = device_of(device_step_ms)
    engine, encode = instant_engine(
        entry, max(streams), instant_encoder, device, overlap=overlap, block=block
    )
    settle(gc_freeze, gc_gen0_threshold)
    engine.start()
    try:
        return [asyncio.run(_point(engine, encode, n, duration, warmup, device)) for n in streams]
    finally:
        engine.stop()


def add_repository_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repository",
        type=Path,
        help="exported repository with a translator entry (default: the shipped translator, "
        "exported into the benchmark cache on first use)",
    )


def default_repository() -> Path:
    """The shipped models, exported into the benchmark cache on first use."""
    from benchmarks.serve_setups import shipped_repository

    return shipped_repository(default_cache())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_loop")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each point")
    add_repository_argument(parser)
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze the start-up heap as the server does (gc_freeze; --no-gc-freeze: not)",
    )
    parser.add_argument(
        "--gc-gen0-threshold",
        type=int,
        default=0,
        help="the server's gc_gen0_threshold (0: Python's 700)",
    )
    parser.add_argument(
        "--instant-encoder",
        action="store_true",
        help="the encoder's output for the source computed once and repeated (as a GPU's is "
        "nearly free); by default every joiner batch runs the real encoder on this CPU",
    )
    add_device_argument(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tiny", action="store_true", help="short points (CI smoke run)")
    args = parser.parse_args(argv)
    args.repository = args.repository or default_repository()
    duration, warmup = (0.3, 0.1) if args.tiny else (args.duration, args.warmup)
    points = measure(
        args.repository / "translator",
        args.streams,
        duration,
        warmup,
        args.gc_freeze,
        args.gc_gen0_threshold,
        args.instant_encoder,
        args.device_step_ms,
        args.overlap,
        args.decode_block,
    )
    write_probe(
        "engine-loop",
        points,
        args.out,
        args.tiny,
        duration,
        new_tokens=NEW_TOKENS,
        gc_freeze=args.gc_freeze,
        gc_gen0_threshold=args.gc_gen0_threshold,
        instant_encoder=args.instant_encoder,
        device_step_ms=args.device_step_ms,
        overlap=args.overlap,
        decode_block=args.decode_block,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
