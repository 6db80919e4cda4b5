"""Property-based fuzzing of every RPC of a real server (grpc.aio on loopback, ONNX Runtime).

Every case sends one request (or one stream) that hypothesis built: random or mutated protobuf
bytes, wrong KServe datatypes / shapes / byte lengths, broken BYTES length prefixes, corrupt,
truncated or huge images, empty and over-long texts, unknown or path-like model names, absurd
decoding options. Each case asserts:

- the call ends within ``CALL_TIMEOUT`` (no hang);
- its status is in the set allowed for that kind of input (OK when the input happens to be
  valid), never UNKNOWN or INTERNAL;
- an error's details are a human message that says what to fix;
- every ``CHECK_EVERY`` cases, and at the end of each test, good requests still get the answers
  computed once at the start (same tokens, same labels).

Case counts: ``ATTNSERVE_FUZZ_EXAMPLES`` (default 2,400 in CI) is shared among the tests by weight;
``make fuzz`` runs 12,000 with the ``attnserve-fuzz`` profile (random seeds, hypothesis database).
``HYPOTHESIS_PROFILE=attnserve-fuzz`` picks the profile alone. A JSON summary (cases per test,
status codes seen) is written to ``fuzz_summary.json`` in pytest's base temp directory (and to
``$ATTNSERVE_FUZZ_SUMMARY`` when set) and printed (``-s`` shows it).
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from models.data import digits, shapes
from models.data.images import encode_png, pixel_values
from serving.kserve_tensors import DATATYPES, NUMERIC_DTYPES, decode_outputs, encode_bytes
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from tests.reliability.harness import BIG_MESSAGES, CLIENT_ERRORS, says_what_to_fix
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
    """The module's server and clients, the reference answers and the case counters."""

    server: ServerThread
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
        """One case's verdict (see the module docstring); every CHECK_EVERY cases, liveness."""
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


@pytest.fixture(scope="module")
def fuzz(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    started = time.monotonic()
    with ServerThread(tiny_repository, metrics_port=-1) as server:
        channel = grpc.insecure_channel(server.address, options=BIG_MESSAGES)
        state = Fuzz(
            server,
            channel,
            pb_grpc.AttnServeStub(channel),
            kpb_grpc.GRPCInferenceServiceStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )
        state.reference = state.answers()
        state.assert_still_correct()  # deterministic, or the checks would mean nothing
        yield state
        state.assert_still_correct()
        channel.close()
    summary = {
        "profile": PROFILE,
        "examples_budget": TOTAL_EXAMPLES,
        "cases": sum(state.cases.values()),
        "cases_per_test": dict(state.cases),
        "status_codes": dict(state.codes),
        "liveness_checks": state.checks,
        "slowest_calls": [(round(s, 3), what) for s, what in reversed(state.slowest)],
        "seconds": round(time.monotonic() - started, 1),
    }
    text = json.dumps(summary, indent=2)
    (tmp_path_factory.getbasetemp() / "fuzz_summary.json").write_text(text)
    if os.environ.get("ATTNSERVE_FUZZ_SUMMARY"):
        Path(os.environ["ATTNSERVE_FUZZ_SUMMARY"]).write_text(text)
    print(f"\nfuzz summary: {text}")


# --- strategies -----------------------------------------------------------------------------------
EDGE_INTS = [0, 1, -1, 2, 7, 8, 9, 31, 32, 33, 64, 65, 10**9, 2**31 - 1, -(2**31)]
EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.0,
    0.5,
    1e-45,
    1e9,
    100.0,
    100.5,
    math.nan,
    math.inf,
    -math.inf,
]
int32s = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**31), 2**31 - 1))
small_ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-3, 40))
float32s = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(width=32), st.floats(-2, 3, width=32))
MODEL_NAMES = [
    "",
    "translator",
    "captioner",
    "vit",
    "unknown",
    "../translator",
    "translator/../vit",
    "/etc/passwd",
    "../../../../etc/passwd",
    "vit/1/model.onnx",
    "TRANSLATOR",
    "translator ",
    "translator\x00",
    "%s%n%x",
    "${jndi:ldap://x}",
    "v" * 5000,
]
model_names = st.one_of(st.sampled_from(MODEL_NAMES), st.text(max_size=12))
VERSIONS = ["", "1", "2", "0", "-1", "01", "1.0", "latest", "99999999999999999999", "1 "]
versions = st.one_of(st.sampled_from(VERSIONS), st.text(max_size=6))
LANGUAGES = ["de", "fr", "es", "", "xx", "DE", " de", "de ", "<2de>", "../../etc/passwd", "de\x00"]
languages = st.one_of(st.sampled_from(LANGUAGES), st.text(max_size=8))
TEXTS = [
    "three hundred and twelve",
    "doce",
    "",
    " ",
    "\n\t",
    "\x00",
    "<2de>",
    "<pad></s><unk><s>",
    "🙂" * 40,
    "e\u0301" * 30,
    "five " * 40,  # over the source limit
    "x" * 300,
]
texts = st.one_of(st.sampled_from(TEXTS), st.text(max_size=80))


