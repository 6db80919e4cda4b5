"""The fuzz checker: hypothesis profiles, each test's share of the example budget
(``ATTNSERVE_FUZZ_EXAMPLES``), and :class:`Fuzz`, the server's clients with the verdict of every
case and the liveness checks (see the package docstring)."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, settings

from benchmarks.server_process import ServeProcess
from contract.images import encode_png, pixel_values
from models.data import digits, shapes
from serving.kserve.tensors import decode_outputs
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from tests.reliability.harness import CLIENT_ERRORS, says_what_to_fix
from tests.serving.server_thread import ServerThread

# --- profiles and budgets -------------------------------------------------------------------------
CI_EXAMPLES = 2400
settings.register_profile(
    "attnserve-ci",
    deadline=None,
    derandomize=True,  # the same cases on every CI run; `make fuzz` explores new ones
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "attnserve-fuzz",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "attnserve-fuzz" if os.environ.get("ATTNSERVE_FUZZ_EXAMPLES") else "attnserve-ci"
)
if PROFILE not in ("attnserve-ci", "attnserve-fuzz"):  # someone else's profile name
    PROFILE = "attnserve-ci"
TOTAL_EXAMPLES = int(os.environ.get("ATTNSERVE_FUZZ_EXAMPLES") or CI_EXAMPLES)
WEIGHTS = {  # share of the examples each test gets
    "raw_bytes": 16,
    "translate": 14,
    "images": 14,
    "score": 8,
    "kserve_infer": 20,
    "kserve_tensors": 12,
    "kserve_stream": 6,
    "metadata": 12,
}
CALL_TIMEOUT = 15.0  # seconds: a call that takes longer is a hang
CHECK_EVERY = 100  # cases between two checks that good requests still get the right answer
ALLOWED = CLIENT_ERRORS | {grpc.StatusCode.OK}
NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def budget(test: str) -> settings:
    """The hypothesis settings of one fuzz test: its share of the examples, the profile's rest."""
    share = max(10, round(TOTAL_EXAMPLES * WEIGHTS[test] / sum(WEIGHTS.values())))
    return settings(settings.get_profile(PROFILE), max_examples=share)


