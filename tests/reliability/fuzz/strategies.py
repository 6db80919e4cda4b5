"""Hypothesis strategies shared by the fuzz tests: edge and random numbers, model names,
versions, languages, texts, decoding options, and encoded images (valid ones of many sizes,
modes and formats; crafted headers; truncated, bit-flipped, spliced or random bytes)."""

from __future__ import annotations

import io
import math
import struct
import zlib
from typing import Any

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb

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
# bad words and stop strings: ordinary ones, blank, special tokens, outside the vocabulary, long
WORDS = ["drei", "zwei", "\n", ".", " ", "", "</s>", "<unk>", "日本", "x" * 300, "🙂"]


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
        ("repetition_penalty", float32s),
        ("no_repeat_ngram_size", small_ints),
        ("return_log_probs", st.booleans()),
    ):
        if draw(st.integers(0, 3)) == 0:
            setattr(options, name, draw(values))
    for name in ("bad_words", "stop"):  # lists of texts: ordinary, blank, huge, too many
        if draw(st.integers(0, 3)) == 0:
            getattr(options, name).extend(draw(word_lists))
    return options


word_lists = st.one_of(
    st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=5),
    st.lists(st.sampled_from(WORDS), min_size=60, max_size=80),
)


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
