"""Several versions of a model served at once (config.yaml ``version_policy``, Triton's).

Asserted on a real repository whose ViT and translator have two versions with different
weights: the policy picks the served versions (latest N, all, specific; the default the newest);
a request names its version or gets the newest; each version answers with its own weights (a
version served alone answers the same); metadata, config, index, statistics and /metrics list
and count each version; model control and polling apply a changed policy or a new version
folder; a policy naming a version the entry lacks fails to load with the cause; two frontend
processes route each version to its own model in the engine process. The policy's parser and
selection are checked against a reference (hypothesis).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import attnserve_cli
from benchmarks.repository_copy import rewrite_config
from contract.model_config import (
    MAX_SERVED_VERSIONS,
    AllVersions,
    LatestVersions,
    SpecificVersions,
    VersionPolicy,
    model_config_from_mapping,
    served_versions,
)
from contract.repository import read_model_config
from contract.schema import SchemaError, to_mapping
from export.exporter import export
from serving.client import AttnServeClient
from serving.kserve.tensors import decode_outputs, input_tensor
from serving.metrics import ServingMetrics
from serving.model_control import LocalModelControl
from serving.model_poll import RepositoryPoller
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as apb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from serving.repository import ModelRepository
from tests.reliability.harness import copy_repository, sample, scrape
from tests.repositories import FAST, tiny_sources
from tests.serving.frontends import two_frontends
from tests.serving.server_thread import ServerThread
from tests.serving.test_model_control import load, refused, unload

TIMEOUT = 60
Stub = pb_grpc.GRPCInferenceServiceStub
LATEST_2 = VersionPolicy(latest=LatestVersions(num_versions=2))
ALL = VersionPolicy(all=AllVersions())


def specific(*versions: int) -> VersionPolicy:
    return VersionPolicy(specific=SpecificVersions(versions=versions))


@pytest.fixture(scope="module")
def second_versions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny translator and ViT with other weights (seed 1), exported as version 2."""
    root = tmp_path_factory.mktemp("second_versions")
    for source in tiny_sources(seed=1):
        if source.kind in ("translator", "vit"):
            export(source, root, dataclasses.replace(FAST, version=2))
    return root


@pytest.fixture
def versioned(tiny_repository: Path, second_versions: Path, tmp_path: Path) -> Path:
    """The tiny repository with versions 1 and 2 of the translator and the ViT."""
    root = copy_repository(tiny_repository, tmp_path / "repository")
    for name in ("translator", "vit"):
        shutil.copytree(second_versions / name / "2", root / name / "2")
    return root


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)


def classify(stub: Stub, version: str, seed: int = 0) -> tuple[str, np.ndarray]:
    """The served version and the probabilities of a KServe ModelInfer for ``version``."""
    request = pb.ModelInferRequest(model_name="vit", model_version=version)
    header, raw = input_tensor("pixel_values", "FP32", image(seed))
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    return response.model_version, decode_outputs(response)["probabilities"]


def translate(stub: Stub, version: str) -> tuple[str, list[int]]:
    request = pb.ModelInferRequest(model_name="translator", model_version=version)
    header, raw = input_tensor("text", "BYTES", np.array([b"forty-two"], dtype=object))
    request.inputs.append(header)
    request.raw_input_contents.append(raw)
    request.parameters["target_language"].string_param = "de"
    request.parameters["max_new_tokens"].int64_param = 6
    request.parameters["min_new_tokens"].int64_param = 6
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    return response.model_version, list(decode_outputs(response)["token_ids"].ravel())


def versions(stub: Stub, name: str) -> list[str]:
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=TIMEOUT)
    return list(meta.versions)


