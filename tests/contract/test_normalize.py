"""Source-text normalisers: the steps, their storage, and the config field that names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.model_config import TokenizerSpec
from contract.normalize import (
    NORMALIZER_FILE,
    NORMALIZER_STEPS,
    NormalizerError,
    SourceNormalizer,
    read_normalizer,
    write_normalizer,
)

NUMBERS = SourceNormalizer(
    ("nfkc", "lowercase", "hyphens", "whitespace", "final_stop", "en_number_words")
)


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("Three hundred and twelve", "three hundred and twelve"),
        ("  forty-two ", "forty-two"),
        ("forty two", "forty-two"),
        ("FORTY-TWO", "forty-two"),
        ("forty-two.", "forty-two"),
        ("forty\u00a0\u2013 two!", "forty-two"),  # no-break space, en dash
        ("\tnineteen   eighty four\n", "nineteen eighty-four"),
        ("in nineteen oh five", "in nineteen oh-five"),
        ("twenty first", "twenty-first"),
        ("three hundred twelve", "three hundred and twelve"),
        ("one thousand three hundred twelve", "one thousand, three hundred and twelve"),
        ("one thousand twelve", "one thousand and twelve"),
        ("one thousand , two hundredth", "one thousand, two hundredth"),
        ("a hundred and one", "one hundred and one"),
        ("page a thousand", "page one thousand"),
        ("eighty thousand", "eighty thousand"),  # tens before thousand: no hyphen
        ("nine hundred thousand", "nine hundred thousand"),
    ],
)
def test_number_phrases_as_people_type_them(typed: str, expected: str) -> None:
    assert NUMBERS(typed) == expected


def test_steps_run_in_order_and_none_is_identity() -> None:
    assert SourceNormalizer(())("  Forty Two. ") == "  Forty Two. "
    assert not SourceNormalizer(())
    assert SourceNormalizer(("whitespace", "lowercase"))(" A  B ") == "a b"
    assert SourceNormalizer(("final_stop",))("done...  ") == "done"


def test_unknown_steps_are_named() -> None:
    with pytest.raises(NormalizerError, match=r"\['shout'\] must be among: nfkc, lowercase"):
        SourceNormalizer(("lowercase", "shout"))
    with pytest.raises(ValueError, match="must be among"):
        TokenizerSpec(normalizer=("shout",))
    assert set(NORMALIZER_STEPS) >= {"lowercase", "whitespace", "en_number_words"}


def test_normalizer_file_round_trip(tmp_path: Path) -> None:
    assert read_normalizer(tmp_path) == ()  # none: no normalisation
    write_normalizer(tmp_path, ("lowercase", "whitespace"))
    assert read_normalizer(tmp_path) == ("lowercase", "whitespace")


@pytest.mark.parametrize(
    "content", ["not json", '["lowercase"]', '{"source": "lowercase"}', '{"source": ["shout"]}']
)
def test_a_bad_normalizer_file_is_named(tmp_path: Path, content: str) -> None:
    (tmp_path / NORMALIZER_FILE).write_text(content)
    with pytest.raises(NormalizerError, match=r"normalizer\.json|must be among"):
        read_normalizer(tmp_path)


def test_language_tag_needs_one_placeholder() -> None:
    assert TokenizerSpec(language_tag="").language_tag == ""
    assert TokenizerSpec(language_tag=">>{}<<").language_tag == ">>{}<<"
    with pytest.raises(ValueError, match="must hold one"):
        TokenizerSpec(language_tag="<2de>")
