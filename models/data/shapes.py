"""Synthetic captioning scenes: 1 to 3 coloured shapes in a row or a column on black.

The image is cut into three slots along the arrangement axis (three 16 px columns for
``"horizontal"``, three rows for ``"vertical"``); each shape sits in its own slot, jittered by at
most 2 px on both axes, and the last pixel line of every slot stays empty, so shapes never touch,
overlap or leave the image. Captions list the shapes left to right (or top to bottom)::

    a small red circle left of a large blue square left of a small green triangle
    a large yellow triangle above a small purple circle

Small shapes have a radius of 3-4 px, large ones 6-7 px, so the caption is fully determined by
the image. Train and test scenes come from different seed streams and, in addition, a stable hash
of the scene decides which split it may belong to, so no scene appears in both.

No torch here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 220, 40),
    "purple": (165, 60, 205),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: tuple[str, ...] = ("small", "large")
ARRANGEMENTS: tuple[str, ...] = ("horizontal", "vertical")
RADII: dict[str, tuple[int, ...]] = {"small": (3, 4), "large": (6, 7)}
IMAGE_SIZE = 48
NUM_SLOTS = 3
MAX_SHAPES = 3
JITTER = 2
NOISE_LEVEL = 8
TEST_FRACTION = 0.1
SPLITS: tuple[str, ...] = ("train", "test")

_RELATIONS = {"horizontal": "left of", "vertical": "above"}


@dataclass(frozen=True)
class Shape:
    """One filled shape; ``x``/``y`` is its centre in pixels of an ``IMAGE_SIZE`` image.

    ``radius`` is the half-extent in pixels: the shape fits in the square of side
    ``2 * radius + 1`` around its centre.
    """

    kind: str
    color: str
    size: str
    x: int
    y: int
    radius: int


@dataclass(frozen=True)
class Scene:
    """Shapes ordered along the arrangement axis (``"horizontal"`` or ``"vertical"``)."""

    shapes: tuple[Shape, ...]
    arrangement: str


def random_scene(rng: np.random.Generator) -> Scene:
    """Draw a scene of 1-3 shapes in distinct slots.

    Args:
        rng: The random generator to draw from.

    Returns:
        The scene, shapes sorted by position along the arrangement axis.
    """
    count = int(rng.integers(1, MAX_SHAPES + 1))
    arrangement = ARRANGEMENTS[int(rng.integers(len(ARRANGEMENTS)))]
    slots = sorted(int(s) for s in rng.choice(NUM_SLOTS, size=count, replace=False))
    shapes = tuple(_random_shape(rng, slot, arrangement) for slot in slots)
    return Scene(shapes=shapes, arrangement=arrangement)


def render(scene: Scene, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """Draw a scene on black with mild per-pixel grey noise (deterministic per scene).

    Args:
        scene: The scene (coordinates in pixels of an ``IMAGE_SIZE`` image).
        image_size: Output side length; other sizes scale the scene.

    Returns:
        A uint8 array of shape (image_size, image_size, 3).

    Raises:
        ValueError: For a non-positive size or an unknown shape kind or colour.
    """
    if image_size <= 0:
        raise ValueError(f"image_size must be positive, got {image_size}")
    canvas = np.zeros((image_size, image_size, 3), dtype=np.int16)
    # Scene coordinates of the output pixel centres.
    coords = (np.arange(image_size) + 0.5) * (IMAGE_SIZE / image_size) - 0.5
    ys, xs = np.meshgrid(coords, coords, indexing="ij")
    for shape in scene.shapes:
        if shape.color not in COLORS:
            raise ValueError(f"unknown colour {shape.color!r}; choose one of {', '.join(COLORS)}")
        canvas[_mask(shape, xs, ys)] = COLORS[shape.color]
    noise_rng = np.random.default_rng(_scene_hash(scene))
    noise = noise_rng.integers(-NOISE_LEVEL, NOISE_LEVEL + 1, size=(image_size, image_size, 1))
    return np.clip(canvas + noise, 0, 255).astype(np.uint8)


def caption(scene: Scene) -> str:
    """Describe a scene, shapes in order along its arrangement axis.

    Args:
        scene: The scene.

    Returns:
        E.g. ``"a small red circle left of a large blue square"``.

    Raises:
        ValueError: For an unknown arrangement or an empty scene.
    """
    if scene.arrangement not in _RELATIONS:
        raise ValueError(
            f"unknown arrangement {scene.arrangement!r}; choose one of {', '.join(ARRANGEMENTS)}"
        )
    if not scene.shapes:
        raise ValueError("a scene needs at least one shape")
    axis_key = (lambda s: s.x) if scene.arrangement == "horizontal" else (lambda s: s.y)
    ordered = sorted(scene.shapes, key=axis_key)
    phrases = [f"a {s.size} {s.color} {s.kind}" for s in ordered]
    return f" {_RELATIONS[scene.arrangement]} ".join(phrases)


def is_test_scene(scene: Scene) -> bool:
    """Decide by a stable hash whether a scene is reserved for the test split (~10%).

    Args:
        scene: The scene.

    Returns:
        True if only the test split may contain it.
    """
    return _scene_hash(scene) % 1000 < round(TEST_FRACTION * 1000)


def generate_scenes(n: int, seed: int, split: str) -> list[Scene]:
    """Draw ``n`` scenes of one split, deterministically for ``(n, seed, split)``.

    Args:
        n: Number of scenes.
        seed: Random seed; train and test use the streams ``[seed, 0]`` and ``[seed, 1]``.
        split: ``"train"`` or ``"test"``.

    Returns:
        The scenes (the train split may repeat one; no scene is in both splits).

    Raises:
        ValueError: For a negative ``n`` or an unknown split.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    want_test = split == "test"
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    scenes: list[Scene] = []
    while len(scenes) < n:
        scene = random_scene(rng)
        if is_test_scene(scene) == want_test:
            scenes.append(scene)
    return scenes


