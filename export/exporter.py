"""``export()``: one SOURCE -> one model-repository entry, validated against PyTorch."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from contract.graphs import (
    DECODE_ATTENTIONS,
    DECODER,
    DECODER_BLOCK_FILE,
    DECODER_INPLACE,
    DEFAULT_BLOCK_STEPS,
    FUSED_ATTENTION_OPSET,
    INPLACE_GRAPH_FILES,
    KV_CACHE_DTYPES,
    MAX_OPSET,
    MIN_OPSET,
    OPTIONAL_INPLACE_GRAPH_FILES,
    default_decode_attention,
)
from contract.images import pixel_values
from contract.model_config import ClassifierConfig, GeneratorConfig, OnnxRuntimeOptions
from contract.repository import REPOSITORY_FORMAT, write_manifest
from contract.tokenizer import SubwordTokenizer
from export.cache_graphs import CACHE_SCATTER, write_cache_graphs
from export.cast_round_trips import drop_cast_round_trips
from export.decoder_block import (
    MAX_BLOCK_STEPS,
    MIN_BLOCK_STEPS,
    write_decode_block,
)
from export.errors import ExportError
from export.fused_projections import fuse_projections
from export.kv_int8 import int8_kv_cache
from export.matmul_attention import matmul_attention
from export.onnx_export import export_graph, op_census
from export.parity import (
    ParityReport,
    classifier_real_parity,
    random_input_parity,
    seq2seq_real_parity,
)
from export.precision import check_precision, model_for_precision, quantize_int8
from export.repository import (
    decoder_spec,
    library_versions,
    model_config_for,
    prepare_version_dir,
    write_entry_files,
)
from export.serving_runner import (
    OnnxRuntimeBackend,
    Seq2SeqRunner,
    decode_caches,
    held_out_source_capacity,
)
from export.sources import LoadedSource, load_source
from export.spec import GraphSpec, graph_specs
from export.triton import write_triton_config
from models.captioner import Captioner, CaptionerConfig
from models.data import digits, shapes
from models.data.translation import generate_pairs
from models.evaluate import EVAL_SEED
from models.train.common import pad_batch
from models.translator import Translator, TranslatorConfig
from models.vit import ViT

PARITY_BATCH = 32  # held-out examples per batch of the end-to-end parity check
# (model inputs, reference target ids) per batch of the end-to-end parity check
Batches = Iterator[tuple[tuple[torch.Tensor, ...], list[list[int]]]]


@dataclass(frozen=True)
class ExportOptions:
    """What `attnserve export` takes besides SOURCE and --out."""

    name: str | None = None  # entry name (default: the model kind)
    version: int = 1  # version folder
    opset: int = FUSED_ATTENTION_OPSET  # >= 23: fused Attention op; lower: decomposed attention
    precision: str = "fp32"  # fp32 | fp16 | int8
    kv_cache_dtype: str = "float"  # float (the graphs' float type) | int8 (with --precision int8)
    # the in-place decoder's attention with a float cache: fused (the Attention op) | matmul
    # (export.matmul_attention, faster on the CPU); None: matmul for int8, else fused
    decode_attention: str | None = None
    # greedy steps per run of the decode block graph (export.decoder_block); 0: not written
    decode_block: int = DEFAULT_BLOCK_STEPS
    tensorrt: bool = False  # also build TensorRT engines (needs TensorRT and a GPU)
    tensorrt_flavour: str | None = None  # auto | tensorrt | rtx (None: ATTNSERVE_TENSORRT_FLAVOUR)
    force: bool = False  # overwrite an existing version
    parity_examples: int = 128  # held-out examples decoded end to end (>= 100)
    seed: int = 0


@dataclass
class ExportResult:
    entry: Path
    version_dir: Path
    manifest: dict[str, Any]


def export(
    source: str | LoadedSource, repository: str | Path, options: ExportOptions
) -> ExportResult:
    """Export SOURCE into REPOSITORY/NAME/VERSION and check it against PyTorch.

    Raises:
        SourceError: SOURCE cannot be loaded.
        DestinationError: the version exists (without force) or cannot be written.
        ExportError: export, quantisation or a parity check failed (nothing is left behind).
    """
    check_precision(options.precision)
    if options.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ExportError(
            f"unknown KV cache dtype {options.kv_cache_dtype!r}; supported: "
            + ", ".join(KV_CACHE_DTYPES)
        )
    if options.kv_cache_dtype == "int8" and options.precision != "int8":
        raise ExportError("--kv-cache-dtype int8 goes with --precision int8")
    _check_decode_attention(options)
    if options.decode_block and not MIN_BLOCK_STEPS <= options.decode_block <= MAX_BLOCK_STEPS:
        raise ExportError(
            f"--decode-block takes {MIN_BLOCK_STEPS} to {MAX_BLOCK_STEPS} steps (or 0: none), "
            f"not {options.decode_block}"
        )
    if options.tensorrt and options.precision == "int8":
        raise ExportError("--tensorrt builds from fp32 or fp16 graphs; use --precision fp16")
    if not MIN_OPSET <= options.opset <= MAX_OPSET:
        raise ExportError(
            f"--opset must be between {MIN_OPSET} and {MAX_OPSET}, got {options.opset}"
        )
    loaded = source if isinstance(source, LoadedSource) else load_source(source)
    name = options.name or loaded.kind
    repository = Path(repository)
    version_dir = prepare_version_dir(repository, name, options.version, options.force)
    started = time.perf_counter()
    try:
        manifest = _export_into(loaded, version_dir, options)
    except BaseException:
        shutil.rmtree(version_dir, ignore_errors=True)
        raise
    manifest["export_seconds"] = round(time.perf_counter() - started, 1)
    config = model_config_for(loaded, name, options.precision)
    manifest["files"] += write_entry_files(loaded, repository / name, version_dir, config)
    if loaded.entry.notes:  # what the entry's tokenizer, preprocessing and rules were read from
        manifest["source"]["serving"] = loaded.entry.notes
    if isinstance(config, ClassifierConfig):
        manifest["triton_config"] = write_triton_config(config, repository / name, version_dir)
    write_manifest(version_dir, manifest)
    return ExportResult(repository / name, version_dir, manifest)


def _export_into(loaded: LoadedSource, version_dir: Path, options: ExportOptions) -> dict[str, Any]:
    model = loaded.model.eval()
    traced = model_for_precision(model, options.precision)
    specs = graph_specs(loaded.kind, traced)
    graphs: dict[str, Any] = {}
    attention = decode_attention_of(options)
    with tempfile.TemporaryDirectory() as scratch:
        for spec in specs:
            final = version_dir / spec.filename
            exported = Path(scratch) / spec.filename if options.precision == "int8" else final
            dtype = torch.float16 if options.precision == "fp16" else torch.float32
            onnx_model = export_graph(spec, exported, options.opset, options.seed, dtype)
            round_trips = drop_cast_round_trips(onnx_model) if options.precision == "fp16" else 0
            fused = fuse_projections(onnx_model) if options.precision != "int8" else 0
            if round_trips or fused:
                onnx.save(onnx_model, str(final))
            if options.precision == "int8":
                quantize_int8(exported, final)
                onnx_model = onnx.load(str(final))
                if spec.name == DECODER_INPLACE and options.kv_cache_dtype == "int8":
                    shape = decoder_spec(loaded.model.config)
                    onnx_model = int8_kv_cache(onnx_model, shape.num_layers, shape.head_dim)
                    onnx.save(onnx_model, str(final))
            if spec.name == DECODER_INPLACE and attention == "matmul":
                shape = decoder_spec(loaded.model.config)
                onnx_model = matmul_attention(onnx_model, shape.num_layers, shape.head_dim)
                onnx.save(onnx_model, str(final))
            graphs[spec.name] = _graph_facts(final, onnx_model, spec)
            if spec.name == DECODER_INPLACE:
                graphs[spec.name]["decode_attention"] = attention
            graphs[spec.name]["fused_projections"] = fused
            if options.precision == "fp16":
                graphs[spec.name]["cast_round_trips_removed"] = round_trips
    helpers = _write_cache_graphs(loaded, version_dir, options)
    block = None  # what the manifest says of the decode block graph, where one is written
    if helpers and options.decode_block:
        block = write_decode_block(version_dir, options.decode_block)
        helpers.append(DECODER_BLOCK_FILE)
    backend = OnnxRuntimeBackend(  # as many threads as torch has (export-all workers share cores)
        version_dir,
        {**{s.name: s.filename for s in specs}, **_helper_graphs(helpers)},
        OnnxRuntimeOptions(intra_op_threads=torch.get_num_threads()),
    )
    report = _parity(loaded, graph_specs(loaded.kind, model), backend, options)
    report.check()
    manifest: dict[str, Any] = {
        "format": REPOSITORY_FORMAT,
        "name": options.name or loaded.kind,
        "version": options.version,
        "kind": loaded.kind,
        "source": {"origin": loaded.origin, "sha256": loaded.checksum},
        "opset": options.opset,
        "precision": options.precision,
        "fused_attention": all(  # (but where --decode-attention chose MatMuls)
            g["attention_nodes"] > 0
            for g in graphs.values()
            if g["has_attention"] and g.get("decode_attention") != "matmul"
        ),
        "graphs": graphs,
        "parity": report.as_dict(),
        "libraries": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": [spec.filename for spec in specs] + helpers,
    }
    if helpers:
        manifest["decoders"] = _decoder_variants(graphs, helpers, options.kv_cache_dtype, attention)
        if block is not None:
            manifest["decoders"]["inplace"]["decode_block"] = block
    if options.tensorrt:
        from export.tensorrt import build_engines

        manifest["tensorrt"] = build_engines(version_dir, loaded, options)
        engines = manifest["tensorrt"]["engines"]
        manifest["files"] += [e["file"] for e in engines] + [e["layers_file"] for e in engines]
        if manifest["tensorrt"]["timing_cache"] is not None:  # TensorRT-RTX keeps none
            manifest["files"].append(manifest["tensorrt"]["timing_cache"])
    return manifest


def _write_cache_graphs(
    loaded: LoadedSource, version_dir: Path, options: ExportOptions
) -> list[str]:
    """The in-place decoder's cache helper graphs (seq2seq models only)."""
    if loaded.kind == "vit":
        return []
    spec = decoder_spec(loaded.model.config)
    kv_dtype = "fp16" if options.precision == "fp16" else "fp32"
    if options.kv_cache_dtype == "int8":
        kv_dtype = "int8"
    return write_cache_graphs(version_dir, spec.num_layers, spec.num_heads, spec.head_dim, kv_dtype)


