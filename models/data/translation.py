"""English number phrases translated to German, French and Spanish, generated with num2words.

Every pair has a *key* (``"{kind}:{template}:{value}"``) shared by the three target languages; a
stable hash of the key decides whether it belongs to the held-out test split (about 2% of keys),
so the test split never shares an English source sentence with the train split.

Kinds:

* ``cardinal``: 0..1_000_000 (``"three hundred and twelve"`` -> ``"dreihundertzwölf"``);
* ``ordinal``: 1..100_000 (``"twelfth"`` -> ``"douzième"``);
* ``year``: 1000..2099 read as years (``"nineteen eighty-four"``). num2words implements
  ``to="year"`` for English and German only; for French and Spanish its base implementation
  returns the cardinal, which is also how years are read in those languages. Years whose English
  year reading equals the cardinal reading (1000-1009, 2000-2009: ``"two thousand and five"``)
  are left out of this kind: they are cardinals already, and keeping them would put one source
  sentence under two keys;
* ``phrase``: a noun followed by a number (``"page twelve"`` -> ``"Seite zwölf"``), or
  ``"in {year}"``. The number always follows the noun, so no agreement issues arise.

The sources are num2words' spelling: lower case, single spaces, hyphenated compounds. What people
type differs (``"Forty two."``); ``SOURCE_NORMALIZER`` (``contract.normalize`` steps) maps those
variants back onto the spelling, exactly: it is the identity on every source of every kind. The
translator stores it with its checkpoint and serving applies it to request text.
``variant_sources`` builds the variants suite from held-out pairs.

No torch here.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from num2words import CONVERTER_CLASSES, num2words

LANGUAGES: tuple[str, ...] = ("de", "fr", "es")
KINDS: tuple[str, ...] = ("cardinal", "ordinal", "year", "phrase")
SPLITS: tuple[str, ...] = ("train", "test")
KIND_PROBABILITIES: tuple[float, ...] = (0.5, 0.15, 0.15, 0.2)
TEST_FRACTION = 0.02

# Steps of contract.normalize, in order: what people type -> the sources' spelling.
SOURCE_NORMALIZER: tuple[str, ...] = (
    "nfkc",
    "lowercase",
    "hyphens",
    "whitespace",
    "final_stop",
    "en_number_words",
)
VARIANT_KINDS: tuple[str, ...] = (
    "capitalised",  # "Three hundred and twelve"
    "upper",  # "THREE HUNDRED AND TWELVE"
    "title",  # "Three Hundred And Twelve"
    "spaces",  # "  three  hundred and twelve " (surrounding and repeated whitespace)
    "hyphen_as_space",  # "forty two" for "forty-two"
    "spaced_hyphen",  # "forty - two"
    "full_stop",  # "three hundred and twelve."
    "no_and",  # "three hundred twelve", "one thousand three hundred" (US style, no comma)
    "a_for_one",  # "a hundred and one", "a thousand"
    "combined",  # two to four of the above at once
)

MAX_CARDINAL = 1_000_000
MAX_ORDINAL = 100_000
YEAR_RANGE: tuple[int, int] = (1000, 2099)
MAX_PHRASE_NUMBER = 9_999


@dataclass(frozen=True)
class PhraseTemplate:
    """A phrase template; ``{n}`` is replaced by the number words of each language."""

    name: str
    english: str
    de: str
    fr: str
    es: str
    number: str  # "cardinal" or "year"

    def render(self, lang: str, words: str) -> str:
        """Fill the template of a language.

        Args:
            lang: ``"en"`` or one of ``LANGUAGES``.
            words: The number in words, in that language.

        Returns:
            The phrase, e.g. ``"Seite zwölf"``.
        """
        pattern = self.english if lang == "en" else getattr(self, lang)
        return pattern.format(n=words)


TEMPLATES: tuple[PhraseTemplate, ...] = (
    PhraseTemplate("page", "page {n}", "Seite {n}", "page {n}", "página {n}", "cardinal"),
    PhraseTemplate("room", "room {n}", "Zimmer {n}", "chambre {n}", "habitación {n}", "cardinal"),
    PhraseTemplate(
        "chapter", "chapter {n}", "Kapitel {n}", "chapitre {n}", "capítulo {n}", "cardinal"
    ),
    PhraseTemplate("line", "line {n}", "Zeile {n}", "ligne {n}", "línea {n}", "cardinal"),
    PhraseTemplate("bus", "bus {n}", "Bus {n}", "bus {n}", "autobús {n}", "cardinal"),
    PhraseTemplate("platform", "platform {n}", "Gleis {n}", "quai {n}", "andén {n}", "cardinal"),
    PhraseTemplate("flight", "flight {n}", "Flug {n}", "vol {n}", "vuelo {n}", "cardinal"),
    PhraseTemplate("in", "in {n}", "im Jahr {n}", "en {n}", "en {n}", "year"),
)
_TEMPLATE_BY_NAME: dict[str, PhraseTemplate] = {t.name: t for t in TEMPLATES}

_BATCH = 4096  # candidates drawn per numpy call; fixed so shorter lists are prefixes of longer
_MILLION_P = 0.002  # chance that a cardinal (ordinal) draw is exactly 1_000_000 (100_000)
_MAX_FRUITLESS_DRAWS = 500_000  # stop when the unique test split is exhausted
_CARDS_LIMIT = 10**9


@dataclass(frozen=True)
class Pair:
    """One translation example.

    Attributes:
        source: English text without the language tag.
        target: Translation into ``lang``.
        lang: Target language code, one of ``LANGUAGES``.
        kind: One of ``KINDS``.
        key: ``"{kind}:{template}:{value}"``, identical for the three languages.
    """

    source: str
    target: str
    lang: str
    kind: str
    key: str

    def tagged_source(self) -> str:
        """Return the model input: the language tag, a space, then the English source."""
        return f"{language_tag(self.lang)} {self.source}"


def language_tag(lang: str) -> str:
    """Return the target-language tag token prepended to sources, e.g. ``"<2de>"``.

    Args:
        lang: A language code from ``LANGUAGES``.

    Returns:
        The tag.

    Raises:
        ValueError: If the language is not supported.
    """
    if lang not in LANGUAGES:
        raise ValueError(f"unsupported language {lang!r}; choose one of {', '.join(LANGUAGES)}")
    return f"<2{lang}>"


def language_tags() -> list[str]:
    """Return the tags of all supported languages, in ``LANGUAGES`` order."""
    return [language_tag(lang) for lang in LANGUAGES]


def is_test_key(key: str) -> bool:
    """Decide whether a key is held out for the test split (stable across runs and machines).

    Args:
        key: A pair key such as ``"cardinal::312"``.

    Returns:
        True for about ``TEST_FRACTION`` of all keys.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 < round(TEST_FRACTION * 10_000)