@pytest.fixture
def both(versioned: Path) -> Iterator[tuple[ServerThread, Stub]]:
    """A server of the ViT with ``latest: {num_versions: 2}`` and the translator with the
    default policy, explicit model control."""
    rewrite_config(versioned / "vit", version_policy=LATEST_2)
    with (
        ServerThread(versioned, model_control_mode="explicit") as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        yield server, Stub(channel)


def test_each_served_version_answers_with_its_own_weights(
    both: tuple[ServerThread, Stub], versioned: Path
) -> None:
    server, stub = both
    assert versions(stub, "vit") == ["1", "2"]
    assert versions(stub, "translator") == ["2"]  # the default: the newest only
    config = stub.ModelConfig(pb.ModelConfigRequest(name="vit"), timeout=TIMEOUT).config
    assert config.version_policy.latest.num_versions == 2
    first, second, newest = classify(stub, "1"), classify(stub, "2"), classify(stub, "")
    assert (first[0], second[0], newest[0]) == ("1", "2", "2")
    assert not np.allclose(first[1], second[1])  # other weights
    np.testing.assert_array_equal(newest[1], second[1])
    for bad in ("3", "x", "01x", "9" * 5000):
        code, details = refused(classify, stub, bad)
        assert code == grpc.StatusCode.NOT_FOUND
        assert "it serves versions 1, 2: send one" in details and "leave the version" in details
    code, details = refused(translate, stub, "1")
    assert code == grpc.StatusCode.NOT_FOUND and "it serves version 2: send that" in details
    assert translate(stub, "")[0] == "2"

    # the attnserve API: the version asked for, and every version listed
    ours = apb_grpc.AttnServeStub(grpc.insecure_channel(server.address))
    png = _png()
    by_version = {
        v: ours.Classify(apb.ClassifyRequest(image=png, model_version=v), timeout=TIMEOUT)
        for v in ("1", "2")
    }
    assert [by_version[v].model_version for v in ("1", "2")] == ["1", "2"]
    assert by_version["1"].labels[0].score != by_version["2"].labels[0].score
    listed = ours.ListModels(apb.ListModelsRequest(), timeout=TIMEOUT).models
    assert [(m.version, tuple(m.versions)) for m in listed if m.name == "vit"] == [
        ("2", ("1", "2"))
    ]

    # the index lists both, READY; statistics and /metrics count each version apart
    reply = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=TIMEOUT)
    assert sorted((m.name, m.version, m.state) for m in reply.models if m.name == "vit") == [
        ("vit", "1", "READY"),
        ("vit", "2", "READY"),
    ]
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="vit"), timeout=TIMEOUT)
    counts = {s.version: s.inference_count for s in stats.model_stats}
    assert counts == {"1": 2, "2": 3}  # KServe 1 + attnserve 1; KServe 2 + attnserve 1
    one = stub.ModelStatistics(pb.ModelStatisticsRequest(name="vit", version="1"), timeout=TIMEOUT)
    assert [s.version for s in one.model_stats] == ["1"]
    metrics = scrape(server.metrics_url)
    ok = {"model": "vit", "method": "ModelInfer", "code": "OK"}
    assert sample(metrics, "attnserve_requests_total", **ok, version="1") == 1
    assert sample(metrics, "attnserve_requests_total", **ok, version="2") == 2
    missing = {"model": "unknown", "version": "", "method": "ModelInfer", "code": "NOT_FOUND"}
    assert sample(metrics, "attnserve_requests_total", **missing) == 5
    batches = "attnserve_batch_size_sum"
    assert sample(metrics, batches, model="vit", version="1", stage="classifier") == 2
    assert sample(metrics, batches, model="translator", version="2", stage="encoder") == 1


