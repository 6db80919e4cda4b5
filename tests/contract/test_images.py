"""contract.images: decoding PNG / JPEG bytes and the models' pixel normalisation."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from contract.images import MAX_SIDE, ImageDecodeError, decode_image, encode_png, pixel_values


def test_png_round_trip() -> None:
    image = np.random.default_rng(0).integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    decoded = decode_image(encode_png(image[:, :20]), 20)
    assert decoded.dtype == np.uint8
    assert np.array_equal(decoded, image[:, :20])


def test_decode_resizes_and_converts_to_rgb() -> None:
    grey = np.full((64, 64), 200, dtype=np.uint8)
    decoded = decode_image(encode_png(grey), 32)
    assert decoded.shape == (32, 32, 3)
    assert (decoded == 200).all()
    buffer = io.BytesIO()
    Image.new("RGBA", (10, 12), (10, 20, 30, 128)).save(buffer, format="PNG")
    assert (decode_image(buffer.getvalue(), 10) == np.array([10, 20, 30])).all()
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (255, 0, 0)).save(buffer, format="JPEG", quality=95)
    jpeg = decode_image(buffer.getvalue(), 16)
    assert jpeg.shape == (16, 16, 3) and jpeg[..., 0].min() > 240


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 30])
def test_corrupt_bytes_raise(data: bytes) -> None:
    with pytest.raises(ImageDecodeError, match="PNG"):
        decode_image(data, 32)


def test_truncated_and_unsupported_images_raise() -> None:
    png = encode_png(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    with pytest.raises(ImageDecodeError):
        decode_image(png[: len(png) // 2], 32)
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="GIF")
    with pytest.raises(ImageDecodeError, match="not a PNG or JPEG"):
        decode_image(buffer.getvalue(), 8)


def test_huge_images_are_refused() -> None:
    buffer = io.BytesIO()
    Image.new("L", (MAX_SIDE + 1, 2)).save(buffer, format="PNG")
    with pytest.raises(ImageDecodeError, match="limit"):
        decode_image(buffer.getvalue(), 32)


def test_pixel_values() -> None:
    images = np.zeros((2, 4, 5, 3), dtype=np.uint8)
    images[1] = 255
    images[0, 0, 0] = (0, 128, 255)
    values = pixel_values(images)
    assert values.dtype == np.float32
    assert values.shape == (2, 3, 4, 5)
    assert values.min() == -1.0 and values.max() == 1.0
    assert values[0, :, 0, 0] == pytest.approx([-1.0, 128 / 255 * 2 - 1, 1.0], abs=1e-6)
    single = pixel_values(images[1])
    assert single.shape == (1, 3, 4, 5)
    custom = pixel_values(images, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    assert custom.min() >= 0.0 and custom.max() == 1.0
    with pytest.raises(ValueError, match="uint8"):
        pixel_values(images.astype(np.float32))
    with pytest.raises(ValueError, match="shape"):
        pixel_values(np.zeros((4, 4), dtype=np.uint8))