def make_pair(kind: str, value: int, lang: str, template: str = "") -> Pair:
    """Build the pair for one (kind, value, language, template).

    Args:
        kind: One of ``KINDS``.
        value: The number.
        lang: Target language.
        template: Template name (see ``TEMPLATES``) for ``kind="phrase"``, else empty.

    Returns:
        The pair.

    Raises:
        ValueError: For an unknown kind, language or template, or a template given with a
            non-phrase kind.
    """
    language_tag(lang)  # validates lang
    if kind == "phrase":
        if template not in _TEMPLATE_BY_NAME:
            names = ", ".join(_TEMPLATE_BY_NAME)
            raise ValueError(f"unknown phrase template {template!r}; choose one of {names}")
        tpl = _TEMPLATE_BY_NAME[template]
        source = tpl.render("en", _words(value, "en", tpl.number))
        target = tpl.render(lang, _words(value, lang, tpl.number))
    elif kind in KINDS:
        if template:
            raise ValueError(
                f"template {template!r} given for kind {kind!r}; only phrases have one"
            )
        source = _words(value, "en", kind)
        target = _words(value, lang, kind)
    else:
        raise ValueError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    return Pair(
        source=source, target=target, lang=lang, kind=kind, key=f"{kind}:{template}:{value}"
    )


