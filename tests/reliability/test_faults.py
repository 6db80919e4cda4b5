"""A backend error in one batch of a live server fails that batch only.

The fault is injected into the real server: a method of a live object of one served model is
wrapped to raise once on a chosen call (a decoder step of a given width through the in-place
decoder's ``step_greedy`` or the backend's ``run``, whichever the model decodes with; an
encoder pass while others decode; a classifier batch); every other call runs the real graph.
tests/serving/test_engine.py covers the same property for an engine alone with a wrapped runner,
tests/serving/test_dynamic_batcher.py for a batcher with a fake batch function; here it goes
through gRPC, the servicers, the schedulers and the metrics. Asserted:

- exactly the requests of the failed graph call end INTERNAL, with a message naming the model
  and the cause;
- the requests that were not in it (waiting in the queue, decoding while another request's
  encoder failed, in other batches, on other models) and the requests after it succeed, with
  the same answers as before the fault;
- the health service still reports SERVING, the engines end with no rows left, and the server's
  request counter shows exactly the failed requests as INTERNAL.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contract.images import encode_png
from models.data import digits, shapes
from serving.backends.base import BackendError
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.fault_calls import TOKENS, classify, internal_count, stream, translate
from tests.reliability.harness import copy_repository, wait_until
from tests.serving.server_thread import ServerThread


class FaultOnce:
    """Wraps ``target.method`` on the live object: the first call that ``when(*args, calls)``
    picks raises ``error`` (calls counts earlier calls); every call ``slow_if(*args)`` picks
    first sleeps ``slow_s``; everything else runs for real."""

    def __init__(
        self,
        target: Any,
        method: str,
        when: Callable[..., bool],
        error: Exception,
        slow_s: float = 0.0,
        slow_if: Callable[..., bool] = lambda *args: True,
    ) -> None:
        self.target, self.method, self.when, self.error = target, method, when, error
        self.slow_s, self.slow_if = slow_s, slow_if  # slower steps keep sequences running longer
        self.real = getattr(target, method)
        self.calls = 0
        self.fired_rows = 0  # the batch width of the failed call
        self.fired = threading.Event()
        self.lock = threading.Lock()

    def call(self, *args: Any) -> Any:
        with self.lock:
            fire = not self.fired.is_set() and self.when(*args, self.calls)
            self.calls += 1
            if fire:
                self.fired_rows = rows_of(args)
                self.fired.set()
        if fire:
            raise self.error
        if self.slow_s and self.slow_if(*args):
            time.sleep(self.slow_s)
        return self.real(*args)

    def __enter__(self) -> FaultOnce:
        setattr(self.target, self.method, self.call)  # on the live object: the engine calls it next
        return self

    def __exit__(self, *exc: object) -> None:
        delattr(self.target, self.method)  # the class's own method again


def rows_of(args: tuple[Any, ...]) -> int:
    """The batch width of a ``run(graph, feeds)`` or ``step(input_ids, ...)`` call."""
    first = args[1] if isinstance(args[0], str) else args[0]
    array = next(iter(first.values())) if isinstance(first, Mapping) else first
    return int(array.shape[0])


def decoder_fault(
    server: ServerThread, when_rows: Callable[[int], bool], error: Exception, slow_s: float
) -> FaultOnce:
    """A fault on the translator's decoder steps, whichever KV cache it decodes with."""
    served = model(server, "translator")
    if served.kv_cache == "inplace":
        decoder = served.engine.cache.decoder
        return FaultOnce(
            decoder,
            "step_greedy" if decoder.greedy else "step",  # the requests here are all greedy
            lambda ids, *rest: when_rows(len(ids)),
            error,
            slow_s,
        )
    return FaultOnce(
        served.backend,
        "run",
        lambda graph, feeds, n: graph == "decoder" and when_rows(feeds["input_ids"].shape[0]),
        error,
        slow_s,
        slow_if=lambda graph, feeds: graph == "decoder",
    )


