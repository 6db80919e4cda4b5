"""``export()``: one SOURCE -> one model-repository entry, validated against PyTorch."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.errors import ExportError
from export.onnx_export import FUSED_ATTENTION_OPSET, export_graph, op_census
from export.parity import (
    ParityReport,
    classifier_real_parity,
    random_input_parity,
    seq2seq_real_parity,
)
from export.precision import check_precision, model_for_precision, quantize_int8
from export.repository import (
    library_versions,
    model_config_for,
    prepare_version_dir,
    write_entry_files,
    write_manifest,
)
from export.sources import LoadedSource, load_source
from export.spec import GraphSpec, graph_specs
from export.triton import write_triton_config
from models.data import digits, shapes
from models.data.images import pixel_values
from models.data.translation import generate_pairs
from models.evaluate import EVAL_SEED
from models.train.common import pad_batch
from serving.backends.onnxruntime import OnnxRuntimeBackend
from serving.model_config import OnnxRuntimeOptions
from serving.seq2seq import Seq2SeqRunner

MIN_OPSET, MAX_OPSET = 17, 24


@dataclass(frozen=True)
class ExportOptions:
    """What `attnserve export` takes besides SOURCE and --out."""

    name: str | None = None  # entry name (default: the model kind)
    version: int = 1  # version folder
    opset: int = FUSED_ATTENTION_OPSET  # >= 23: fused Attention op; lower: decomposed attention
    precision: str = "fp32"  # fp32 | fp16 | int8
    tensorrt: bool = False  # also build TensorRT engines (needs TensorRT and a GPU)
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
    if config.kind == "classifier":
        manifest["triton_config"] = write_triton_config(config, repository / name, version_dir)
    write_manifest(version_dir, manifest)
    return ExportResult(repository / name, version_dir, manifest)


def _export_into(loaded: LoadedSource, version_dir: Path, options: ExportOptions) -> dict[str, Any]:
    model = loaded.model.eval()
    traced = model_for_precision(model, options.precision)
    specs = graph_specs(loaded.kind, traced)
    graphs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for spec in specs:
            final = version_dir / spec.filename
            exported = Path(scratch) / spec.filename if options.precision == "int8" else final
            dtype = torch.float16 if options.precision == "fp16" else torch.float32
            onnx_model = export_graph(spec, exported, options.opset, options.seed, dtype)
            if options.precision == "int8":
                quantize_int8(exported, final)
                import onnx

                onnx_model = onnx.load(str(final))
            graphs[spec.name] = _graph_facts(final, onnx_model, spec)
    backend = OnnxRuntimeBackend(  # as many threads as torch has (export-all workers share cores)
        version_dir,
        {s.name: s.filename for s in specs},
        OnnxRuntimeOptions(intra_op_threads=torch.get_num_threads()),
    )
    report = _parity(loaded, graph_specs(loaded.kind, model), backend, options)
    report.check()
    manifest: dict[str, Any] = {
        "name": options.name or loaded.kind,
        "version": options.version,
        "kind": loaded.kind,
        "source": {"origin": loaded.origin, "sha256": loaded.checksum},
        "opset": options.opset,
        "precision": options.precision,
        "fused_attention": all(
            g["attention_nodes"] > 0 for g in graphs.values() if g["has_attention"]
        ),
        "graphs": graphs,
        "parity": report.as_dict(),
        "libraries": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": [spec.filename for spec in specs],
    }
    if options.tensorrt:
        from export.tensorrt import build_engines

        manifest["tensorrt"] = build_engines(version_dir, loaded, options)
        engines = manifest["tensorrt"]["engines"]
        manifest["files"] += [e["file"] for e in engines] + [e["layers_file"] for e in engines]
        manifest["files"].append(manifest["tensorrt"]["timing_cache"])
    return manifest


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
    report.max_abs_diff = random_input_parity(reference_specs, backend, float_dtype)
    model = loaded.model
    n = options.parity_examples
    if loaded.kind == "vit":
        images, _ = digits.load_digits_split("test")
        config = model.config
        images = resized(images[:n], config.image_size)
        pixels = torch.from_numpy(pixel_values(images, config.image_mean, config.image_std))
        classifier_real_parity(model, backend, pixels, report, float_dtype)
        return report
    config = model.config
    spec = model_config_for(loaded, "parity", options.precision).decoder
    assert spec is not None
    runner = Seq2SeqRunner(backend, spec)
    # The decoder's position table bounds both the reference targets and the generation.
    longest = spec.max_positions - 1
    for inputs, targets in _seq2seq_batches(loaded, n):
        clipped = [t[:longest] for t in targets]
        seq2seq_real_parity(
            model, runner, inputs, clipped, report, min(config.max_target_length, longest)
        )
    return report


def _seq2seq_batches(loaded: LoadedSource, n: int, batch: int = 32):
    """Held-out (inputs, reference target ids) batches for end-to-end parity."""
    config = loaded.model.config
    tokenizer = loaded.tokenizer
    if loaded.kind == "translator":
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
        return
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