def generate_pairs(n: int, seed: int, split: str) -> list[Pair]:
    """Generate ``n`` pairs of one split, deterministically for ``(n, seed, split)``.

    Candidates are drawn from ``numpy.random.default_rng(seed)`` in fixed-size batches and kept
    when ``is_test_key`` puts their key in ``split``, so a shorter list is a prefix of a longer
    one. The train split may repeat a pair; the test split holds each (key, language) once.

    Args:
        n: Number of pairs.
        seed: Random seed.
        split: ``"train"`` or ``"test"``.

    Returns:
        The pairs.

    Raises:
        ValueError: For a negative ``n``, an unknown split, or a test split asked for more
            unique pairs than the held-out keys provide.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    want_test = split == "test"
    rng = np.random.default_rng(seed)
    pairs: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    fruitless = 0
    while len(pairs) < n:
        for kind, template, value, lang in _draw_candidates(rng, _BATCH):
            key = f"{kind}:{template}:{value}"
            if is_test_key(key) != want_test or (want_test and (key, lang) in seen):
                fruitless += 1
                if fruitless > _MAX_FRUITLESS_DRAWS:
                    raise ValueError(
                        f"could only find {len(pairs)} unique {split} pairs, {n} requested; "
                        "ask for fewer test pairs"
                    )
                continue
            fruitless = 0
            if want_test:
                seen.add((key, lang))
            pairs.append(make_pair(kind, value, lang, template))
            if len(pairs) == n:
                break
    return pairs


def _by_digit_count(
    rng: np.random.Generator, size: int, max_digits: int, minimum: int
) -> np.ndarray:
    """Choose a digit count uniformly in 1..max_digits, then a value with that many digits."""
    digits = rng.integers(1, max_digits + 1, size=size)
    low = np.where(digits == 1, minimum, 10 ** (digits - 1))
    high = 10**digits - 1
    return rng.integers(low, high + 1)


def _draw_candidates(rng: np.random.Generator, size: int) -> list[tuple[str, str, int, str]]:
    """Draw (kind, template, value, lang) candidates; the draws per batch are fixed."""
    kinds = rng.choice(len(KINDS), size=size, p=KIND_PROBABILITIES)
    langs = rng.integers(0, len(LANGUAGES), size=size)
    templates = rng.integers(0, len(TEMPLATES), size=size)
    cardinals = _by_digit_count(rng, size, 6, 0)
    cardinals[rng.random(size) < _MILLION_P] = MAX_CARDINAL
    ordinals = _by_digit_count(rng, size, 5, 1)
    ordinals[rng.random(size) < _MILLION_P] = MAX_ORDINAL
    allowed_years = _allowed_years()
    years = allowed_years[rng.integers(0, len(allowed_years), size=size)]
    phrase_numbers = _by_digit_count(rng, size, len(str(MAX_PHRASE_NUMBER)), 1)
    phrase_years = rng.integers(YEAR_RANGE[0], YEAR_RANGE[1] + 1, size=size)

    out: list[tuple[str, str, int, str]] = []
    for i in range(size):
        kind = KINDS[kinds[i]]
        lang = LANGUAGES[langs[i]]
        if kind == "cardinal":
            out.append((kind, "", int(cardinals[i]), lang))
        elif kind == "ordinal":
            out.append((kind, "", int(ordinals[i]), lang))
        elif kind == "year":
            out.append((kind, "", int(years[i]), lang))
        else:
            tpl = TEMPLATES[templates[i]]
            value = phrase_years[i] if tpl.number == "year" else phrase_numbers[i]
            out.append((kind, tpl.name, int(value), lang))
    return out


@functools.cache
def _allowed_years() -> np.ndarray:
    """Years whose English year reading differs from the cardinal reading."""
    years = range(YEAR_RANGE[0], YEAR_RANGE[1] + 1)
    return np.array(
        [y for y in years if _words(y, "en", "year") != _words(y, "en", "cardinal")],
        dtype=np.int64,
    )


@functools.lru_cache(maxsize=1 << 17)
def _words(value: int, lang: str, to: str) -> str:
    """num2words(value, lang=lang, to=to) with normalised whitespace (cached)."""
    method = getattr(_converter(lang), f"to_{to}")
    return " ".join(method(value).split())


@functools.cache
def _converter(lang: str) -> Any:
    """A num2words converter for ``lang`` that is faster on numbers up to 10**9.

    num2words' ``splitnum`` scans every number word of the language, down from 10**600, comparing
    big integers; a copy of the converter that only knows the number words up to 10**9 produces
    the same text for our values several times faster. The copy is checked against num2words on
    sample values and the original converter is used if anything differs.
    """
    original = CONVERTER_CLASSES[lang]
    cards = getattr(original, "cards", None)
    if not isinstance(cards, OrderedDict):
        return original
    fast = copy.copy(original)
    fast.cards = OrderedDict((k, v) for k, v in cards.items() if k <= _CARDS_LIMIT)
    samples = (0, 1, 7, 21, 99, 101, 312, 1000, 1984, 2005, 99_999, 100_000, 999_999, 1_000_000)
    for to in ("cardinal", "ordinal", "year"):
        for value in samples:
            if to == "ordinal" and value == 0:
                continue
            if getattr(fast, f"to_{to}")(value) != num2words(value, lang=lang, to=to):
                return original
    return fast


@dataclass(frozen=True)
class Variant:
    """A held-out pair's source as someone might type it.

    Attributes:
        pair: The held-out pair (its ``source`` is the canonical spelling, ``target`` the answer).
        text: The variant source text.
        kind: One of ``VARIANT_KINDS``.
    """

    pair: Pair
    text: str
    kind: str


_VARIANT_RULES: dict[str, Any] = {
    "capitalised": lambda text, rng: text[:1].upper() + text[1:],
    "upper": lambda text, rng: text.upper(),
    "title": lambda text, rng: " ".join(w.capitalize() for w in text.split(" ")),
    "spaces": lambda text, rng: _spaced(text, rng),
    "hyphen_as_space": lambda text, rng: text.replace("-", " "),
    "spaced_hyphen": lambda text, rng: text.replace("-", " - "),
    "full_stop": lambda text, rng: text + ".",
    "no_and": lambda text, rng: text.replace(" and ", " ").replace(",", ""),
    "a_for_one": lambda text, rng: _a_for_one(text),
}


def variant_sources(pairs: list[Pair], seed: int = 0) -> list[Variant]:
    """The variants suite: every pair's source in every ``VARIANT_KINDS`` way that changes it.

    Deterministic for ``(pairs, seed)``. A kind that would leave a source unchanged (no hyphen
    to replace, no "and" to drop, no "one hundred" to write as "a hundred") gives no variant.

    Args:
        pairs: Held-out pairs (``generate_pairs(..., split="test")``).
        seed: Seeds the random parts (where spaces go, which kinds are combined).

    Returns:
        The variants, pair by pair, in ``VARIANT_KINDS`` order.
    """
    rng = np.random.default_rng(seed)
    single = [kind for kind in VARIANT_KINDS if kind != "combined"]
    variants = []
    for pair in pairs:
        for kind in VARIANT_KINDS:
            if kind == "combined":
                chosen = rng.choice(len(single), size=int(rng.integers(2, 5)), replace=False)
                kinds = [single[i] for i in sorted(chosen)]
            else:
                kinds = [kind]
            text = pair.source
            for name in sorted(kinds, key=_APPLY_ORDER.index):
                text = _VARIANT_RULES[name](text, rng)
            if text != pair.source:
                variants.append(Variant(pair, text, kind))
    return variants


# Word-level changes first, then case, then spacing and the full stop (so that they survive).
_APPLY_ORDER = (
    "no_and",
    "a_for_one",
    "hyphen_as_space",
    "spaced_hyphen",
    "capitalised",
    "upper",
    "title",
    "full_stop",
    "spaces",
)


def _spaced(text: str, rng: np.random.Generator) -> str:
    """Whitespace around the text and a doubled (or tabbed) gap between two words."""
    words = text.split(" ")
    if len(words) > 1:
        gap = int(rng.integers(0, len(words) - 1))
        words[gap] += str(rng.choice(["  ", " \t", "   "])).removesuffix(" ")
    before, after = (str(rng.choice(["", " ", "  ", "\t", "\n"])) for _ in range(2))
    return before + " ".join(words) + after + (" " if not after else "")


def _a_for_one(text: str) -> str:
    """ "one hundred" / "one thousand" written "a hundred" / "a thousand" where they start the
    number (the first word, or the word after a phrase's noun)."""
    words = text.split(" ")
    nouns = {template.english.split(" ")[0] for template in TEMPLATES}
    for i in range(len(words) - 1):
        starts = i == 0 or words[i - 1] in nouns
        if starts and words[i] == "one" and words[i + 1] in ("hundred", "thousand"):
            words[i] = "a"
            return " ".join(words)
    return text
