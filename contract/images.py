"""Image decoding and preprocessing shared by training, export and serving (numpy and PIL only).

Part of ``contract``: no torch (the serving package imports it).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

DEFAULT_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
DEFAULT_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)
# Largest accepted side. Decoding runs on the server's event loop: a 4096 x 4096 PNG held it for
# about 0.5 s, 2048 x 2048 for about a quarter of that (the models take 32-48 px images).
MAX_SIDE = 2048
SUPPORTED_FORMATS: tuple[str, ...] = ("PNG", "JPEG")


class ImageDecodeError(ValueError):
    """Raised for image bytes that cannot be decoded or are not acceptable."""


# Resize filters by the names config.yaml uses (``ImageSpec.resample``); Hugging Face image
# processors store them as PIL's numbers (``RESAMPLE_BY_PIL_NUMBER``).
RESAMPLE_FILTERS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}
RESAMPLE_BY_PIL_NUMBER: dict[int, str] = {int(v): k for k, v in RESAMPLE_FILTERS.items()}


def decode_image(data: bytes, image_size: int, resample: str = "bilinear") -> np.ndarray:
    """Decode PNG or JPEG bytes to an RGB image of the model's size.

    Images of another size are resized with PIL's ``resample`` filter (non-square images are
    stretched), as Hugging Face image processors resize; greyscale, palette and RGBA images are
    converted to RGB (alpha is dropped).

    Args:
        data: The encoded image.
        image_size: Side length the model expects.
        resample: A ``RESAMPLE_FILTERS`` name.

    Returns:
        A uint8 array of shape (image_size, image_size, 3).

    Raises:
        ImageDecodeError: For empty, corrupt or truncated data, a format other than PNG or
            JPEG, or an image larger than ``MAX_SIDE`` pixels on a side.
        ValueError: For a non-positive ``image_size`` or an unknown filter.
    """
    if image_size <= 0:
        raise ValueError(f"image_size must be positive, got {image_size}")
    if resample not in RESAMPLE_FILTERS:
        raise ValueError(f"resample {resample!r} must be one of {', '.join(RESAMPLE_FILTERS)}")
    if not data:
        raise ImageDecodeError("empty image data; send PNG or JPEG bytes")
    try:
        with Image.open(io.BytesIO(data), formats=list(SUPPORTED_FORMATS)) as img:
            width, height = img.size
            if width > MAX_SIDE or height > MAX_SIDE or width < 1 or height < 1:
                raise ImageDecodeError(
                    f"image is {width}x{height} pixels; the limit is {MAX_SIDE} per side "
                    f"(the model uses {image_size}x{image_size}): send a smaller image"
                )
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            if rgb.size != (image_size, image_size):
                rgb = rgb.resize((image_size, image_size), RESAMPLE_FILTERS[resample])
            return np.asarray(rgb, dtype=np.uint8).copy()
    except ImageDecodeError:
        raise
    except UnidentifiedImageError as err:
        raise ImageDecodeError(
            f"data ({len(data)} bytes) is not a {' or '.join(SUPPORTED_FORMATS)} image; "
            "send PNG or JPEG bytes"
        ) from err
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        # OSError for truncated or corrupt data, DecompressionBombError for huge images.
        raise ImageDecodeError(
            f"cannot decode image ({type(err).__name__}: {err}); send a complete, valid "
            f"{' or '.join(SUPPORTED_FORMATS)} file"
        ) from err


def encode_png(image: np.ndarray) -> bytes:
    """Encode a uint8 image as PNG.

    Args:
        image: uint8 array of shape (H, W, 3) or (H, W).

    Returns:
        The PNG bytes.

    Raises:
        ValueError: For another dtype or shape.
    """
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {image.dtype}")
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"expected an (H, W, 3) or (H, W) image, got shape {image.shape}")
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def pixel_values(
    images: np.ndarray,
    mean: Sequence[float] = DEFAULT_MEAN,
    std: Sequence[float] = DEFAULT_STD,
) -> np.ndarray:
    """Turn uint8 HWC images into the model's normalised float32 NCHW input.

    Args:
        images: uint8 array of shape (N, H, W, 3) or (H, W, 3).
        mean: Per-channel mean subtracted after scaling to [0, 1].
        std: Per-channel standard deviation divided by afterwards.

    Returns:
        float32 array of shape (N, 3, H, W) holding ``(x / 255 - mean) / std``.

    Raises:
        ValueError: For another dtype or shape, or mean/std without three positive entries.
    """
    if images.dtype != np.uint8:
        raise ValueError(f"expected uint8 images, got {images.dtype}")
    batch = images[None] if images.ndim == 3 else images
    if batch.ndim != 4 or batch.shape[-1] != 3:
        raise ValueError(f"expected (N, H, W, 3) or (H, W, 3) images, got shape {images.shape}")
    mean_arr = np.asarray(mean, dtype=np.float32)
    std_arr = np.asarray(std, dtype=np.float32)
    if mean_arr.shape != (3,) or std_arr.shape != (3,) or np.any(std_arr <= 0):
        raise ValueError(f"mean and std need three entries (std > 0), got {mean} and {std}")
    scaled = batch.astype(np.float32) / np.float32(255.0)
    normalised = (scaled - mean_arr) / std_arr
    return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2), dtype=np.float32)
