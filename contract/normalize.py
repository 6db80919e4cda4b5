"""Source-text normalisation: what people type -> the text a model was trained on.

A normaliser is a sequence of named steps (``NORMALIZER_STEPS``). A model's steps are stored with
it (a checkpoint's ``normalizer.json``, an entry's ``config.yaml`` ``tokenizer.normalizer``) and
applied identically wherever its source text is made: training, evaluation and serving. Every
step must be the identity on the training sources, so that normalising changes nothing the model
has seen and only maps variants onto it (tests check this on the number phrases).

The ``en_number_words`` step is the grammar of the English number phrases the shipped translator
reads (num2words' spelling): tens and units joined by a hyphen (``forty-two``, ``twenty-first``,
``nineteen oh-five``), ``and`` after ``hundred`` before a smaller number (``three hundred and
twelve``), ``, `` after ``thousand`` before a hundreds group and ``and`` before a smaller number
(``one thousand, two hundred`` / ``one thousand and twelve``), ``one`` for ``a`` before
``hundred`` / ``thousand`` / ``million``.

Part of ``contract``: no torch, numpy only where needed (none here).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

NORMALIZER_FILE = "normalizer.json"

_UNITS = "one|two|three|four|five|six|seven|eight|nine"
_UNIT_ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TEENS = (
    "ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen"
    "|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth"
    "|eighteenth|nineteenth"
)
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_TENS_ORDINALS = "twentieth|thirtieth|fortieth|fiftieth|sixtieth|seventieth|eightieth|ninetieth"
# The first word of a number below one hundred (cardinal or ordinal).
_SMALL = rf"(?:{_UNITS}|{_UNIT_ORDINALS}|{_TEENS}|{_TENS}|{_TENS_ORDINALS})"
_COMPOUND = re.compile(rf"\b({_TENS}|oh)[\s-]+({_UNITS}|{_UNIT_ORDINALS})\b")
_HUNDRED_AND = re.compile(rf"\bhundred (?={_SMALL}\b)")
_THOUSAND_COMMA = re.compile(rf"\bthousand(?:,| and)? (?={_SMALL}\S* hundred(?:th)?\b)")
_THOUSAND_AND = re.compile(rf"\bthousand,? (?={_SMALL}\b(?!\S* hundred(?:th)?\b))")
_A_MULTIPLIER = re.compile(r"\ba (?=(?:hundred|thousand|million)\b)")
_DASHES = re.compile(r"\s*[-\u2010\u2011\u2012\u2013\u2014\u2212]\s*")
_FINAL_STOPS = re.compile(r"[\s.!?]+$")
_SPACES = re.compile(r"\s+")
_COMMAS = re.compile(r"(?<=\w)\s*,\s*(?=\w)")


def _en_number_words(text: str) -> str:
    text = _COMMAS.sub(", ", text)
    text = _A_MULTIPLIER.sub("one ", text)
    text = _COMPOUND.sub(r"\1-\2", text)
    text = _HUNDRED_AND.sub("hundred and ", text)
    text = _THOUSAND_COMMA.sub("thousand, ", text)
    return _THOUSAND_AND.sub("thousand and ", text)


# name -> (function, what it does); the order of a normaliser is the order of its steps.
NORMALIZER_STEPS: dict[str, tuple[Callable[[str], str], str]] = {
    "nfkc": (lambda t: unicodedata.normalize("NFKC", t), "Unicode NFKC (no-break spaces...)"),
    "lowercase": (str.lower, "lower case"),
    "whitespace": (lambda t: _SPACES.sub(" ", t).strip(), "one space between words, none around"),
    "final_stop": (lambda t: _FINAL_STOPS.sub("", t), "no full stop (or ! ?) at the end"),
    "hyphens": (lambda t: _DASHES.sub("-", t), "dashes as '-', no spaces around them"),
    "en_number_words": (_en_number_words, "English number phrases in num2words' spelling"),
}


class NormalizerError(ValueError):
    """An unknown normaliser step, or an unreadable normalizer.json."""


class SourceNormalizer:
    """Applies named normalisation steps in order (see ``NORMALIZER_STEPS``).

    Args:
        steps: Step names, in the order they run; () normalises nothing.

    Raises:
        NormalizerError: For an unknown step name.
    """

    def __init__(self, steps: Sequence[str] = ()) -> None:
        self.steps = check_steps(steps)
        self._functions = [NORMALIZER_STEPS[name][0] for name in self.steps]

    def __call__(self, text: str) -> str:
        """The normalised text.

        Args:
            text: What the user sent.

        Returns:
            The text after every step.
        """
        for function in self._functions:
            text = function(text)
        return text

    def __bool__(self) -> bool:
        return bool(self.steps)


def check_steps(steps: Sequence[str]) -> tuple[str, ...]:
    """The step names as a tuple, each checked to exist.

    Args:
        steps: Step names.

    Returns:
        The same names.

    Raises:
        NormalizerError: For a name that is no step (the message lists the known ones).
    """
    unknown = [name for name in steps if name not in NORMALIZER_STEPS]
    if unknown:
        raise NormalizerError(
            f"normalizer steps {unknown} must be among: {', '.join(NORMALIZER_STEPS)}"
        )
    return tuple(steps)


def write_normalizer(directory: str | Path, steps: Sequence[str]) -> Path:
    """Write DIR/normalizer.json (a checkpoint's normaliser).

    Args:
        directory: The checkpoint directory (created if needed).
        steps: The step names.

    Returns:
        The written file.

    Raises:
        NormalizerError: For an unknown step name.
    """
    path = Path(directory) / NORMALIZER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": list(check_steps(steps))}, indent=2) + "\n")
    return path


def read_normalizer(directory: str | Path) -> tuple[str, ...]:
    """The steps of DIR/normalizer.json; () when the directory has none.

    Args:
        directory: A checkpoint directory.

    Returns:
        The step names.

    Raises:
        NormalizerError: For a file that is not ``{"source": [step, ...]}`` with known steps.
    """
    path = Path(directory) / NORMALIZER_FILE
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise NormalizerError(f"{path}: invalid JSON ({err})") from err
    steps = data.get("source") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise NormalizerError(f'{path}: expected {{"source": [step names]}}, got {data!r}')
    return check_steps(steps)