@pytest.fixture(scope="module")
def server(
    tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    root = copy_repository(
        tiny_repository,
        tmp_path_factory.mktemp("faults") / "repository",
        translator={"batching": {"max_active_sequences": 4, "max_batch_size": 4}},
        vit={"batching": {"max_batch_size": 4, "max_queue_delay_us": 50_000}},
    )
    with ServerThread(root) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[pb_grpc.AttnServeStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


def model(server: ServerThread, name: str) -> Any:
    assert server.running is not None
    return server.running.repository.get(name)


def assert_healthy(server: ServerThread, stub: pb_grpc.AttnServeStub) -> None:
    with grpc.insecure_channel(server.address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    for name in ("translator", "captioner"):
        engine = model(server, name).engine
        assert wait_until(lambda e=engine: e.active_rows == 0 and not e.sequences, timeout=10)


TEXTS = [f"{n} three hundred" for n in range(8)]


def test_a_failed_decoder_step_fails_its_batch_only(server: ServerThread, stub) -> None:
    """8 streams, 4 decode rows: the 5th step of the full batch fails; its 4 streams end
    INTERNAL, the 4 waiting ones, a caption stream and a classification meanwhile succeed."""
    reference = {text: translate(stub, text) for text in TEXTS}
    scene = encode_png(shapes.generate(1, seed=1, split="test")[0][0])
    caption_reference = list(stub.Caption(pb.CaptionRequest(image=scene), timeout=60).token_ids)
    digit = encode_png(digits.load_digits_split("test")[0][0])
    label_reference = classify(stub, digit)
    before = internal_count(server.metrics_url, "translator")
    full_steps = Counter()

    def fifth_full_step(rows: int) -> bool:
        if rows != 4:
            return False
        full_steps["decoder"] += 1
        return full_steps["decoder"] == 5  # every stream of the batch has sent a token or more

    fault = decoder_fault(
        server, fifth_full_step, BackendError("decoder graph failed: injected fault"), 0.005
    )
    with fault, concurrent.futures.ThreadPoolExecutor(10) as pool:
        streams = [pool.submit(stream, stub, text) for text in TEXTS]
        caption = pool.submit(
            lambda: list(stub.Caption(pb.CaptionRequest(image=scene), timeout=60).token_ids)
        )
        label = pool.submit(classify, stub, digit)
        outcomes = [f.result(timeout=90) for f in streams]
        assert caption.result(timeout=90) == caption_reference
        assert label.result(timeout=90) == label_reference
    assert fault.fired.is_set() and fault.fired_rows == 4
    failed = [o for o in outcomes if o[0] != "OK"]
    assert [o[0] for o in failed] == ["INTERNAL"] * 4, outcomes
    for _, tokens, details in failed:
        assert "translator" in details and "injected fault" in details, details
        assert 0 < len(tokens) < TOKENS  # it failed mid-stream, after the tokens it had
    for text, (code, tokens, _) in zip(TEXTS, outcomes, strict=True):
        if code == "OK":
            assert tokens == reference[text]
    assert internal_count(server.metrics_url, "translator") - before == 4
    assert_healthy(server, stub)
    assert {text: translate(stub, text) for text in TEXTS} == reference


def test_a_failed_encoder_pass_fails_its_joiners_only(server: ServerThread, stub) -> None:
    """Two streams decode; the next encoder pass (new joiners) fails: the joiners end INTERNAL,
    the two decoding streams go on to their end."""
    reference = {text: translate(stub, text) for text in TEXTS[:4]}
    before = internal_count(server.metrics_url, "translator")
    engine = model(server, "translator").engine
    armed = threading.Event()
    fault = FaultOnce(
        model(server, "translator").backend,
        "run",
        lambda graph, feeds, n: graph == "encoder" and armed.is_set(),
        BackendError("encoder graph failed: injected fault"),
    )
    # 30 slower steps (0.6 s) leave the joiners time enough to come.
    slow = decoder_fault(server, lambda rows: False, BackendError("unused"), slow_s=0.02)
    with slow, fault, concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(stream, stub, text) for text in TEXTS[:2]]
        assert wait_until(lambda: len(engine.sequences) == 2, timeout=30)
        armed.set()  # the next encoder pass is the joiners'
        joiners = [pool.submit(stream, stub, text) for text in TEXTS[2:4]]
        outcomes = [f.result(timeout=90) for f in running + joiners]
    assert fault.fired.is_set()
    assert [o[0] for o in outcomes[:2]] == ["OK", "OK"], outcomes
    assert [o[1] for o in outcomes[:2]] == [reference[t] for t in TEXTS[:2]]
    failed = [o for o in outcomes[2:] if o[0] != "OK"]
    assert len(failed) == fault.fired_rows and {o[0] for o in failed} == {"INTERNAL"}, outcomes
    assert all("injected fault" in details and not tokens for _, tokens, details in failed)
    assert internal_count(server.metrics_url, "translator") - before == len(failed)
    assert_healthy(server, stub)
    assert {text: translate(stub, text) for text in TEXTS[:4]} == reference


def test_a_failed_classifier_batch_fails_its_requests_only(server: ServerThread, stub) -> None:
    """The dynamic batcher's first batch of 2 or more raises (a non-backend error): its requests
    end INTERNAL, the other batches' requests get their labels."""
    images = [encode_png(image) for image in digits.load_digits_split("test")[0][:12]]
    reference = [classify(stub, image) for image in images]
    before = internal_count(server.metrics_url, "vit")
    fault = FaultOnce(
        model(server, "vit").backend,
        "run",
        lambda graph, feeds, n: feeds["pixel_values"].shape[0] >= 2,
        RuntimeError("injected fault: device lost"),
    )
    with fault, concurrent.futures.ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(lambda image: classify(stub, image), images, timeout=90))
    assert fault.fired.is_set()
    failed = [o for o in outcomes if o[0] != "OK"]
    assert len(failed) == fault.fired_rows >= 2 and {o[0] for o in failed} == {"INTERNAL"}
    assert all("vit" in details and "injected fault" in details for *_, details in failed)
    assert [o for o, r in zip(outcomes, reference, strict=True) if o[0] == "OK" and o != r] == []
    assert internal_count(server.metrics_url, "vit") - before == len(failed)
    assert_healthy(server, stub)
    assert [classify(stub, image) for image in images] == reference
