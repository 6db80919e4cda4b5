"""The Triton peer of `attnserve bench serve` for real: PyTriton's tritonserver serving a ViT
entry answers the same KServe request as attnserve with the same probabilities (same ONNX
model, same preprocessing), and stops on SIGTERM. It needs a Python with nvidia-pytriton (numpy
< 2, so not this virtual environment): set ATTNSERVE_TRITON_PYTHON to one (the benchmark's
cache holds one after a full `attnserve bench serve`); without it the test skips."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest

from benchmarks.loadgen import kserve_request
from benchmarks.triton_peer import (
    PeerUnavailable,
    TritonPeer,
    peer_python,
    session_processes,
    vit_spec,
)
from models.data import digits
from serving.kserve.tensors import decode_outputs
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.server_thread import ServerThread

PYTHON = os.environ.get("ATTNSERVE_TRITON_PYTHON")


def _infer(address: str, images: np.ndarray) -> dict[str, np.ndarray]:
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            kserve_request("vit", (("image", "UINT8", images),)), timeout=60
        )
    return decode_outputs(reply)


@pytest.mark.skipif(not PYTHON, reason="set ATTNSERVE_TRITON_PYTHON to a Python with PyTriton")
def test_triton_peer_answers_like_attnserve(tiny_repository: Path, tmp_path: Path) -> None:
    try:
        python = peer_python(tmp_path, Path(PYTHON or ""))
    except PeerUnavailable as err:
        pytest.fail(str(err))
    images = digits.load_digits_split("test")[0][:3]
    peer = TritonPeer(python, vit_spec(tiny_repository / "vit", threads=1))
    with peer:
        theirs = _infer(peer.address, images)
        with grpc.insecure_channel(peer.address) as channel:
            meta = pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
                pb.ModelMetadataRequest(name="vit"), timeout=30
            )
        pid = peer.process.pid
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [
        ("image", "UINT8", [-1, 32, 32, 3])
    ]
    assert peer.process.returncode is not None
    assert session_processes(pid) == []  # tritonserver and the backend stub went with it
    with ServerThread(tiny_repository, metrics_port=-1) as server:
        ours = _infer(server.address, images)
    np.testing.assert_allclose(theirs["probabilities"], ours["probabilities"], atol=1e-5)
    assert theirs["label"].reshape(-1).tolist() == ours["label"].tolist()
