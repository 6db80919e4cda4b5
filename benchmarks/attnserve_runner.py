"""attnserve in the engine benchmark: our ONNX export of the Marian model, decoded greedily.

``export_attnserve`` exports the random Marian model (``benchmarks.marian``) into a repository
entry once per precision (cached); ``AttnServeRunner`` loads that entry into ONNX Runtime as the
server does and decodes with ``fixed_greedy``: the server's encoder call and KV cache (the
in-place cache, or the growing one of ``decoder.onnx`` for comparison), EOS suppressed, so every
row decodes exactly ``new_tokens`` tokens like its peers (``benchmarks.peers``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marian import MarianShape
from benchmarks.output import log
from benchmarks.peers import Runner, Unavailable


def fixed_greedy(
    cache: Any,
    encoded: Any,
    spec: Any,
    new_tokens: int,
    suppress: Sequence[int],
    block: bool = False,
) -> np.ndarray:
    """Greedy decoding of exactly ``new_tokens`` tokens per row, ``suppress`` ids never chosen.

    The benchmark counterpart of ``serving.engine.greedy.greedy`` (which stops rows at EOS): the
    same KV-cache steps (``DecodeCache.step_greedy``: the argmax chosen on the device where the
    graph can), every row decoding to the fixed length. With ``block``, the cache's decode block
    runs its K steps at a time where K tokens remain (``InPlaceKVCache.step_block``, as the
    engine does with ``batching.decode_block``), single steps the rest.

    Returns:
        (batch, new_tokens) int64 token ids.
    """
    batch = encoded.batch
    rows = np.concatenate(cache.admit(encoded, [1] * batch))
    tokens = np.full(batch, spec.decoder_start_id, dtype=np.int64)
    out = np.empty((batch, new_tokens), dtype=np.int64)
    no_eos = np.full(batch, spec.eos_id in suppress)  # EOS masked where it is chosen
    banned = np.asarray([i for i in suppress if i != spec.eos_id], dtype=np.int64)
    steps = cache.block_steps if block else 0
    eos_after = np.where(no_eos, new_tokens, 0)  # a block's EOS ban: all along, or never
    step = 0
    try:
        while step < new_tokens:
            positions = np.full(batch, step, dtype=np.int64)
            if steps and step + steps <= new_tokens and cache.block_fits(positions):
                ids, best = cache.step_block(rows, tokens, positions, eos_after)
                if np.isin(ids, banned).any() or np.isnan(best).any():
                    raise RuntimeError("a decode block picked a suppressed id or held a NaN")
                out[:, step : step + steps] = ids
                tokens = ids[:, -1].copy()
                step += steps
                continue
            greedy = cache.step_greedy(rows, tokens, positions, no_eos)
            tokens = greedy.tokens.astype(np.int64)  # a copy: the step's buffer is reused
            again = np.isin(tokens, banned) | np.isnan(greedy.best)
            if again.any():  # another suppressed winner, or a NaN: argmax without them
                last = np.array(greedy.logits()[again], dtype=np.float32)
                last[:, banned] = -np.inf
                last[:, spec.eos_id] = np.where(no_eos[again], -np.inf, last[:, spec.eos_id])
                tokens[again] = last.argmax(-1)
            out[:, step] = tokens
            step += 1
    finally:
        cache.release(rows)
    return out


def execution_providers(device: str) -> tuple[str, ...]:
    """The ONNX Runtime execution providers for ``device`` (cpu | cuda)."""
    return ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)


KV8_SUFFIX = "-kv8"  # names of the int8-KV-cache entry and engines
CUDA_GRAPH_SUFFIX = "-cudagraph"  # engines whose decode steps replay CUDA graphs


def block_suffix(decode_block: int) -> str:
    """The engine name's mark of decode blocks of ``decode_block`` steps (none for 0)."""
    return f"-block{decode_block}" if decode_block else ""


def attention_suffix(precision: str, decode_attention: str | None) -> str:
    """``-fused`` / ``-matmul`` in the names of the entries and engines whose decode attention
    is not their precision's default (``contract.graphs.default_decode_attention``: matmul for
    int8, else fused); empty for the default."""
    from contract.graphs import default_decode_attention

    default = default_decode_attention(precision, "float")
    return "" if decode_attention in (None, default) else f"-{decode_attention}"


