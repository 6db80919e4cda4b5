"""Triton model-repository entry for classifiers: REPOSITORY/NAME/config.pbtxt.

Our repository layout (NAME/VERSION/model.onnx) is Triton's, so with this file Triton's
onnxruntime backend serves the exported ViT directly, with dynamic batching.
"""

from __future__ import annotations

from pathlib import Path

from contract.model_config import ClassifierConfig

TRITON_CONFIG = "config.pbtxt"


def triton_config_text(config: ClassifierConfig) -> str:
    """config.pbtxt for a classifier entry (protobuf text format of Triton's ModelConfig)."""
    data_type = "TYPE_FP16" if config.precision == "fp16" else "TYPE_FP32"
    size = config.image.size
    batching = config.batching
    return f"""# Written by `attnserve export`: lets Triton serve this entry directly.
name: "{config.name}"
platform: "onnxruntime_onnx"
max_batch_size: {batching.max_batch_size}
input [
  {{
    name: "pixel_values"
    data_type: {data_type}
    format: FORMAT_NCHW
    dims: [ 3, {size}, {size} ]
  }}
]
output [
  {{
    name: "logits"
    data_type: {data_type}
    dims: [ {len(config.labels)} ]
    label_filename: "labels.txt"
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {batching.max_queue_delay_us}
}}
"""


def write_triton_config(config: ClassifierConfig, entry: Path, version_dir: Path) -> str:
    """Write config.pbtxt (and Triton's entry-level labels.txt); returns the file name."""
    (entry / TRITON_CONFIG).write_text(triton_config_text(config))
    labels = version_dir / "labels.txt"
    if labels.is_file():  # Triton looks for label files beside config.pbtxt
        (entry / "labels.txt").write_text(labels.read_text())
    return TRITON_CONFIG