def _decoder_variants(
    graphs: dict[str, Any], helpers: list[str], kv_dtype: str, attention: str
) -> dict[str, Any]:
    """What manifest.json says about the two decoder graphs: the server prefers the in-place
    one and falls back to the growing-cache graph where a runtime cannot run opset 24."""
    written = {
        "int8": "int8 with a scale per vector, keys transposed (TensorScatter + MatMulInteger "
        "attention)",
        "fused": "TensorScatter + Attention with nonpad_kv_seqlen",
        "matmul": "TensorScatter + attention as keys x query, masked Softmax, x values",
    }[attention]
    return {
        "inplace": {
            "file": graphs[DECODER_INPLACE]["file"],
            "opset": graphs[DECODER_INPLACE]["opset"],
            "cache_graphs": helpers,
            "cache_scatter": CACHE_SCATTER,
            "kv_cache": f"fixed capacity per row, written in place ({written})",
            "kv_dtype": kv_dtype,
            "decode_attention": attention,
        },
        "fallback": {
            "file": graphs[DECODER]["file"],
            "opset": graphs[DECODER]["opset"],
            "kv_cache": "present = past + new tokens (grows every step)",
        },
    }


def decode_attention_of(options: ExportOptions) -> str:
    """The in-place decoder's attention for ``options`` (``int8``: the int8 cache's own)."""
    default = default_decode_attention(options.precision, options.kv_cache_dtype)
    return options.decode_attention or default