# --- the server, the channel, the reference answers -----------------------------------------------
@dataclass
class Fuzz:
    """The fuzz server and its clients, the reference answers and the case counters."""

    server: ServerThread | ServeProcess  # one process, or frontends in front of an engine
    channel: grpc.Channel
    stub: pb_grpc.AttnServeStub
    kserve: kpb_grpc.GRPCInferenceServiceStub
    health: health_pb2_grpc.HealthStub
    reference: dict[str, Any] = field(default_factory=dict)
    cases: collections.Counter[str] = field(default_factory=collections.Counter)
    codes: collections.Counter[str] = field(default_factory=collections.Counter)
    checks: int = 0
    slowest: list[tuple[float, str]] = field(default_factory=list)
    last_elapsed: float = 0.0

    # --- raw calls ----------------------------------------------------------------------------
    def raw(self, method: str, shape: str) -> Callable[..., Any]:
        """A callable sending bytes as they are (the server must parse them)."""
        factory = {
            "uu": self.channel.unary_unary,
            "us": self.channel.unary_stream,
            "ss": self.channel.stream_stream,
        }[shape]
        return factory(method, request_serializer=None, response_deserializer=None)

    # --- outcomes -----------------------------------------------------------------------------
    def call(self, fn: Callable[[float], Any]) -> tuple[grpc.StatusCode, str, Any]:
        """Run ``fn(timeout)``; (status, details, result) and the no-hang check."""
        started = time.monotonic()
        try:
            result = fn(CALL_TIMEOUT)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            code, details, result = err.code(), err.details() or "", None
        elapsed = time.monotonic() - started
        self.last_elapsed = elapsed
        assert code != grpc.StatusCode.DEADLINE_EXCEEDED or elapsed < CALL_TIMEOUT * 0.9, (
            f"the call hung: no answer within {CALL_TIMEOUT} s"
        )
        return code, details, result

    def check(
        self,
        test: str,
        code: grpc.StatusCode,
        details: str,
        allowed: frozenset[grpc.StatusCode] | set[grpc.StatusCode] = ALLOWED,
        what: Any = "",
    ) -> None:
        """One case's verdict (see the package docstring); every CHECK_EVERY cases, liveness."""
        self.cases[test] += 1
        self.slowest = sorted([*self.slowest, (self.last_elapsed, f"{test}: {str(what)[:160]}")])[
            -5:
        ]
        self.codes[code.name] += 1
        where = f"{test}: {str(what)[:300]}"
        assert code not in NEVER, f"{where} -> {code.name}: {details}"
        assert code in allowed, (
            f"{where} -> {code.name} (allowed {sorted(c.name for c in allowed)})"
        )
        if code != grpc.StatusCode.OK:
            assert says_what_to_fix(details), (
                f"{where} -> {code.name} with a poor message {details!r}"
            )
        if sum(self.cases.values()) % CHECK_EVERY == 0:
            self.assert_still_correct()

    # --- liveness -----------------------------------------------------------------------------
    def answers(self) -> dict[str, Any]:
        """The answers of a fixed set of good requests."""
        good = self.reference_requests
        translate = self.stub.Translate(good["translate"], timeout=CALL_TIMEOUT)
        streamed = list(self.stub.TranslateStream(good["stream"], timeout=CALL_TIMEOUT))
        caption = self.stub.Caption(good["caption"], timeout=CALL_TIMEOUT)
        classify = self.stub.Classify(good["classify"], timeout=CALL_TIMEOUT)
        infer = self.kserve.ModelInfer(good["infer"], timeout=CALL_TIMEOUT)
        return {
            "translate": [list(t.token_ids) for t in translate.translations],
            "stream": [i for m in streamed for i in m.token_ids],
            "caption": list(caption.token_ids),
            "classify": [(s.label, round(s.score, 4)) for s in classify.labels],
            "infer": decode_outputs(infer)["probabilities"],
        }

    def assert_still_correct(self) -> None:
        self.checks += 1
        now = self.answers()
        for key, expected in self.reference.items():
            if key == "infer":
                np.testing.assert_allclose(now[key], expected, atol=1e-5, err_msg=key)
            else:
                assert now[key] == expected, f"{key}: {now[key]} != {expected}"
        assert self.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == (
            health_pb2.HealthCheckResponse.SERVING
        )

    @property
    def reference_requests(self) -> dict[str, Any]:
        options = pb.DecodingOptions(max_new_tokens=10, min_new_tokens=10)
        digit = encode_png(digits.load_digits_split("test")[0][0])
        scene = encode_png(shapes.generate(1, seed=5, split="test")[0][0])
        pixels = pixel_values(digits.load_digits_split("test")[0][:2])
        infer = kpb.ModelInferRequest(model_name="vit")
        infer.inputs.add(name="pixel_values", datatype="FP32", shape=[2, 3, 32, 32])
        infer.raw_input_contents.append(pixels.astype("<f4").tobytes())
        return {
            "translate": pb.TranslateRequest(
                texts=["three hundred and twelve", "doce"], target_language="de", options=options
            ),
            "stream": pb.TranslateStreamRequest(
                text="trois cent douze", target_language="es", options=options
            ),
            "caption": pb.CaptionRequest(image=scene, options=options),
            "classify": pb.ClassifyRequest(image=digit, top_k=3),
            "infer": infer,
        }


def check_stream_response(fuzz: Fuzz, response: kpb.ModelStreamInferResponse) -> None:
    if response.error_message:
        code, _, message = response.error_message.partition(": ")
        fuzz.codes[f"stream:{code}"] += 1
        assert code not in ("UNKNOWN", "INTERNAL"), response.error_message
        assert code in {c.name for c in ALLOWED | {grpc.StatusCode.DEADLINE_EXCEEDED}}, code
        assert says_what_to_fix(message), f"poor message {response.error_message!r}"
    else:
        carried_outputs(response.infer_response)


def carried_outputs(response: kpb.ModelInferResponse) -> dict[str, Any]:
    """The outputs a response carries, decoded (well-formed tensors): an output written to a
    shared memory region has an empty raw entry instead, which is checked and left out."""
    carried = kpb.ModelInferResponse()
    carried.CopyFrom(response)
    del carried.outputs[:], carried.raw_output_contents[:]
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        if "shared_memory_region" in output.parameters:
            assert raw == b"", output.name
        else:
            carried.outputs.append(output)
            carried.raw_output_contents.append(raw)
    return decode_outputs(carried)