def generate(n: int, seed: int, split: str) -> list[tuple[np.ndarray, str]]:
    """Generate ``n`` (image, caption) examples of one split.

    Args:
        n: Number of examples.
        seed: Random seed.
        split: ``"train"`` or ``"test"``.

    Returns:
        Pairs of a uint8 (IMAGE_SIZE, IMAGE_SIZE, 3) image and its caption.

    Raises:
        ValueError: For a negative ``n`` or an unknown split.
    """
    return [(render(scene), caption(scene)) for scene in generate_scenes(n, seed, split)]


def _random_shape(rng: np.random.Generator, slot: int, arrangement: str) -> Shape:
    kind = SHAPES[int(rng.integers(len(SHAPES)))]
    color = list(COLORS)[int(rng.integers(len(COLORS)))]
    size = SIZES[int(rng.integers(len(SIZES)))]
    radii = RADII[size]
    radius = radii[int(rng.integers(len(radii)))]
    along = _slot_position(rng, slot, radius)
    centre = IMAGE_SIZE // 2
    across = int(rng.integers(centre - JITTER, centre + JITTER + 1))
    x, y = (along, across) if arrangement == "horizontal" else (across, along)
    return Shape(kind=kind, color=color, size=size, x=x, y=y, radius=radius)


def _slot_position(rng: np.random.Generator, slot: int, radius: int) -> int:
    """A jittered centre keeping the shape inside its slot, last pixel line of the slot empty."""
    width = IMAGE_SIZE // NUM_SLOTS
    start = slot * width
    nominal = start + width // 2
    low = max(nominal - JITTER, start + radius)
    high = min(nominal + JITTER, start + width - 2 - radius)
    return int(rng.integers(low, high + 1))


def _mask(shape: Shape, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    dx = xs - shape.x
    dy = ys - shape.y
    r = shape.radius
    if shape.kind == "circle":
        return dx**2 + dy**2 <= (r + 0.5) ** 2
    if shape.kind == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape.kind == "triangle":
        # Apex at (x, y - r), base from (x - r, y + r) to (x + r, y + r).
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    raise ValueError(f"unknown shape {shape.kind!r}; choose one of {', '.join(SHAPES)}")


def _scene_hash(scene: Scene) -> int:
    digest = hashlib.blake2b(repr(scene).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")
