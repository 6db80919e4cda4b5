"""Tests of the data sets: translation pairs, shape scenes and digits."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from num2words import num2words

from contract.images import (
    decode_image,
    encode_png,
)
from models.data import shapes
from models.data.digits import (
    DIGITS_IMAGE_SIZE,
    LABELS,
    digits_split_indices,
    load_digits_split,
)
from models.data.translation import (
    KINDS,
    LANGUAGES,
    TEMPLATES,
    Pair,
    generate_pairs,
    is_test_key,
    language_tag,
    make_pair,
)

# ---------------------------------------------------------------------------------------------
# translation


@pytest.fixture(scope="module")
def train_pairs() -> list[Pair]:
    return generate_pairs(20_000, seed=0, split="train")


@pytest.fixture(scope="module")
def test_pairs() -> list[Pair]:
    return generate_pairs(1_500, seed=0, split="test")


def test_generate_pairs_is_deterministic() -> None:
    first = generate_pairs(500, seed=7, split="train")
    assert first == generate_pairs(500, seed=7, split="train")
    assert generate_pairs(120, seed=7, split="train") == first[:120]
    assert first != generate_pairs(500, seed=8, split="train")
    assert generate_pairs(50, seed=7, split="test") == generate_pairs(50, seed=7, split="test")


def test_train_and_test_share_no_source(train_pairs: list[Pair], test_pairs: list[Pair]) -> None:
    assert {p.tagged_source() for p in train_pairs}.isdisjoint(
        p.tagged_source() for p in test_pairs
    )
    assert {p.source for p in train_pairs}.isdisjoint(p.source for p in test_pairs)
    assert {p.key for p in train_pairs}.isdisjoint(p.key for p in test_pairs)
    assert not any(is_test_key(p.key) for p in train_pairs)
    assert all(is_test_key(p.key) for p in test_pairs)


def test_test_split_is_unique(test_pairs: list[Pair]) -> None:
    assert len({(p.key, p.lang) for p in test_pairs}) == len(test_pairs)
    assert len({p.tagged_source() for p in test_pairs}) == len(test_pairs)


def test_each_source_has_one_key_and_target(train_pairs: list[Pair]) -> None:
    by_source: dict[str, set[tuple[str, str]]] = {}
    for p in train_pairs:
        by_source.setdefault(p.tagged_source(), set()).add((p.key, p.target))
    assert all(len(v) == 1 for v in by_source.values())


def test_all_kinds_and_languages_present(train_pairs: list[Pair], test_pairs: list[Pair]) -> None:
    for pairs in (train_pairs, test_pairs):
        assert {p.kind for p in pairs} == set(KINDS)
        assert {p.lang for p in pairs} == set(LANGUAGES)
    kinds = Counter(p.kind for p in train_pairs)
    n = len(train_pairs)
    assert kinds["cardinal"] / n == pytest.approx(0.5, abs=0.03)
    for kind, share in (("ordinal", 0.15), ("year", 0.15), ("phrase", 0.2)):
        assert kinds[kind] / n == pytest.approx(share, abs=0.03)
    templates = {p.key.split(":")[1] for p in train_pairs if p.kind == "phrase"}
    assert templates == {t.name for t in TEMPLATES}


def test_cardinal_magnitudes_are_balanced(train_pairs: list[Pair]) -> None:
    values = [int(p.key.rsplit(":", 1)[1]) for p in train_pairs if p.kind == "cardinal"]
    digits = Counter(min(len(str(v)), 6) for v in values)
    assert set(digits) == {1, 2, 3, 4, 5, 6}
    assert max(digits.values()) / min(digits.values()) < 1.3
    assert min(values) >= 0 and max(values) <= 1_000_000


def test_text_is_whitespace_normalised(train_pairs: list[Pair]) -> None:
    for p in train_pairs[:3000]:
        for text in (p.source, p.target):
            assert text == " ".join(text.split())
            assert text


def test_targets_match_num2words(train_pairs: list[Pair]) -> None:
    checked = 0
    for p in train_pairs[:2000]:
        value = int(p.key.rsplit(":", 1)[1])
        if p.kind in ("cardinal", "ordinal", "year"):
            assert p.source == num2words(value, lang="en", to=p.kind)
            assert p.target == num2words(value, lang=p.lang, to=p.kind)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize(
    ("lang", "expected"),
    [("de", "dreihundertzwölf"), ("fr", "trois cent douze"), ("es", "trescientos doce")],
)
def test_known_values(lang: str, expected: str) -> None:
    pair = make_pair("cardinal", 312, lang)
    assert pair.source == "three hundred and twelve"
    assert pair.target == expected
    assert pair.key == "cardinal::312"
    assert pair.tagged_source() == f"<2{lang}> three hundred and twelve"


def test_known_phrases_and_years() -> None:
    assert make_pair("phrase", 12, "de", "page").target == "Seite zwölf"
    assert make_pair("phrase", 12, "es", "page").target == "página doce"
    year = make_pair("phrase", 1984, "de", "in")
    assert (year.source, year.target) == (
        "in nineteen eighty-four",
        "im Jahr neunzehnhundertvierundachtzig",
    )
    assert make_pair("year", 1984, "fr").target == "mille neuf cent quatre-vingt-quatre"
    assert make_pair("ordinal", 21, "fr").target == "vingt et unième"
    assert make_pair("cardinal", 999_999, "de").source == (
        "nine hundred and ninety-nine thousand, nine hundred and ninety-nine"
    )


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="de, fr, es"):
        language_tag("it")
    assert language_tag("de") == "<2de>"
    with pytest.raises(ValueError, match="split"):
        generate_pairs(10, 0, "validation")
    with pytest.raises(ValueError, match="template"):
        make_pair("phrase", 3, "de", "nope")
    with pytest.raises(ValueError, match="kind"):
        make_pair("fraction", 3, "de")


# ---------------------------------------------------------------------------------------------
# shapes


def _parse_caption(text: str, arrangement: str) -> list[tuple[str, str, str]]:
    relation = " left of " if arrangement == "horizontal" else " above "
    phrases = text.split(relation)
    parsed = []
    for phrase in phrases:
        article, size, color, kind = phrase.split(" ")
        assert article == "a"
        parsed.append((size, color, kind))
    return parsed


@pytest.fixture(scope="module")
def train_scenes() -> list[shapes.Scene]:
    return shapes.generate_scenes(1000, seed=0, split="train")


def test_shapes_generation_is_deterministic() -> None:
    first = shapes.generate(40, seed=3, split="train")
    second = shapes.generate(40, seed=3, split="train")
    assert [c for _, c in first] == [c for _, c in second]
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(first, second, strict=True))
    image, _ = first[0]
    assert image.dtype == np.uint8
    assert image.shape == (shapes.IMAGE_SIZE, shapes.IMAGE_SIZE, 3)


def test_caption_matches_scene(train_scenes: list[shapes.Scene]) -> None:
    counts = Counter(len(s.shapes) for s in train_scenes)
    assert set(counts) == {1, 2, 3}
    for scene in train_scenes:
        parsed = _parse_caption(shapes.caption(scene), scene.arrangement)
        axis = 0 if scene.arrangement == "horizontal" else 1
        ordered = sorted(scene.shapes, key=lambda s: (s.x, s.y)[axis])
        assert parsed == [(s.size, s.color, s.kind) for s in ordered]


def test_caption_examples() -> None:
    small_red = shapes.Shape("circle", "red", "small", x=8, y=24, radius=3)
    big_blue = shapes.Shape("square", "blue", "large", x=23, y=24, radius=7)
    assert shapes.caption(shapes.Scene((small_red,), "horizontal")) == "a small red circle"
    assert (
        shapes.caption(shapes.Scene((big_blue, small_red), "horizontal"))
        == "a small red circle left of a large blue square"
    )
    vertical = shapes.Scene(
        (
            shapes.Shape("circle", "red", "small", x=24, y=8, radius=3),
            shapes.Shape("triangle", "green", "large", x=24, y=40, radius=6),
        ),
        "vertical",
    )
    assert shapes.caption(vertical) == "a small red circle above a large green triangle"


def test_rendered_colours_at_shape_centres(train_scenes: list[shapes.Scene]) -> None:
    for scene in train_scenes[:200]:
        image = shapes.render(scene).astype(int)
        covered = np.zeros(image.shape[:2], dtype=bool)
        for s in scene.shapes:
            pixel = image[s.y, s.x]
            assert np.abs(pixel - np.array(shapes.COLORS[s.color])).max() <= shapes.NOISE_LEVEL
            covered[s.y - s.radius : s.y + s.radius + 1, s.x - s.radius : s.x + s.radius + 1] = True
        assert image[~covered].max() <= shapes.NOISE_LEVEL  # black background outside the shapes


def test_shapes_are_distinct_in_the_image() -> None:
    big_red = shapes.Shape("square", "red", "large", x=8, y=24, radius=7)
    small_red = shapes.Shape("square", "red", "small", x=8, y=24, radius=3)
    big = shapes.render(shapes.Scene((big_red,), "horizontal"))
    small = shapes.render(shapes.Scene((small_red,), "horizontal"))
    assert (big[:, :, 0] > 100).sum() == 15 * 15
    assert (small[:, :, 0] > 100).sum() == 7 * 7


def test_shapes_do_not_overlap_or_leave_the_image(train_scenes: list[shapes.Scene]) -> None:
    for scene in train_scenes:
        boxes = []
        for s in scene.shapes:
            assert s.radius in shapes.RADII[s.size]
            assert s.x - s.radius >= 0 and s.x + s.radius < shapes.IMAGE_SIZE
            assert s.y - s.radius >= 0 and s.y + s.radius < shapes.IMAGE_SIZE
            boxes.append((s.x - s.radius, s.x + s.radius, s.y - s.radius, s.y + s.radius))
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                gap_x = max(b[0] - a[1], a[0] - b[1]) - 1
                gap_y = max(b[2] - a[3], a[2] - b[3]) - 1
                assert max(gap_x, gap_y) >= 1  # at least one empty pixel line between shapes


def test_no_scene_in_both_splits(train_scenes: list[shapes.Scene]) -> None:
    test_scenes = shapes.generate_scenes(1000, seed=0, split="test")
    assert set(train_scenes).isdisjoint(test_scenes)
    assert not any(shapes.is_test_scene(s) for s in train_scenes)
    train_images = {shapes.render(s).tobytes() for s in train_scenes[:300]}
    assert train_images.isdisjoint(shapes.render(s).tobytes() for s in test_scenes[:300])


def test_render_other_size() -> None:
    scene = shapes.random_scene(np.random.default_rng(0))
    image = shapes.render(scene, image_size=96)
    assert image.shape == (96, 96, 3)
    s = scene.shapes[0]
    pixel = image[2 * s.y + 1, 2 * s.x + 1].astype(int)
    assert np.abs(pixel - np.array(shapes.COLORS[s.color])).max() <= shapes.NOISE_LEVEL


# ---------------------------------------------------------------------------------------------
# digits


def test_digits_splits() -> None:
    train_x, train_y = load_digits_split("train")
    test_x, test_y = load_digits_split("test")
    assert train_x.shape == (1437, DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE, 3)
    assert test_x.shape == (360, DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE, 3)
    assert train_x.dtype == np.uint8 and train_y.dtype == np.int64
    assert train_y.shape == (1437,) and test_y.shape == (360,)
    assert np.array_equal(train_x[..., 0], train_x[..., 2])
    assert train_x.max() == 255 and train_x.min() == 0
    assert len(LABELS) == 10
    # stratified: each class's share of the test split is 20% of its total, +-1 image
    total = Counter(train_y.tolist()) + Counter(test_y.tolist())
    test_counts = Counter(test_y.tolist())
    assert set(test_counts) == set(range(10))
    for label, count in total.items():
        assert abs(test_counts[label] - 0.2 * count) <= 1


def test_digits_split_is_deterministic_and_disjoint() -> None:
    train_idx, test_idx = digits_split_indices(0)
    assert set(train_idx.tolist()).isdisjoint(test_idx.tolist())
    assert len(train_idx) + len(test_idx) == 1797
    again_x, again_y = load_digits_split("train", seed=0)
    first_x, first_y = load_digits_split("train", seed=0)
    assert np.array_equal(again_x, first_x) and np.array_equal(again_y, first_y)
    other_idx, _ = digits_split_indices(1)
    assert not np.array_equal(other_idx, train_idx)
    with pytest.raises(ValueError, match="split"):
        load_digits_split("valid")


def test_digit_png_round_trip_is_exact() -> None:
    images, _ = load_digits_split("test")
    for image in images[:20]:
        assert np.array_equal(decode_image(encode_png(image), DIGITS_IMAGE_SIZE), image)