class AttnServeRunner(Runner):
    """Our exported graphs in ONNX Runtime, through ``Seq2SeqRunner``."""

    def __init__(
        self,
        entry: Path,
        precision: str,
        new_tokens: int,
        threads: int,
        device: str = "cpu",
        kv_cache: str = "inplace",
        max_batch: int = 32,
        instances: int = 1,
        kv8: bool = False,
        cuda_graph: bool = False,
        decode_attention: str | None = None,
        decode_block: int = 0,
    ) -> None:
        """With ``instances`` > 1: that many engines of ``threads // instances`` threads, each
        decoding its share of the batch at the same time (the server's ``batching.instances``:
        its requests spread over the instances). ``cuda_graph``: decode steps replayed as CUDA
        graphs (``onnxruntime.cuda_graph``; on CUDA only). ``decode_block``: greedy steps that
        many at a time through the entry's decode block graph (``batching.decode_block``)."""
        import onnxruntime

        from contract.model_config import GeneratorConfig
        from contract.repository import read_model_config

        providers = execution_providers(device)
        config = read_model_config(entry)
        growing = kv_cache == "growing"
        per_instance = max(1, threads // instances)
        split = f"-{instances}x{per_instance}" if instances > 1 else ""
        super().__init__(
            name=f"attnserve-{precision}"
            + KV8_SUFFIX * kv8
            + attention_suffix(precision, decode_attention)
            + ("-growing" if growing else "")
            + CUDA_GRAPH_SUFFIX * cuda_graph
            + block_suffix(decode_block)
            + split,
            family="attnserve",
            precision=precision,
            label=f"attnserve ONNX Runtime {precision}"
            + (", int8 KV cache" if kv8 else "")
            + (
                f", {decode_attention} attention"
                if attention_suffix(precision, decode_attention)
                else ""
            )
            + (", growing cache" if growing else "")
            + (", CUDA graphs" if cuda_graph else "")
            + (f", blocks of {decode_block} steps" if decode_block else "")
            + (f", {instances} instances x {per_instance} thread" if instances > 1 else ""),
            config={
                "onnxruntime": onnxruntime.__version__,
                "instances": instances,
                "intra_op_threads": per_instance,
                "allow_spinning": True,
                "providers": list(providers),
                "entry": str(entry),
                "kv_cache": kv_cache,
                "cuda_graph": cuda_graph,
                "decode_attention": entry_decode_attention(entry),
                "decode_block": decode_block,
            },
        )
        if (
            device == "cuda"
            and "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
        ):
            raise Unavailable("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
        if cuda_graph and device != "cuda":
            raise Unavailable("CUDA graphs need --device cuda")
        assert isinstance(config, GeneratorConfig)
        self.instances = _decoding(
            entry,
            config,
            per_instance,
            providers,
            kv_cache,
            max_batch,
            instances,
            cuda_graph,
            decode_block > 0,
        )
        backends = {id(runner.backend) for runner, _ in self.instances}
        self.config["shared_sessions"] = len(backends) < len(self.instances)
        self.runner, self.cache = self.instances[0]
        self.config["kv_cache"] = "inplace" if "InPlace" in type(self.cache).__name__ else "growing"
        if self.config["kv_cache"] != kv_cache:
            raise Unavailable(f"{entry} cannot decode with the {kv_cache} KV cache here")
        if decode_block and getattr(self.cache, "block_steps", 0) != decode_block:
            raise Unavailable(f"{entry} has no decode block of {decode_block} steps")
        self.decode_block = decode_block
        if cuda_graph and getattr(self.cache.decoder, "captured", None) is None:
            raise Unavailable(f"{entry}: the in-place decoder's session captures no CUDA graphs")
        # greedy steps of at least this many logits pick their tokens on the device (None: never)
        picks = getattr(getattr(self.cache, "decoder", None), "greedy", False)
        self.config["greedy_pick_min_logits"] = self.cache.pick_min_logits if picks else None
        self.new_tokens = new_tokens
        self.spec = config.decoder

    def run(self, ids: np.ndarray) -> np.ndarray:
        if len(self.instances) == 1 or len(ids) == 1:
            return self._decode(self.runner, self.cache, ids)
        from concurrent.futures import ThreadPoolExecutor

        shares = np.array_split(ids, min(len(self.instances), len(ids)))
        with ThreadPoolExecutor(len(shares)) as pool:
            runners = [runner for runner, _ in self.instances]
            caches = [cache for _, cache in self.instances]
            outputs = pool.map(self._decode, runners, caches, shares)
            return np.concatenate(list(outputs))

    def _decode(self, runner: Any, cache: Any, ids: np.ndarray) -> np.ndarray:
        encoded = runner.encode({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return fixed_greedy(
            cache, encoded, self.spec, self.new_tokens, [self.spec.eos_id], self.decode_block > 0
        )

    def close(self) -> None:
        del self.runner, self.cache, self.instances


def _decoding(
    entry: Path,
    config: Any,
    threads: int,
    providers: tuple[str, ...],
    kv_cache: str,
    max_batch: int,
    instances: int,
    cuda_graph: bool = False,
    decode_block: bool = False,
) -> list[tuple[Any, Any]]:
    """Per engine instance, the entry's runner (encoder) and KV cache as the server builds them
    (``make_backends``: one-thread instances share their sessions), tuned for the engine alone on
    the machine: idle threads may spin, the arena keeps its buffers (the server turns both off),
    ``max_batch`` cache rows, ``new_tokens`` positions."""
    from contract.repository import resolve_version
    from serving.backends.base import BackendError
    from serving.engine.decode_cache import DecodeCache
    from serving.engine.padded_cache import PaddedKVCache
    from serving.repository import make_backends
    from serving.seq2seq import Seq2SeqRunner
    from serving.served.generator import inplace_cache

    options = replace(
        config.onnxruntime,
        intra_op_threads=threads,
        execution_providers=providers,
        allow_spinning=True,
        cpu_memory_arena=True,
        kv_cache=kv_cache,
        cuda_graph=cuda_graph,
    )
    batching = replace(
        config.batching,
        max_active_sequences=max_batch,
        in_flight=True,
        instances=instances,
        decode_block=decode_block,
    )
    config = replace(config, onnxruntime=options, batching=batching)
    try:
        backends = make_backends(config, resolve_version(entry))
    except BackendError as err:
        raise Unavailable(str(err)) from err
    decoding = []
    for backend in backends:
        runner = Seq2SeqRunner(backend, config.decoder)
        cache: DecodeCache | None = inplace_cache(backend, config)
        if cache is None:
            cache = PaddedKVCache(runner, max_batch * config.decoder.max_positions)
        decoding.append((runner, cache))
    return decoding


def is_current_export(manifest: dict[str, Any]) -> bool:
    """Whether an export's manifest is as today's exports write it: the fused projections
    (2026-11-27: graphs of fewer nodes, ``export.fused_projections``) and an in-place decoder's
    cache graphs choosing their scatter indices by device (2026-11-27 evening, ``vector_scatter``:
    joins on CUDA) and a decode block of today's revision (2026-11-28, written by default). The
    benchmarks' caches export older ones again."""
    from export.cache_graphs import CACHE_SCATTER
    from export.decoder_block import BLOCK_REVISION

    graphs = manifest.get("graphs", {})
    inplace = manifest.get("decoders", {}).get("inplace")
    return (
        bool(graphs)
        and all("fused_projections" in facts for facts in graphs.values())
        and (
            inplace is None
            or (
                inplace.get("cache_scatter") == CACHE_SCATTER
                and inplace.get("decode_block", {}).get("revision") == BLOCK_REVISION
            )
        )
    )


def export_attnserve(
    marian_dir: Path,
    cache: Path,
    shape: MarianShape,
    precision: str,
    fast_int8: bool,
    kv_cache_dtype: str = "float",
    decode_attention: str | None = None,
) -> Path:
    """Our repository entry for ``precision`` (exported once into the cache, then reused).

    fp32 and int8 go through ``export()`` with its parity checks. With ``fast_int8`` the int8
    entry is the fp32 one with its graphs quantised by ``export.precision.quantize_int8`` (what
    ``export(precision="int8")`` does after a second trace), to keep CI runs short. An int8
    ``kv_cache_dtype`` (int8 only) is the entry ``marian-int8-kv8``. A ``decode_attention``
    other than the precision's default (``attention_suffix``) is the fp32 entry's copy with its
    in-place decoder rewritten (``export.matmul_attention``), quantised for int8; fp16 exports
    with it.
    """
    from contract.graphs import default_decode_attention
    from contract.repository import CONFIG_FILE, REPOSITORY_FORMAT, read_manifest

    repository = Path(cache) / f"repo-{shape.key()}"
    suffix = attention_suffix(precision, decode_attention)
    name = f"marian-{precision}" + KV8_SUFFIX * (kv_cache_dtype == "int8") + suffix
    entry = repository / name
    exported = (entry / CONFIG_FILE).is_file() and (entry / "1" / "manifest.json").is_file()
    # entries from before today's graphs (is_current_export) are exported again
    manifest = read_manifest(entry / "1") if exported else {}
    wanted = decode_attention or default_decode_attention(precision, kv_cache_dtype)
    if (
        is_current_export(manifest)
        and manifest.get("format") == REPOSITORY_FORMAT
        and _manifest_attention(manifest) == wanted
    ):
        return entry
    if (precision == "int8" and fast_int8) or (suffix and precision != "fp16"):
        fp32 = export_attnserve(marian_dir, cache, shape, "fp32", False)
        return _derived_copy(fp32, entry, precision, kv_cache_dtype, wanted)
    from export.exporter import ExportOptions, export
    from export.hf import load_hf_directory

    log(f"exporting {marian_dir.name} to ONNX ({precision}) into {repository}")
    options = ExportOptions(
        name=name,
        precision=precision,
        kv_cache_dtype=kv_cache_dtype,
        decode_attention=decode_attention,
        parity_examples=100,
        force=True,
    )
    export(load_hf_directory(marian_dir), repository, options)
    return entry


def _manifest_attention(manifest: dict[str, Any]) -> str | None:
    """An export's decode attention: ``fused`` for exports from before the option."""
    inplace = manifest.get("decoders", {}).get("inplace")
    return None if inplace is None else inplace.get("decode_attention", "fused")


def entry_decode_attention(entry: Path) -> str | None:
    """The decode attention of ``entry``'s latest version (None: no in-place decoder)."""
    from contract.repository import read_manifest, resolve_version

    return _manifest_attention(read_manifest(resolve_version(entry)))


def _derived_copy(
    fp32_entry: Path,
    entry: Path,
    precision: str,
    kv_cache_dtype: str,
    decode_attention: str,
) -> Path:
    """``entry``: ``fp32_entry`` with int8-quantised graphs for int8 (and an int8 KV cache if
    asked) and its in-place decoder's attention as MatMuls if ``decode_attention`` says so,
    config and manifest saying so."""
    import onnx

    from contract.graphs import DECODER_FILE, DECODER_INPLACE_FILE, ENCODER_FILE
    from contract.model_config import GeneratorConfig, Precision
    from contract.repository import read_model_config, write_model_config
    from export.cache_graphs import write_cache_graphs
    from export.kv_int8 import int8_kv_cache
    from export.matmul_attention import matmul_attention
    from export.precision import quantize_int8

    scratch = entry.with_name(entry.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "1").mkdir(parents=True)
    graphs = [
        g
        for g in (ENCODER_FILE, DECODER_FILE, DECODER_INPLACE_FILE)
        if (fp32_entry / "1" / g).is_file()
    ]
    for path in (fp32_entry / "1").iterdir():
        if path.name not in graphs:
            shutil.copy2(path, scratch / "1" / path.name)
    for graph in graphs:
        if precision == "int8":
            quantize_int8(fp32_entry / "1" / graph, scratch / "1" / graph)
        else:
            shutil.copy2(fp32_entry / "1" / graph, scratch / "1" / graph)
    fp32_config = read_model_config(fp32_entry)
    assert isinstance(fp32_config, GeneratorConfig)  # a Marian export
    derived: Precision = "int8" if precision == "int8" else "fp32"  # int8 or fp32 get here
    config = replace(fp32_config, name=entry.name, precision=derived)
    spec = config.decoder
    path = scratch / "1" / DECODER_INPLACE_FILE
    if kv_cache_dtype == "int8" and DECODER_INPLACE_FILE in graphs:
        onnx.save(int8_kv_cache(onnx.load(str(path)), spec.num_layers, spec.head_dim), str(path))
        write_cache_graphs(scratch / "1", spec.num_layers, spec.num_heads, spec.head_dim, "int8")
    if decode_attention == "matmul" and DECODER_INPLACE_FILE in graphs:
        model = matmul_attention(onnx.load(str(path)), spec.num_layers, spec.head_dim)
        onnx.save(model, str(path))
    write_model_config(config, scratch)
    manifest = json.loads((scratch / "1" / "manifest.json").read_text())
    manifest.update(name=entry.name, precision=precision, derived_from=str(fp32_entry))
    if "inplace" in manifest.get("decoders", {}):
        manifest["decoders"]["inplace"]["decode_attention"] = decode_attention
    (scratch / "1" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(entry, ignore_errors=True)
    scratch.rename(entry)
    return entry
