"""The Triton peer of `attnserve bench serve`: a real Triton core serving the same ViT ONNX model.

PyTriton (``nvidia-pytriton``, which bundles ``tritonserver`` and its python backend) serves a
Python callable that runs the ViT's ``model.onnx`` in ONNX Runtime behind Triton's dynamic
batcher. The model declares what attnserve's ViT declares (``image`` UINT8 [N,S,S,3] in,
``probabilities`` FP32 [N,C] and ``label`` BYTES [N,1] out) and does the same work per image
(normalise, one ONNX Runtime call per batch, softmax), so one load generator and perf_analyzer
drive both servers with the same requests.

This file runs as a script under another interpreter (``benchmarks.triton_peer`` starts it):
PyTriton needs numpy < 2, so it lives in its own virtual environment, and the script imports
only the standard library, numpy, onnxruntime and pytriton. It prints one line
``triton peer serving NAME on HOST:PORT`` once Triton answers, and stops Triton on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

READY = "triton peer serving"


def libpython_dir() -> str:
    """The folder of this interpreter's shared libpython (the python backend's stub links it).

    Raises:
        RuntimeError: the interpreter was built without a shared libpython.
    """
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY") or ""
    if not name.endswith((".so", ".so.1.0")) or not (Path(libdir) / name).exists():
        raise RuntimeError(
            f"{sys.executable} has no shared libpython ({libdir}/{name}); Triton's python "
            "backend stub needs one: use a Python built with --enable-shared"
        )
    return libdir


def make_session(model: str, threads: int) -> Any:
    """An ONNX Runtime session with attnserve's CPU defaults (no spinning, no memory arena)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def infer_function(spec: dict[str, Any]) -> Any:
    """The batched callable: RGB images in, probabilities and top-1 labels out."""
    import numpy as np
    from pytriton.decorators import batch

    session = make_session(spec["model"], spec["threads"])
    mean = np.asarray(spec["mean"], np.float32)
    std = np.asarray(spec["std"], np.float32)
    labels = np.asarray([label.encode() for label in spec["labels"]], dtype=object)

    @batch
    def infer(image: Any) -> dict[str, Any]:
        pixels = (image.astype(np.float32) / np.float32(255.0) - mean) / std
        pixels = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))
        (logits,) = session.run(None, {"pixel_values": pixels})
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        label = labels[probabilities.argmax(axis=1)].reshape(-1, 1)
        return {"probabilities": probabilities, "label": label}

    return infer


def serve(spec: dict[str, Any]) -> None:
    """Bind the model, run Triton, announce the port, wait for SIGTERM / SIGINT, stop."""
    import numpy as np
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libpython_dir(), os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    host = spec.get("host", "127.0.0.1")
    config = TritonConfig(
        grpc_address=host,
        grpc_port=spec["grpc_port"],
        http_address=host,
        http_port=spec["http_port"],
        metrics_port=spec["metrics_port"],
        allow_metrics=False,
        log_verbose=0,
    )
    size = spec["size"]
    # perf_analyzer 2.40 sends no access header: leave the statistics API open (loopback only).
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as t:
        t.bind(
            model_name=spec["name"],
            # one callable per model instance (Triton's instance_group), each with its session
            infer_func=[infer_function(spec) for _ in range(spec["instances"])],
            inputs=[Tensor(name="image", dtype=np.uint8, shape=(size, size, 3))],
            outputs=[
                Tensor(name="probabilities", dtype=np.float32, shape=(len(spec["labels"]),)),
                Tensor(name="label", dtype=bytes, shape=(1,)),
            ],
            config=ModelConfig(
                max_batch_size=spec["max_batch_size"],
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=spec["delay_us"],
                    priority_levels=spec.get("priority_levels", 0),
                    default_priority_level=spec.get("default_priority_level", 0),
                ),
            ),
            strict=True,
        )
        t.run()
        print(f"{READY} {spec['name']} on {host}:{spec['grpc_port']}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python triton_peer_server.py --spec JSON``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="JSON: model, name, ports, batching, ...")
    spec = json.loads(parser.parse_args(argv).spec)
    signal.signal(signal.SIGTERM, _interrupt)  # Triton's context manager then stops tritonserver
    with contextlib.suppress(KeyboardInterrupt):
        serve(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
