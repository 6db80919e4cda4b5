"""The Triton peer of `attnserve bench serve` for real: PyTriton's tritonserver serving a ViT
entry answers the same KServe request as attnserve with the same probabilities (same ONNX
model, same preprocessing), and stops on SIGTERM. It needs a Python with nvidia-pytriton (numpy
< 2, so not this virtual environment): set ATTNSERVE_TRITON_PYTHON to one (the benchmark's
cache holds one after a full `attnserve bench serve`); without it the test skips."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

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


def vit_repository(tiny_repository: Path, root: Path, instances: int) -> Path:
    """A repository with the tiny ViT whose config has ``batching.instances``."""
    shutil.copytree(tiny_repository / "vit", root / "vit")
    path = root / "vit" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config.setdefault("batching", {})["instances"] = instances
    path.write_text(yaml.safe_dump(config))
    return root


@pytest.mark.skipif(not PYTHON, reason="set ATTNSERVE_TRITON_PYTHON to a Python with PyTriton")
@pytest.mark.parametrize("instances", [1, 2])
def test_triton_peer_answers_like_attnserve(
    tiny_repository: Path, tmp_path: Path, instances: int
) -> None:
    """Also with the entry's ``batching.instances`` 2: Triton gets two model instances, and
    attnserve runs two batches at once."""
    try:
        python = peer_python(tmp_path, Path(PYTHON or ""))
    except PeerUnavailable as err:
        pytest.fail(str(err))
    repository = vit_repository(tiny_repository, tmp_path / "repo", instances)
    images = digits.load_digits_split("test")[0][:3]
    peer = TritonPeer(python, vit_spec(repository / "vit", threads=2))
    with peer:
        theirs = _infer(peer.address, images)
        with grpc.insecure_channel(peer.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="vit"), timeout=30)
            config = stub.ModelConfig(pb.ModelConfigRequest(name="vit"), timeout=30).config
        pid = peer.process.pid
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [
        ("image", "UINT8", [-1, 32, 32, 3])
    ]
    assert sum(group.count for group in config.instance_group) == instances
    assert peer.process.returncode is not None
    assert session_processes(pid) == []  # tritonserver and the backend stub went with it
    with ServerThread(repository, metrics_port=-1) as server:
        ours = _infer(server.address, images)
    np.testing.assert_allclose(theirs["probabilities"], ours["probabilities"], atol=1e-5)
    assert theirs["label"].reshape(-1).tolist() == ours["label"].tolist()
