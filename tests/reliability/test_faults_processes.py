"""A backend error in the engine process of `attnserve serve --frontend-workers 2` fails that
batch only, and the frontends relay it with its status and message.

The same properties as test_faults.py, across processes. The fault is injected into the real
engine process without any hook in attnserve: the server runs with a ``sitecustomize.py`` on its
PYTHONPATH (every process of the server imports it at start) that wraps the in-place decoder's
``step`` and the ONNX Runtime backend's ``run`` to raise once when the test drops a trigger file
(``decoder``, ``encoder`` or ``classifier``) into a folder, and to slow decoder steps down by
10 ms so that streams are still running when the trigger lands. Every other call runs the real
graph. Asserted: the requests of the failed call end INTERNAL with a message naming the model and
the cause, the others (waiting, decoding, other models) get their undisturbed answers, health
stays SERVING, /metrics (summed over the processes) counts exactly the failed requests as
INTERNAL, and no decode rows are left.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contract.images import encode_png
from models.data import digits
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.fault_calls import TOKENS, classify, internal_count, stream, translate
from tests.reliability.harness import ServeProcess, copy_repository, sample, scrape, wait_until

TEXTS = [f"{n} three hundred" for n in range(6)]

SITECUSTOMIZE = """
import os
import time
from pathlib import Path

_TRIGGERS = Path(os.environ["ATTNSERVE_TEST_FAULTS"])


def _armed(name):
    try:
        (_TRIGGERS / name).unlink()  # the first call that finds the file fires
        return True
    except FileNotFoundError:
        return False


def _install():
    from serving.backends import onnxruntime, onnxruntime_io
    from serving.backends.base import BackendError

    decoder = onnxruntime_io.InPlaceDecoder
    steps = {"step": decoder.step, "step_greedy": decoder.step_greedy}
    run = onnxruntime.OnnxRuntimeBackend.run

    def faulty(name):
        def faulty_step(self, *args, **kwargs):
            time.sleep(0.01)
            if _armed("decoder"):
                raise BackendError("decoder graph failed: injected fault")
            return steps[name](self, *args, **kwargs)

        return faulty_step

    def faulty_run(self, graph, feeds):
        if graph == "encoder" and _armed("encoder"):
            raise BackendError("encoder graph failed: injected fault")
        if graph == "model" and _armed("classifier"):
            raise RuntimeError("injected fault: device lost")
        return run(self, graph, feeds)

    for name in steps:
        setattr(decoder, name, faulty(name))
    onnxruntime.OnnxRuntimeBackend.run = faulty_run


_install()
"""


@pytest.fixture(scope="module")
def triggers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault-triggers")


@pytest.fixture(scope="module")
def server(
    tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory, triggers: Path
) -> Iterator[ServeProcess]:
    root = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("faults-processes") / "repository",
        translator={"batching": {"max_active_sequences": 4, "max_batch_size": 4}},
    )
    site = tmp_path_factory.mktemp("fault-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    process = ServeProcess(root, "--metrics-port", "0", "--frontend-workers", "2", grace=2)
    with pytest.MonkeyPatch.context() as patch:  # the server's processes inherit these
        patch.setenv("PYTHONPATH", path)
        patch.setenv("ATTNSERVE_TEST_FAULTS", str(triggers))
        process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def stub(server: ServeProcess) -> Iterator[pb_grpc.AttnServeStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


def assert_healthy(server: ServeProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    assert wait_until(
        lambda: sample(scrape(server.metrics_url), "attnserve_active_sequences") == 0, timeout=10
    )


def arm(triggers: Path, name: str) -> None:
    (triggers / name).touch()


def fired(triggers: Path, name: str) -> bool:
    return not (triggers / name).exists()


def test_a_failed_decoder_step_fails_its_batch_only(
    server: ServeProcess, stub: pb_grpc.AttnServeStub, triggers: Path
) -> None:
    """6 streams, 4 decode rows: once the 4 running ones have sent tokens a decoder step fails;
    those 4 end INTERNAL mid-stream, the 2 waiting ones and a classification succeed."""
    reference = {text: translate(stub, text) for text in TEXTS}
    digit = encode_png(digits.load_digits_split("test")[0][0])
    label_reference = classify(stub, digit)
    before = internal_count(server.metrics_url, "translator")
    started = [threading.Event() for _ in TEXTS]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, stub, t, e) for t, e in zip(TEXTS, started, strict=True)]
        assert wait_until(lambda: sum(e.is_set() for e in started) >= 4, timeout=30)
        arm(triggers, "decoder")
        label = pool.submit(classify, stub, digit)
        outcomes = [f.result(timeout=90) for f in streams]
        assert label.result(timeout=90) == label_reference
    assert fired(triggers, "decoder")
    failed = [o for o in outcomes if o[0] != "OK"]
    assert [o[0] for o in failed] == ["INTERNAL"] * 4, outcomes
    for _, tokens, details in failed:
        assert "translator" in details and "injected fault" in details, details
        assert 0 < len(tokens) < TOKENS
    for text, (code, tokens, _) in zip(TEXTS, outcomes, strict=True):
        if code == "OK":
            assert tokens == reference[text]
    assert internal_count(server.metrics_url, "translator") - before == 4
    assert_healthy(server)
    assert {text: translate(stub, text) for text in TEXTS} == reference


def test_a_failed_encoder_pass_fails_its_joiners_only(
    server: ServeProcess, stub: pb_grpc.AttnServeStub, triggers: Path
) -> None:
    """Two streams decode; the next encoder pass (two joiners) fails: the joiners end INTERNAL
    with no tokens, the two decoding streams go on to their end."""
    reference = {text: translate(stub, text) for text in TEXTS[:4]}
    before = internal_count(server.metrics_url, "translator")
    started = [threading.Event(), threading.Event()]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(stream, stub, t, e) for t, e in zip(TEXTS, started, strict=False)]
        assert wait_until(lambda: all(e.is_set() for e in started), timeout=30)
        arm(triggers, "encoder")
        joiners = [pool.submit(stream, stub, text) for text in TEXTS[2:4]]
        outcomes = [f.result(timeout=90) for f in running + joiners]
    assert fired(triggers, "encoder")
    assert [o[0] for o in outcomes[:2]] == ["OK", "OK"], outcomes
    assert [o[1] for o in outcomes[:2]] == [reference[t] for t in TEXTS[:2]]
    failed = [o for o in outcomes[2:] if o[0] != "OK"]
    assert failed and {o[0] for o in failed} == {"INTERNAL"}, outcomes
    assert all("injected fault" in details and not tokens for _, tokens, details in failed)
    assert internal_count(server.metrics_url, "translator") - before == len(failed)
    assert_healthy(server)
    assert {text: translate(stub, text) for text in TEXTS[:4]} == reference


def test_a_failed_classifier_batch_fails_its_requests_only(
    server: ServeProcess, stub: pb_grpc.AttnServeStub, triggers: Path
) -> None:
    """The ViT's next batch raises a non-backend error: its request ends INTERNAL with the
    cause, the next one gets its label."""
    image = encode_png(digits.load_digits_split("test")[0][1])
    reference = classify(stub, image)
    before = internal_count(server.metrics_url, "vit")
    arm(triggers, "classifier")
    code, _, details = classify(stub, image)
    assert fired(triggers, "classifier")
    assert code == "INTERNAL" and "vit" in details and "injected fault" in details, details
    assert internal_count(server.metrics_url, "vit") - before == 1
    assert_healthy(server)
    assert classify(stub, image) == reference