def test_the_client_and_the_cli_name_a_version(
    both: tuple[ServerThread, Stub], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = both
    png = _png()
    with AttnServeClient(server.address) as client:
        first, second = (client.classify(png, top_k=10, model_version=v) for v in ("1", "2"))
        assert [label.score for label in first] != [label.score for label in second]
        assert client.classify(png, top_k=10) == second
        assert client.translate(["forty-two"], "de", model_version="2", max_new_tokens=4)
    image = tmp_path / "digit.png"
    image.write_bytes(png)

    def cli(*args: str) -> tuple[int, str, str]:
        code = attnserve_cli.main(["classify", str(image), "--server", server.address, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    by_version = {v: cli("--model-version", v, "--top-k", "10") for v in ("1", "2")}
    assert by_version["1"][0] == by_version["2"][0] == 0
    assert by_version["1"][1] != by_version["2"][1]
    code, _, err = cli("--model-version", "3")
    assert code != 0 and "NOT_FOUND" in err and "it serves versions 1, 2" in err


def _png() -> bytes:
    """A 32x32 PNG (the attnserve API takes encoded images)."""
    pixels = (np.random.default_rng(3).random((32, 32, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_a_reload_applies_a_changed_policy(
    both: tuple[ServerThread, Stub], versioned: Path
) -> None:
    server, stub = both
    assert server.running is not None
    served = server.running.repository
    first = classify(stub, "1")[1]
    one = served.get("vit", "1")
    rewrite_config(versioned / "vit", version_policy=specific(1))
    load(stub, "vit")
    assert versions(stub, "vit") == ["1"]
    assert served.get("vit", "1") is one  # unchanged files and config: kept, as Triton keeps it
    version, alone = classify(stub, "")
    assert version == "1"
    np.testing.assert_array_equal(alone, first)  # version 1 served alone answers the same
    assert refused(classify, stub, "2")[0] == grpc.StatusCode.NOT_FOUND

    shutil.copytree(versioned / "vit" / "2", versioned / "vit" / "3")
    rewrite_config(versioned / "vit", version_policy=ALL)
    load(stub, "vit")
    assert versions(stub, "vit") == ["1", "2", "3"]
    np.testing.assert_array_equal(classify(stub, "3")[1], classify(stub, "2")[1])
    assert served.get("vit", "1") is one
    kept = stub.ModelConfig(pb.ModelConfigRequest(name="vit", version="1"), timeout=TIMEOUT)
    assert kept.config.version_policy.HasField("all")  # a kept version reports the new policy

    # a re-exported version is built again, the others kept
    two, three = served.get("vit", "2"), served.get("vit", "3")
    manifest = versioned / "vit" / "3" / "manifest.json"
    text = manifest.read_text()
    manifest.unlink()
    manifest.write_text(text)
    load(stub, "vit")
    assert served.get("vit", "1") is one and served.get("vit", "2") is two
    assert served.get("vit", "3") is not three
    # a load of an unchanged entry builds every version again (an explicit reload)
    three = served.get("vit", "3")
    load(stub, "vit")
    assert all(served.get("vit", v) is not m for v, m in (("1", one), ("2", two), ("3", three)))

    # a version the entry lacks: the load fails naming it, the served versions stay
    rewrite_config(versioned / "vit", version_policy=specific(1, 7))
    code, details = refused(load, stub, "vit")
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "version_policy.specific names version(s) [7]" in details
    assert "the versions loaded before stay served" in details
    assert versions(stub, "vit") == ["1", "2", "3"]

    unload(stub, "vit")
    for version in ("", "1", "3"):
        code, details = refused(classify, stub, version)
        assert code == grpc.StatusCode.NOT_FOUND and "not served (unloaded" in details
    assert server.running is not None
    assert [m.name for m in server.running.repository.models()] == ["captioner", "translator"]


def test_polling_serves_a_new_version_folder(versioned: Path) -> None:
    rewrite_config(versioned / "vit", version_policy=LATEST_2)

    async def scenario() -> None:
        repository = ModelRepository.load(versioned, ServingMetrics(), ("vit",))
        await repository.start()
        control = LocalModelControl(repository, grace=5)
        poller = RepositoryPoller(control, interval=60, names=("vit",))
        try:
            assert repository.versions("vit") == [1, 2]
            two = repository.get("vit", "2")
            shutil.copytree(versioned / "vit" / "2", versioned / "vit" / "3")
            assert await poller.look() == []  # seen changing: acted on at the next look
            assert await poller.look() == [("load", "vit")]
            assert repository.versions("vit") == [2, 3]
            assert repository.get("vit").version == 3
            assert repository.get("vit", "2") is two  # unchanged: kept
        finally:
            await poller.stop()
            await repository.stop(0)

    asyncio.run(scenario())


def test_two_frontends_route_each_version_to_its_model(versioned: Path) -> None:
    rewrite_config(versioned / "vit", version_policy=ALL)
    rewrite_config(versioned / "translator", version_policy=ALL)
    with two_frontends(versioned, models=("vit", "translator")) as (_server, stubs):
        answers = {v: [classify(stub, v, seed=5) for stub in stubs] for v in ("1", "2")}
        for version, replies in answers.items():
            assert {served for served, _ in replies} == {version}
            for _, probabilities in replies[1:]:
                np.testing.assert_array_equal(probabilities, replies[0][1])
        assert not np.allclose(answers["1"][0][1], answers["2"][0][1])
        tokens = {v: {tuple(translate(stub, v)[1]) for stub in stubs} for v in ("1", "2")}
        assert all(len(t) == 1 for t in tokens.values())  # each version answers alike
        assert [translate(stubs[0], v)[0] for v in ("1", "2", "")] == ["1", "2", "2"]
        stats = stubs[0].ModelStatistics(pb.ModelStatisticsRequest(name="vit"), timeout=TIMEOUT)
        assert {s.version: s.inference_count for s in stats.model_stats} == {
            "1": len(stubs),
            "2": len(stubs),
        }


# --- the policy -----------------------------------------------------------------------------------
def _config(policy: object) -> dict:
    config = yaml.safe_load(
        "name: v\nkind: classifier\nimage: {size: 32, mean: [0.5], std: [0.5]}\n"
    )
    config["version_policy"] = policy
    return config


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ({}, "set exactly one of"),
        ({"latest": {"num_versions": 1}, "all": {}}, "got latest, all"),
        ({"latest": {"num_versions": 0}}, "num_versions must be 1..16"),
        ({"latest": {"num_versions": 2.5}}, "num_versions: must be an integer"),
        ({"specific": {"versions": []}}, "versions must list 1..16"),
        ({"specific": {"versions": [1, 1]}}, "distinct numbers"),
        ({"specific": {"versions": [-1]}}, "distinct numbers"),
        ({"latest": 2}, "expected a mapping"),
        ({"newest": {}}, "unknown field(s) newest"),
        ("latest", "expected a mapping"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(policy: object, error: str) -> None:
    with pytest.raises(SchemaError, match="version_policy") as err:
        model_config_from_mapping(_config(policy))
    assert error in str(err.value)


policies = st.one_of(
    st.none(),
    st.integers(1, MAX_SERVED_VERSIONS).map(
        lambda n: VersionPolicy(latest=LatestVersions(num_versions=n))
    ),
    st.just(ALL),
    st.lists(st.integers(0, 30), min_size=1, max_size=MAX_SERVED_VERSIONS, unique=True).map(
        lambda v: specific(*v)
    ),
)


@given(
    policy=policies,
    available=st.lists(st.integers(0, 30), min_size=1, max_size=20, unique=True).map(sorted),
)
def test_the_policy_selects_as_triton(policy: VersionPolicy | None, available: list[int]) -> None:
    config = model_config_from_mapping(
        _config(None if policy is None else yaml.safe_load(yaml.safe_dump(to_mapping(policy))))
    )
    assert config.version_policy == policy  # written and read back alike
    if policy is not None and policy.specific is not None:
        wanted = set(policy.specific.versions)
        if not wanted <= set(available):
            with pytest.raises(ValueError, match="lacks"):
                served_versions(policy, available)
            return
        expected = sorted(wanted)
    elif policy is None:
        expected = available[-1:]
    elif policy.latest is not None:
        expected = available[-policy.latest.num_versions :]
    else:
        expected = available
    assert served_versions(policy, available) == expected


def test_an_export_of_a_new_version_keeps_the_entrys_policy(tmp_path: Path) -> None:
    vit = next(s for s in tiny_sources(seed=2) if s.kind == "vit")
    export(vit, tmp_path, FAST)
    rewrite_config(tmp_path / "vit", version_policy=LATEST_2)
    export(vit, tmp_path, dataclasses.replace(FAST, version=2))
    assert read_model_config(tmp_path / "vit").version_policy == LATEST_2
    repository = ModelRepository.load(tmp_path)
    assert repository.versions("vit") == [1, 2]