@st.composite
def decoding_options(draw: st.DrawFn) -> pb.DecodingOptions:
    """Options with any subset of fields set to edge, random or absurd values."""
    options = pb.DecodingOptions()
    if draw(st.booleans()):
        return options  # defaults: the common case
    for name, values in (
        ("max_new_tokens", small_ints),
        ("min_new_tokens", small_ints),
        ("beam_size", small_ints),
        ("top_k", int32s),
        ("num_alternatives", small_ints),
        ("length_penalty", float32s),
        ("temperature", float32s),
        ("top_p", float32s),
        ("seed", st.integers(0, 2**64 - 1)),
    ):
        if draw(st.integers(0, 3)) == 0:
            setattr(options, name, draw(values))
    return options


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_claiming(width: int, height: int, idat: bytes | None = b"", depth: int = 8) -> bytes:
    """A PNG whose (valid, CRC-correct) header claims ``width`` x ``height`` RGB pixels."""
    header = struct.pack(">IIBBBBB", width, height, depth, 2, 0, 0, 0)
    body = _png_chunk(b"IHDR", header)
    if idat is not None:
        body += _png_chunk(b"IDAT", idat)
    return b"\x89PNG\r\n\x1a\n" + body + _png_chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A JPEG start of frame claiming ``width`` x ``height``, with no scan data."""
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof + b"\xff\xd9"


def _encode(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def _image_pool() -> list[bytes]:
    """Valid images of many sizes, modes and formats (some not PNG / JPEG)."""
    rng = np.random.default_rng(0)
    pool = []
    for size in [(1, 1), (3, 7), (32, 32), (48, 48), (64, 17), (200, 3)]:
        rgb = Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8))
        for mode in ("RGB", "L", "RGBA", "P", "1", "LA", "I;16"):
            image = rgb.convert(mode) if mode != "I;16" else rgb.convert("L").convert("I;16")
            pool.append(_encode(image, "PNG"))
        pool.append(_encode(rgb.convert("F"), "TIFF"))
        pool.append(_encode(rgb, "JPEG", quality=50))
        pool.append(_encode(rgb.convert("L"), "JPEG"))
        pool.append(_encode(rgb.convert("CMYK"), "JPEG"))
        pool.append(_encode(rgb, "JPEG", progressive=True))
        pool.append(_encode(rgb, "GIF"))
        pool.append(_encode(rgb, "BMP"))
        pool.append(_encode(rgb, "WEBP"))
    return pool


IMAGE_POOL = _image_pool()
CRAFTED_IMAGES = [
    png_claiming(100_000, 100_000),
    png_claiming(100_000, 100_000, None),
    png_claiming(2**31 - 1, 1),
    png_claiming(0, 0),
    png_claiming(1, 2**31 - 1, zlib.compress(b"\x00" * 64)),
    png_claiming(4097, 1, zlib.compress(b"\x00" * (1 + 3 * 4097))),
    png_claiming(4000, 4000, zlib.compress(b"\x00" * 1000)),  # truncated pixel data
    png_claiming(16, 16, zlib.compress(b"\x00" * (1 + 48) * 16), depth=16),
    png_claiming(16, 16, b"not zlib at all"),
    jpeg_claiming(65535, 65535),
    jpeg_claiming(4000, 4000),
    jpeg_claiming(0, 0),
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"GIF89a",
    b"\x00",
    b"",
]


@st.composite
def images(draw: st.DrawFn) -> bytes:
    """Encoded images: valid, crafted, truncated, bit-flipped, spliced or random."""
    kind = draw(st.sampled_from(["valid", "crafted", "truncate", "flip", "splice", "random"]))
    if kind == "crafted":
        return draw(st.sampled_from(CRAFTED_IMAGES))
    if kind == "random":
        prefix = draw(st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"BM"]))
        return prefix + draw(st.binary(max_size=300))
    data = bytearray(draw(st.sampled_from(IMAGE_POOL)))
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data)))])
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, len(data) - 1))
            data[position] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "splice":
        position = draw(st.integers(0, len(data)))
        return bytes(data[:position]) + draw(st.binary(max_size=64)) + bytes(data[position:])
    return bytes(data)


# --- 1. raw protobuf bytes to every method --------------------------------------------------------
GOOD_MESSAGES = [
    pb.TranslateRequest(texts=["three hundred"], target_language="de").SerializeToString(),
    pb.TranslateStreamRequest(text="doce", target_language="fr").SerializeToString(),
    pb.CaptionRequest(image=IMAGE_POOL[0]).SerializeToString(),
    pb.ClassifyRequest(image=IMAGE_POOL[0], top_k=2).SerializeToString(),
    pb.GetModelRequest(name="vit").SerializeToString(),
    kpb.ModelInferRequest(
        model_name="translator",
        inputs=[kpb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])],
        raw_input_contents=[encode_bytes([b"doce"])],
        parameters={"target_language": kpb.InferParameter(string_param="de")},
    ).SerializeToString(),
    kpb.ModelMetadataRequest(name="vit").SerializeToString(),
]
METHODS = [  # (method, shape): uu unary-unary, us unary-stream, ss stream-stream
    ("/attnserve.v1.AttnServe/Translate", "uu"),
    ("/attnserve.v1.AttnServe/TranslateStream", "us"),
    ("/attnserve.v1.AttnServe/Caption", "uu"),
    ("/attnserve.v1.AttnServe/CaptionStream", "us"),
    ("/attnserve.v1.AttnServe/Classify", "uu"),
    ("/attnserve.v1.AttnServe/ListModels", "uu"),
    ("/attnserve.v1.AttnServe/GetModel", "uu"),
    ("/inference.GRPCInferenceService/ServerLive", "uu"),
    ("/inference.GRPCInferenceService/ServerReady", "uu"),
    ("/inference.GRPCInferenceService/ModelReady", "uu"),
    ("/inference.GRPCInferenceService/ServerMetadata", "uu"),
    ("/inference.GRPCInferenceService/ModelMetadata", "uu"),
    ("/inference.GRPCInferenceService/ModelConfig", "uu"),
    ("/inference.GRPCInferenceService/ModelInfer", "uu"),
    ("/inference.GRPCInferenceService/ModelStreamInfer", "ss"),
    ("/grpc.health.v1.Health/Check", "uu"),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "ss"),
]


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid message (of any method) truncated, flipped or extended."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    data = bytearray(draw(st.sampled_from(GOOD_MESSAGES)))
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.sampled_from(["cut", "flip", "insert"]))
        position = draw(st.integers(0, len(data)))
        if action == "cut":
            del data[position:]
        elif action == "flip" and position < len(data):
            data[position] = draw(st.integers(0, 255))
        else:
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def test_fuzz_raw_bytes_to_every_method(fuzz: Fuzz) -> None:
    @budget("raw_bytes")
    @given(method=st.sampled_from(METHODS), messages=st.lists(payloads(), min_size=1, max_size=3))
    @example(method=METHODS[0], messages=[b"\xff\xff\xff"])
    @example(method=METHODS[14], messages=[b"\x0a", b""])
    @example(method=METHODS[16], messages=[b"\x0a\x05\xff\xfe\xfd\xfc\xfb"])
    def run(method: tuple[str, str], messages: list[bytes]) -> None:
        name, shape = method
        call = fuzz.raw(name, shape)
        if shape == "uu":
            outcome = fuzz.call(lambda t: call(messages[0], timeout=t))
        elif shape == "us":
            outcome = fuzz.call(lambda t: list(call(messages[0], timeout=t)))
        else:
            outcome = fuzz.call(lambda t: list(call(iter(messages), timeout=t)))
        code, details, result = outcome
        fuzz.check("raw_bytes", code, details, what=(name, messages))
        if name.endswith("ModelStreamInfer") and code == grpc.StatusCode.OK:
            for raw in result:
                check_stream_response(fuzz, kpb.ModelStreamInferResponse.FromString(raw))

    run()
    fuzz.assert_still_correct()


# --- 2. attnserve.v1 translation with any texts, languages, models and options --------------------
def check_translation(request: Any, response: Any, unary: bool) -> None:
    """A successful answer is well formed: one translation per text, tokens within the limit."""
    limit = request.options.max_new_tokens if request.options.max_new_tokens > 0 else 32
    if unary:
        assert len(response.translations) == len(request.texts)
        for translation in response.translations:
            assert len(translation.token_ids) <= limit
            assert translation.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    else:
        assert response and response[-1].finish_reason in (
            pb.FINISH_REASON_STOP,
            pb.FINISH_REASON_LENGTH,
        )
        seen = 0  # a message may carry several tokens; its index is that of its first
        for message in response:
            if message.token_ids:
                assert message.index == seen
                seen += len(message.token_ids)
        assert seen <= limit


def test_fuzz_translate(fuzz: Fuzz) -> None:
    @budget("translate")
    @given(
        stream=st.booleans(),
        many=st.one_of(
            st.lists(texts, max_size=4), st.lists(st.just("five"), min_size=33, max_size=40)
        ),
        language=languages,
        model=st.one_of(st.just(""), st.just("translator"), model_names),
        version=st.one_of(st.just(""), versions),
        options=decoding_options(),
    )
    @example(False, ["x" * 4_000_000], "de", "", "", pb.DecodingOptions())  # 4 MB of text
    @example(True, ["five " * 800_000], "de", "", "", pb.DecodingOptions())
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(beam_size=10**9))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(max_new_tokens=10**9))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=math.nan))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=-1))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=math.inf))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(top_p=2))
    @example(True, ["five"], "de", "", "", pb.DecodingOptions(top_k=2**31 - 1, temperature=1))
    @example(True, ["five"], "de", "", "", pb.DecodingOptions(seed=2**64 - 1, temperature=99))
    @example(False, ["five"] * 4, "de", "", "", pb.DecodingOptions(beam_size=8, num_alternatives=7))
    def run(
        stream: bool,
        many: list[str],
        language: str,
        model: str,
        version: str,
        options: pb.DecodingOptions,
    ) -> None:
        if stream:
            request = pb.TranslateStreamRequest(
                text=many[0] if many else "",
                target_language=language,
                model=model,
                model_version=version,
                options=options,
            )
            code, details, result = fuzz.call(
                lambda t: list(fuzz.stub.TranslateStream(request, timeout=t))
            )
        else:
            request = pb.TranslateRequest(
                texts=many,
                target_language=language,
                model=model,
                model_version=version,
                options=options,
            )
            code, details, result = fuzz.call(lambda t: fuzz.stub.Translate(request, timeout=t))
        fuzz.check("translate", code, details, what=request)
        if code == grpc.StatusCode.OK:
            check_translation(request, result, unary=not stream)

    run()
    fuzz.assert_still_correct()


# --- 3. images: Caption, CaptionStream, Classify --------------------------------------------------
def test_fuzz_images(fuzz: Fuzz) -> None:
    @budget("images")
    @given(
        method=st.sampled_from(["Caption", "CaptionStream", "Classify"]),
        image=images(),
        model=st.one_of(st.just(""), st.just(""), model_names),
        version=st.one_of(st.just(""), versions),
        options=decoding_options(),
        top_k=st.one_of(small_ints, int32s),
    )
    @example("Classify", b"\x89PNG" + b"\x00" * (4 * 1024 * 1024), "", "", pb.DecodingOptions(), 0)
    @example(
        "Caption",
        png_claiming(4096, 4096, zlib.compress(b"\x00" * (1 + 3 * 4096) * 4096)),  # 48 MB of pixels
        "",
        "",
        pb.DecodingOptions(max_new_tokens=2),
        0,
    )
    @example("CaptionStream", png_claiming(100_000, 100_000), "", "", pb.DecodingOptions(), 0)
    @example("Classify", jpeg_claiming(65535, 65535), "", "", pb.DecodingOptions(), 0)
    @example("Classify", IMAGE_POOL[0], "", "", pb.DecodingOptions(), -1)
    @example("Classify", IMAGE_POOL[0], "", "", pb.DecodingOptions(), 2**31 - 1)
    def run(
        method: str,
        image: bytes,
        model: str,
        version: str,
        options: pb.DecodingOptions,
        top_k: int,
    ) -> None:
        if method == "Classify":
            request: Any = pb.ClassifyRequest(
                image=image, model=model, model_version=version, top_k=top_k
            )
            code, details, result = fuzz.call(lambda t: fuzz.stub.Classify(request, timeout=t))
        else:
            request = pb.CaptionRequest(
                image=image, model=model, model_version=version, options=options
            )
            rpc = getattr(fuzz.stub, method)
            streaming = method == "CaptionStream"
            code, details, result = fuzz.call(
                lambda t: list(rpc(request, timeout=t)) if streaming else rpc(request, timeout=t)
            )
        fuzz.check("images", code, details, what=(method, model, version, image[:40], options))
        if code == grpc.StatusCode.OK and method == "Classify":
            scores = [label.score for label in result.labels]
            assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
            assert len(scores) == min(top_k or 5, 10)

    run()
    fuzz.assert_still_correct()


# --- 4. KServe ModelInfer: tensors, datatypes, shapes, parameters, outputs ------------------------
INPUT_NAMES = ["text", "target_language", "image", "pixel_values", "caption", "probabilities", ""]
BAD_DATATYPES = ["BF16", "fp32", "", "STRING", "FP8", "INT128", "bytes"]
OPTION_NAMES = [
    "max_new_tokens",
    "min_new_tokens",
    "beam_size",
    "length_penalty",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "timeout",
    "target_language",
    "classification",
    "num_alternatives",
    "bogus",
]
dims = st.one_of(
    st.integers(0, 4),
    st.sampled_from([-1, -(2**63), 3, 32, 48, 2**31, 2**40, 2**63 - 1]),
)
shapes_st = st.one_of(
    st.lists(dims, max_size=5),
    st.sampled_from([[1], [2], [1, 1], [2, 1], [1, 3, 32, 32], [2, 3, 32, 32], [1, 3, 48, 48]]),
    st.lists(st.just(1), min_size=33, max_size=40),  # too many dimensions
)


@st.composite
def parameters(draw: st.DrawFn) -> dict[str, kpb.InferParameter]:
    chosen = draw(st.lists(st.sampled_from(OPTION_NAMES), max_size=4, unique=True))
    result = {}
    for name in chosen:
        kind = draw(st.sampled_from(["bool", "int64", "uint64", "double", "string"]))
        if kind == "bool":
            value: Any = draw(st.booleans())
        elif kind == "int64":
            value = draw(st.one_of(small_ints, st.integers(-(2**63), 2**63 - 1)))
        elif kind == "uint64":
            value = draw(st.one_of(small_ints.filter(lambda v: v >= 0), st.integers(0, 2**64 - 1)))
        elif kind == "double":
            value = draw(st.one_of(st.sampled_from(EDGE_FLOATS), st.floats()))
        else:
            value = draw(
                st.one_of(
                    st.sampled_from(["de", "fr", "1", " 7 ", "nan", "inf", "1e400", "-1", "0x10"]),
                    st.text(max_size=10),
                )
            )
        result[name] = kpb.InferParameter(**{f"{kind}_param": value})
    return result


@st.composite
def bytes_data(draw: st.DrawFn, count: int) -> bytes:
    """BYTES raw data for ``count`` elements, often with broken length prefixes."""
    elements = draw(
        st.lists(
            st.one_of(
                st.sampled_from(
                    [b"three hundred", b"doce", b"", b"\xff\xfe", b"de", b"xx", IMAGE_POOL[2]]
                ),
                st.sampled_from(IMAGE_POOL),
                st.binary(max_size=40),
            ),
            min_size=min(count, 3),
            max_size=min(count, 3),
        )
    )
    data = bytearray(encode_bytes(elements))
    breakage = draw(st.sampled_from(["none", "none", "cut", "prefix", "junk", "huge"]))
    if breakage == "cut" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif breakage == "prefix" and len(data) >= 4:
        data[0:4] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
    elif breakage == "junk":
        data += draw(st.binary(min_size=1, max_size=7))
    elif breakage == "huge":
        data += struct.pack("<I", 2**32 - 1) + b"abc"
    return bytes(data)


@st.composite
def numeric_data(draw: st.DrawFn, datatype: str, count: int) -> bytes:
    """Raw numeric data of the right length (often) or a wrong one; values may be NaN / inf."""
    itemsize = NUMERIC_DTYPES[datatype].itemsize
    length = count * itemsize if count * itemsize <= 64 * 1024 else 0
    choice = draw(st.sampled_from(["exact", "exact", "short", "long", "empty"]))
    if choice == "short":
        length = max(0, length - draw(st.integers(1, itemsize + 3)))
    elif choice == "long":
        length += draw(st.integers(1, 9))
    elif choice == "empty":
        length = 0
    if datatype in ("FP32", "FP16", "FP64") and choice == "exact" and draw(st.booleans()):
        values = np.random.default_rng(draw(st.integers(0, 99))).normal(size=length // itemsize)
        specials = draw(st.sampled_from([None, math.nan, math.inf, -math.inf, 1e38]))
        if specials is not None and values.size:
            values[draw(st.integers(0, values.size - 1))] = specials
        with np.errstate(over="ignore"):  # 1e38 as FP16 is inf: fine, that is a case too
            return values.astype(NUMERIC_DTYPES[datatype]).tobytes()
    return draw(st.binary(min_size=length, max_size=length))


@st.composite
def infer_requests(draw: st.DrawFn, deep: bool = False) -> kpb.ModelInferRequest:
    """A ModelInferRequest: any model, inputs of any name / datatype / shape / data, parameters,
    requested outputs. ``deep``: real models and input names, so validation goes further."""
    models = st.sampled_from(["translator", "captioner", "vit"])
    request = kpb.ModelInferRequest(
        model_name=draw(models if deep else st.one_of(models, model_names)),
        model_version=draw(st.just("") if deep else st.one_of(st.just(""), versions)),
        id=draw(st.text(max_size=8)),
    )
    raw = draw(st.booleans()) if not deep else draw(st.sampled_from([True, True, False]))
    names = (
        st.sampled_from(INPUT_NAMES[:4])
        if deep
        else st.one_of(st.sampled_from(INPUT_NAMES), st.text(max_size=6))
    )
    for _ in range(draw(st.integers(0 if not deep else 1, 3))):
        name = draw(names)
        datatype = draw(
            st.one_of(st.sampled_from(["BYTES", "FP32", "FP16"]), st.sampled_from(DATATYPES))
            if deep
            else st.one_of(st.sampled_from(DATATYPES), st.sampled_from(BAD_DATATYPES))
        )
        shape = draw(shapes_st)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        count = math.prod(shape) if all(d >= 0 for d in shape) else 1
        count = count if count <= 16384 else 1
        if datatype == "BYTES":
            data = draw(bytes_data(count))
        elif datatype in NUMERIC_DTYPES:
            data = draw(numeric_data(datatype, count))
        else:
            data = draw(st.binary(max_size=16))
        if raw:
            request.raw_input_contents.append(data)
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                draw(st.lists(st.sampled_from([b"doce", b"", IMAGE_POOL[1], b"\xff"]), max_size=3))
            )
        elif datatype in ("FP32", "FP64"):
            tensor.contents.fp32_contents.extend(
                draw(st.lists(st.floats(width=32), max_size=8))
                if not draw(st.booleans())
                else [0.0] * min(count, 4096)
            )
        elif datatype in NUMERIC_DTYPES:
            tensor.contents.int_contents.extend(draw(st.lists(int32s, max_size=4)))
    if raw and draw(st.integers(0, 9)) == 0:  # one raw entry too many or too few
        if request.raw_input_contents and draw(st.booleans()):
            del request.raw_input_contents[-1]
        else:
            request.raw_input_contents.append(b"\x00" * 4)
    for key, value in draw(parameters()).items():
        request.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(
            name=draw(
                st.sampled_from(
                    ["probabilities", "label", "translation", "caption", "token_ids", "x"]
                )
            )
        )
        if draw(st.booleans()):
            output.parameters["classification"].CopyFrom(
                kpb.InferParameter(int64_param=draw(small_ints))
            )
    return request


def kserve_allowed(request: kpb.ModelInferRequest) -> set[grpc.StatusCode]:
    allowed = set(ALLOWED)
    if "timeout" in request.parameters:  # a tiny Triton timeout may legitimately expire
        allowed.add(grpc.StatusCode.DEADLINE_EXCEEDED)
    return allowed


def check_infer_response(request: kpb.ModelInferRequest, response: kpb.ModelInferResponse) -> None:
    outputs = decode_outputs(response)  # well-formed tensors
    wanted = [o.name for o in request.outputs]
    if wanted:
        assert [o.name for o in response.outputs] == wanted
    assert response.id == request.id
    assert outputs


def check_stream_response(fuzz: Fuzz, response: kpb.ModelStreamInferResponse) -> None:
    if response.error_message:
        code, _, message = response.error_message.partition(": ")
        fuzz.codes[f"stream:{code}"] += 1
        assert code not in ("UNKNOWN", "INTERNAL"), response.error_message
        assert code in {c.name for c in ALLOWED | {grpc.StatusCode.DEADLINE_EXCEEDED}}, code
        assert says_what_to_fix(message), f"poor message {response.error_message!r}"
    else:
        decode_outputs(response.infer_response)


def test_fuzz_kserve_infer(fuzz: Fuzz) -> None:
    @budget("kserve_infer")
    @given(request=infer_requests())
    def run(request: kpb.ModelInferRequest) -> None:
        code, details, result = fuzz.call(lambda t: fuzz.kserve.ModelInfer(request, timeout=t))
        fuzz.check("kserve_infer", code, details, kserve_allowed(request), what=request)
        if code == grpc.StatusCode.OK:
            check_infer_response(request, result)

    run()
    fuzz.assert_still_correct()


def test_fuzz_kserve_tensors(fuzz: Fuzz) -> None:
    """Real models and input names with wrong datatypes, shapes, byte lengths and BYTES data."""

    @budget("kserve_tensors")
    @given(request=infer_requests(deep=True))
    def run(request: kpb.ModelInferRequest) -> None:
        code, details, result = fuzz.call(lambda t: fuzz.kserve.ModelInfer(request, timeout=t))
        fuzz.check("kserve_tensors", code, details, kserve_allowed(request), what=request)
        if code == grpc.StatusCode.OK:
            check_infer_response(request, result)

    run()
    fuzz.assert_still_correct()


def test_fuzz_kserve_stream(fuzz: Fuzz) -> None:
    @budget("kserve_stream")
    @given(requests=st.lists(st.one_of(infer_requests(), infer_requests(deep=True)), max_size=4))
    def run(requests: list[kpb.ModelInferRequest]) -> None:
        code, details, result = fuzz.call(
            lambda t: list(fuzz.kserve.ModelStreamInfer(iter(requests), timeout=t))
        )
        fuzz.check("kserve_stream", code, details, what=requests)
        assert code == grpc.StatusCode.OK  # a failing request goes into error_message
        finals = collections.Counter()
        for response in result:
            check_stream_response(fuzz, response)
            parameters = response.infer_response.parameters
            if response.error_message or parameters["triton_final_response"].bool_param:
                finals[response.infer_response.id] += 1
        assert sum(finals.values()) == len(requests)  # exactly one final answer per request

    run()
    fuzz.assert_still_correct()


# --- 5. metadata, readiness and health with any names ---------------------------------------------
def test_fuzz_metadata(fuzz: Fuzz) -> None:
    @budget("metadata")
    @given(
        method=st.sampled_from(
            [
                "GetModel",
                "ListModels",
                "ServerLive",
                "ServerReady",
                "ModelReady",
                "ServerMetadata",
                "ModelMetadata",
                "ModelConfig",
                "Health",
            ]
        ),
        name=model_names,
        version=versions,
    )
    @example("GetModel", "", "")
    @example("ModelConfig", "../../etc/passwd", "")
    @example("ModelMetadata", "vit", "99999999999999999999")
    @example("Health", "inference.GRPCInferenceService", "")
    def run(method: str, name: str, version: str) -> None:
        k, s = fuzz.kserve, fuzz.stub
        calls: dict[str, Callable[[float], Any]] = {
            "GetModel": lambda t: s.GetModel(
                pb.GetModelRequest(name=name, version=version), timeout=t
            ),
            "ListModels": lambda t: s.ListModels(pb.ListModelsRequest(), timeout=t),
            "ServerLive": lambda t: k.ServerLive(kpb.ServerLiveRequest(), timeout=t),
            "ServerReady": lambda t: k.ServerReady(kpb.ServerReadyRequest(), timeout=t),
            "ModelReady": lambda t: k.ModelReady(
                kpb.ModelReadyRequest(name=name, version=version), timeout=t
            ),
            "ServerMetadata": lambda t: k.ServerMetadata(kpb.ServerMetadataRequest(), timeout=t),
            "ModelMetadata": lambda t: k.ModelMetadata(
                kpb.ModelMetadataRequest(name=name, version=version), timeout=t
            ),
            "ModelConfig": lambda t: k.ModelConfig(
                kpb.ModelConfigRequest(name=name, version=version), timeout=t
            ),
            "Health": lambda t: fuzz.health.Check(
                health_pb2.HealthCheckRequest(service=name), timeout=t
            ),
        }
        code, details, result = fuzz.call(calls[method])
        fuzz.check("metadata", code, details, what=(method, name, version))
        real = name in ("translator", "captioner", "vit") and version in ("", "1")
        if method in ("GetModel", "ModelMetadata", "ModelConfig"):
            assert (code == grpc.StatusCode.OK) == real, (method, name, version, code, details)
        if method == "ModelReady":
            assert code == grpc.StatusCode.OK and result.ready == real
        if method in ("ServerLive", "ServerReady", "ListModels", "ServerMetadata"):
            assert code == grpc.StatusCode.OK

    run()
    fuzz.assert_still_correct()


def test_fuzz_case_count(fuzz: Fuzz) -> None:
    """The budget was spent: at least 90% of the examples ran (CI: >= 2,000 cases)."""
    ran = sum(fuzz.cases.values())
    if set(fuzz.cases) != set(WEIGHTS):
        pytest.skip(f"only some fuzz tests ran ({sorted(fuzz.cases)}): {ran} cases")
    assert ran >= 0.9 * TOTAL_EXAMPLES, (ran, TOTAL_EXAMPLES)
    if TOTAL_EXAMPLES >= CI_EXAMPLES:
        assert ran >= 2000
