"""The served image path: normalisation by table lookup gives ``pixel_values`` bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from contract.images import encode_png, pixel_values
from contract.model_config import ImageSpec
from serving.errors import InvalidArgument
from serving.served.inputs import ImageSource

channel = st.tuples(*[st.floats(0.0, 1.0, allow_subnormal=False)] * 3)
spread = st.tuples(*[st.floats(0.01, 4.0)] * 3)
images = st.tuples(st.integers(1, 9), st.integers(1, 9)).flatmap(
    lambda hw: arrays(np.uint8, (*hw, 3))
)


@settings(max_examples=60, deadline=None)
@given(image=images, mean=channel, std=spread, half=st.booleans())
def test_normalise_is_pixel_values(image, mean, std, half) -> None:
    dtype = np.float16 if half else np.float32
    source = ImageSource("m", ImageSpec(size=image.shape[0], mean=mean, std=std), 1 << 20, dtype)
    expected = pixel_values(image, mean, std)[0].astype(dtype)
    got = source.normalise(image)
    assert got.dtype == dtype and got.shape == expected.shape and got.flags.c_contiguous
    assert np.array_equal(got, expected)


def test_decoded_images_of_every_mode_normalise_as_before() -> None:
    """RGB images skip PIL's conversion now; greyscale and RGBA ones still convert."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    source = ImageSource("m", ImageSpec(size=8), 1 << 20, np.float32)
    assert np.array_equal(source.pixels(encode_png(rgb)), pixel_values(rgb)[0])
    for mode in ("L", "RGBA", "P"):
        buffer = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buffer, format="PNG")
        converted = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
        assert np.array_equal(source.pixels(buffer.getvalue()), pixel_values(converted)[0])
    with pytest.raises(InvalidArgument, match="PNG or JPEG"):
        source.pixels(b"not an image")
