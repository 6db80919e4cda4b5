"""Write the example images the README's quickstart uses (examples/scene.png, examples/digit.png).

Both come from the held-out splits the shipped models were never trained on:

    python examples/make_examples.py          # rewrites the two PNG files next to this script

- ``scene.png``: the first held-out captioning scene with three shapes in a row (48 x 48).
- ``digit.png``: the first held-out handwritten 7 of scikit-learn's digits, upscaled to 32 x 32.
"""

from __future__ import annotations

from pathlib import Path

from contract.images import encode_png
from models.data import digits, shapes

HERE = Path(__file__).resolve().parent
SEED = 0


def example_scene() -> tuple[bytes, str]:
    """The PNG and caption of the first held-out three-shape horizontal scene."""
    for scene in shapes.generate_scenes(200, seed=SEED, split="test"):
        if len(scene.shapes) == 3 and scene.arrangement == "horizontal":
            return encode_png(shapes.render(scene)), shapes.caption(scene)
    raise RuntimeError("no three-shape scene in the first 200 held-out scenes")


def example_digit(label: int = 7) -> tuple[bytes, int]:
    """The PNG of the first held-out digit ``label``."""
    images, labels = digits.load_digits_split("test")
    index = int((labels == label).nonzero()[0][0])
    return encode_png(images[index]), label


def main() -> None:
    scene, text = example_scene()
    (HERE / "scene.png").write_bytes(scene)
    digit, label = example_digit()
    (HERE / "digit.png").write_bytes(digit)
    print(f"scene.png: {text}\ndigit.png: {label}")


if __name__ == "__main__":
    main()