def _check_decode_attention(options: ExportOptions) -> None:
    attention = options.decode_attention
    if attention is None:
        return
    if attention not in DECODE_ATTENTIONS:
        raise ExportError(
            f"unknown decode attention {attention!r}; supported: " + ", ".join(DECODE_ATTENTIONS)
        )
    if options.kv_cache_dtype == "int8":
        raise ExportError(
            "--decode-attention goes with a float KV cache: the int8 cache's attention is "
            "integer MatMuls of its own"
        )


def _graph_facts(path: Path, onnx_model: Any, spec: GraphSpec) -> dict[str, Any]:
    census = op_census(onnx_model)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    inputs = {
        value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in onnx_model.graph.input
    }
    return {
        "file": spec.filename,
        "sha256": digest,
        "bytes": path.stat().st_size,
        "inputs": inputs,
        "outputs": list(spec.output_names),
        "opset": next(o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")),
        "attention_nodes": census.get("Attention", 0),
        "has_attention": True,
        "op_types": census,
    }


def _parity(
    loaded: LoadedSource,
    reference_specs: list[GraphSpec],
    backend: OnnxRuntimeBackend,
    options: ExportOptions,
) -> ParityReport:
    report = ParityReport(options.precision)
    float_dtype = np.float16 if options.precision == "fp16" else np.float32
    # An int8 cache takes other inputs than the PyTorch step: its decoder is judged on greedy
    # decoding only (as int8 graphs are anyway).
    specs = [
        spec
        for spec in reference_specs
        if not (spec.name == DECODER_INPLACE and options.kv_cache_dtype == "int8")
    ]
    report.max_abs_diff = random_input_parity(specs, backend, float_dtype)
    model = loaded.model
    n = options.parity_examples
    if loaded.kind == "vit":
        assert isinstance(model, ViT)  # what a vit source loads
        images, _ = digits.load_digits_split("test")
        config = model.config
        images = resized(images[:n], config.image_size)
        pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
        classifier_real_parity(model, backend, pixels, report, float_dtype)
        return report
    assert isinstance(model, Translator | Captioner)  # not a vit, so an encoder-decoder
    entry = model_config_for(loaded, "parity", options.precision)
    assert isinstance(entry, GeneratorConfig)  # not a vit, so a generator
    runner = Seq2SeqRunner(backend, entry.decoder)
    sources = held_out_source_capacity(entry)
    caches = decode_caches(backend, entry, rows=PARITY_BATCH, source_capacity=sources)
    # The decoder's position table bounds both the reference targets and the generation.
    longest = entry.decoder.max_positions - 1
    for inputs, targets in _seq2seq_batches(loaded, n):
        clipped = [t[:longest] for t in targets]
        new_tokens = min(model.config.max_target_length, longest)
        seq2seq_real_parity(model, runner, caches, inputs, clipped, report, new_tokens)
    return report


def _helper_graphs(files: list[str]) -> dict[str, str]:
    """Graph name -> file of the cache helper graphs written next to the decoders."""
    graphs = {**INPLACE_GRAPH_FILES, **OPTIONAL_INPLACE_GRAPH_FILES}
    return {graph: file for graph, file in graphs.items() if file in files}


def _seq2seq_batches(loaded: LoadedSource, n: int, batch: int = PARITY_BATCH) -> Batches:
    """Held-out (inputs, reference target ids) batches for end-to-end parity."""
    model = loaded.model
    if loaded.kind == "translator":
        assert isinstance(model, Translator)  # what a translator source loads
        return _translation_batches(model.config, loaded.tokenizer, n, batch)
    assert isinstance(model, Captioner)  # the other encoder-decoder kind
    return _caption_batches(model.config, loaded.tokenizer, n, batch)


def _translation_batches(
    config: TranslatorConfig, tokenizer: SubwordTokenizer | None, n: int, batch: int
) -> Batches:
    if tokenizer is None:  # HF import: random source ids stand in for text
        generator = torch.Generator().manual_seed(EVAL_SEED)
        for first in range(0, n, batch):
            size = min(batch, n - first)
            ids = torch.randint(3, config.vocab_size, (size, 12), generator=generator)
            ids[:, -1] = config.eos_id
            yield (ids, torch.ones_like(ids)), [[config.eos_id]] * size
        return
    pairs = generate_pairs(n, seed=EVAL_SEED, split="test")
    for first in range(0, n, batch):
        chunk = pairs[first : first + batch]
        ids, mask = pad_batch(
            tokenizer.encode_batch([p.tagged_source() for p in chunk]), config.pad_id
        )
        yield (ids, mask), tokenizer.encode_batch([p.target for p in chunk])


def _caption_batches(
    config: CaptionerConfig, tokenizer: SubwordTokenizer | None, n: int, batch: int
) -> Batches:
    data = shapes.generate(n, seed=EVAL_SEED, split="test")
    for first in range(0, n, batch):
        chunk = data[first : first + batch]
        images = resized(np.stack([image for image, _ in chunk]), config.image_size)
        pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
        targets = (
            tokenizer.encode_batch([text for _, text in chunk])
            if tokenizer
            else [[config.eos_id]] * len(chunk)
        )
        yield (pixels,), targets


def resized(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, 3) images at size x size, resized as serving's decode_image does."""
    if images.shape[1:3] == (size, size):
        return images
    from PIL import Image

    return np.stack(
        [
            np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))
            for image in images
        ]
    )
