"""scikit-learn's handwritten digits (8x8, shipped with the package: no download) as 32x32 RGB.

The 8x8 images (values 0..16) are scaled to uint8, upscaled with PIL's bilinear filter and
replicated to three channels. Serving receives PNGs of such 32x32 images and decodes them with
``contract.images.decode_image``, which resizes with the same PIL filter when needed.

No torch here.
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

DIGITS_IMAGE_SIZE = 32
LABELS: tuple[str, ...] = tuple(str(d) for d in range(10))
TEST_FRACTION = 0.2
SPLITS: tuple[str, ...] = ("train", "test")
_MAX_VALUE = 16  # load_digits pixel values lie in 0..16


def load_digits_split(split: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return one split of the digits data set as RGB images and labels.

    Args:
        split: ``"train"`` (80%, 1437 images) or ``"test"`` (20%, 360 images).
        seed: Seed of the stratified split.

    Returns:
        uint8 images of shape (N, 32, 32, 3) and int64 labels of shape (N,).

    Raises:
        ValueError: For an unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    train_idx, test_idx = digits_split_indices(seed)
    indices = train_idx if split == "train" else test_idx
    images, labels = _all_digits()
    return images[indices].copy(), labels[indices].copy()


def digits_split_indices(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return the indices into the full data set of the train and test splits.

    Args:
        seed: Seed of the stratified 80/20 split.

    Returns:
        (train indices, test indices), disjoint int64 arrays covering all 1797 images.
    """
    _, labels = _all_digits()
    train_idx, test_idx = train_test_split(
        np.arange(len(labels), dtype=np.int64),
        test_size=TEST_FRACTION,
        stratify=labels,
        random_state=seed,
    )
    return np.asarray(train_idx, dtype=np.int64), np.asarray(test_idx, dtype=np.int64)


def upscale_digit(image: np.ndarray, image_size: int = DIGITS_IMAGE_SIZE) -> np.ndarray:
    """Convert one 8x8 digit (values 0..16) to a uint8 RGB image.

    Args:
        image: An (8, 8) array with values in 0..16.
        image_size: Output side length.

    Returns:
        A uint8 array of shape (image_size, image_size, 3).

    Raises:
        ValueError: If the image is not two-dimensional.
    """
    if image.ndim != 2:
        raise ValueError(f"expected a 2-D digit image, got shape {image.shape}")
    grey = np.rint(np.asarray(image, dtype=np.float64) * 255.0 / _MAX_VALUE)
    pil = Image.fromarray(np.clip(grey, 0, 255).astype(np.uint8), mode="L")
    resized = np.asarray(pil.resize((image_size, image_size), Image.Resampling.BILINEAR))
    return np.repeat(resized[:, :, None], 3, axis=2)


@functools.cache
def _all_digits() -> tuple[np.ndarray, np.ndarray]:
    bunch = load_digits()
    images = np.stack([upscale_digit(img) for img in bunch.images])
    images.setflags(write=False)
    labels = np.asarray(bunch.target, dtype=np.int64)
    labels.setflags(write=False)
    return images, labels
