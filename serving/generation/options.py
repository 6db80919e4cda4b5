"""Decoding options of one generation request, and their validation.

``DecodingOptions`` is what the servicer builds from a request; ``validate`` checks every field
against its allowed range and resolves ``max_new_tokens`` against the model's limit, raising
``InvalidArgument`` with a message that names the field, the bad value and the valid range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral, Real

from serving.errors import InvalidArgument

MAX_BEAM_SIZE = 8
MAX_TEMPERATURE = 100.0
MAX_LENGTH_PENALTY = 10.0
MAX_SEED = 2**64 - 1
MAX_REPETITION_PENALTY = 100.0
MAX_SAMPLES = 16  # outputs of one sampled text: the output and its alternatives
MAX_BAD_WORDS = 64  # ``bad_words`` entries of one request
MAX_STOP = 16  # ``stop`` strings of one request
MAX_WORD_CHARS = 256  # characters of one bad word or stop string
MAX_TOP_LOG_PROBS = 20  # ``top_log_probs`` of one request (OpenAI's and vLLM's cap)


@dataclass(frozen=True)
class DecodingOptions:
    """How to pick the tokens of one request.

    Attributes:
        max_new_tokens: the most tokens to generate (EOS included); None means the model limit.
        min_new_tokens: EOS is suppressed until this many tokens have been generated.
        beam_size: beams of beam search; 1 means greedy or sampling.
        length_penalty: beam search scores are ``log_prob / length ** length_penalty``.
        temperature: 0 means greedy; above 0 samples from ``softmax(logits / temperature)``.
        top_k: sample among the k most likely tokens only; 0 turns the filter off.
        top_p: nucleus sampling: the smallest set of tokens whose probability reaches top_p.
        seed: seeds the request's own random generator (reproducible output); None = random.
        num_alternatives: beam search also returns this many runner-up hypotheses; sampling
            this many further samples (the i-th drawn with ``seed + i``).
        repetition_penalty: tokens already in the output score ``s * p`` (s < 0) or ``s / p``;
            1 = off (``serving.generation.history_rules``).
        no_repeat_ngram_size: no n-gram of this size occurs twice in the output; 0 = off.
        return_log_probs: report each chosen token's log-probability and, for greedy decoding
            and sampling, the output's score as their sum (``serving.generation.sampling.
            RowSampler``; beam search: each hypothesis's tokens', ``BeamSearch``).
        bad_words: texts the output must not contain, each tokenized as the target side writes
            it (``serving.served.inputs.BadWords``; applied by ``serving.generation.
            history_rules``).
        stop: strings that end the output where they first appear in its text; the text ends
            before the stop string (``serving.generation.stop``); greedy decoding and sampling.
        top_log_probs: with ``return_log_probs``, also this many most likely tokens at each
            output position and their log-probabilities, from the distribution the chosen
            token's log-probability comes from (with beam search, in the beam the token came
            through); 0 = none.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    beam_size: int = 1
    length_penalty: float = 1.0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    num_alternatives: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    return_log_probs: bool = False
    bad_words: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    top_log_probs: int = 0

    @property
    def sampling(self) -> bool:
        """True when tokens are drawn at random (temperature above 0)."""
        return self.temperature > 0

    def validate(self, max_new_tokens_limit: int, prefix_tokens: int = 0) -> DecodingOptions:
        """Check every field and resolve ``max_new_tokens`` against the model's limit.

        Args:
            max_new_tokens_limit: the most new tokens this model can produce (at least 1).
            prefix_tokens: the tokens of the request's target prefix, which count toward that
                limit (below it: the caller checks that first).

        Returns:
            A copy with ``max_new_tokens`` set (the limit less the prefix when it was None):
            the tokens to generate after the prefix.

        Raises:
            InvalidArgument: a field is of the wrong type, not finite, or outside its range; the
                message names the field, its value and what is allowed.
            ValueError: ``max_new_tokens_limit`` is below 1 (a configuration bug, not a request
                error).
        """
        if max_new_tokens_limit < 1:
            raise ValueError(f"max_new_tokens_limit must be at least 1, got {max_new_tokens_limit}")
        if not 0 <= prefix_tokens < max_new_tokens_limit:
            raise ValueError(
                f"prefix_tokens {prefix_tokens} leaves no room below {max_new_tokens_limit}"
            )
        max_new = self._check_max_new_tokens(max_new_tokens_limit, prefix_tokens)
        _check_int("min_new_tokens", self.min_new_tokens, 0, None)
        if self.min_new_tokens > max_new:
            raise InvalidArgument(
                f"min_new_tokens {self.min_new_tokens} exceeds max_new_tokens {max_new}: "
                f"min_new_tokens must be in 0..{max_new}"
            )
        _check_int("beam_size", self.beam_size, 1, MAX_BEAM_SIZE)
        _check_float("length_penalty", self.length_penalty, 0.0, MAX_LENGTH_PENALTY)
        _check_float("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_int("top_k", self.top_k, 0, None)
        self._check_top_p()
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        self._check_num_alternatives()
        self._check_repetition_penalty()
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, None)
        self._check_return_log_probs()
        self._check_top_log_probs()
        bad_words = _check_strings("bad_words", self.bad_words, MAX_BAD_WORDS, blank=False)
        stop = _check_strings("stop", self.stop, MAX_STOP, blank=True)
        if stop and self.beam_size > 1:
            raise InvalidArgument(
                f"stop strings end one output as it is written; beam search (beam_size "
                f"{self.beam_size}) keeps several: use beam_size 1 with stop, or leave stop empty"
            )
        if self.beam_size > 1 and self.temperature > 0:
            raise InvalidArgument(
                f"beam_size {self.beam_size} cannot be combined with sampling (temperature "
                f"{self.temperature}): use beam_size 1 to sample, or temperature 0 for beam search"
            )
        return replace(self, max_new_tokens=max_new, bad_words=bad_words, stop=stop)

    def _check_max_new_tokens(self, limit: int, prefix_tokens: int) -> int:
        room = limit - prefix_tokens
        if self.max_new_tokens is None:
            return room
        _check_int("max_new_tokens", self.max_new_tokens, 1, None)
        if self.max_new_tokens > room:
            prefix = f" less the target prefix's {prefix_tokens} tokens" if prefix_tokens else ""
            raise InvalidArgument(
                f"max_new_tokens {self.max_new_tokens} exceeds this model's limit of {limit}"
                f"{prefix}: ask for 1..{room} (or leave it unset for the limit)"
            )
        return int(self.max_new_tokens)

    def _check_num_alternatives(self) -> None:
        _check_int("num_alternatives", self.num_alternatives, 0, None)
        if self.sampling and self.beam_size == 1:  # further samples
            if self.num_alternatives > MAX_SAMPLES - 1:
                raise InvalidArgument(
                    f"num_alternatives {self.num_alternatives} asks for more than {MAX_SAMPLES} "
                    f"samples of a text: with sampling it must be in 0..{MAX_SAMPLES - 1}"
                )
            return
        if self.num_alternatives > self.beam_size - 1:
            raise InvalidArgument(
                f"num_alternatives {self.num_alternatives} needs more beams than beam_size "
                f"{self.beam_size}: num_alternatives must be in 0..beam_size-1 "
                f"(0..{self.beam_size - 1}); raise beam_size, sample (temperature > 0) or ask "
                "for fewer alternatives"
            )

    def _check_return_log_probs(self) -> None:
        if not isinstance(self.return_log_probs, bool):
            raise InvalidArgument(
                f"return_log_probs must be true or false, got {self.return_log_probs!r}"
            )

    def _check_top_log_probs(self) -> None:
        _check_int("top_log_probs", self.top_log_probs, 0, MAX_TOP_LOG_PROBS)
        if not self.top_log_probs:
            return
        if not self.return_log_probs:
            raise InvalidArgument(
                f"top_log_probs {self.top_log_probs} needs return_log_probs: set it to true, or "
                "top_log_probs to 0"
            )

    def _check_repetition_penalty(self) -> None:
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, MAX_REPETITION_PENALTY)
        if self.repetition_penalty == 0:
            raise InvalidArgument(
                "repetition_penalty 0 is not a penalty: it must be in (0, "
                f"{MAX_REPETITION_PENALTY:g}] (1 = off, above 1 discourages repeats)"
            )

    def _check_top_p(self) -> None:
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0:
            raise InvalidArgument("top_p 0 keeps no token: top_p must be in (0, 1] (1 = off)")


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    """Raise InvalidArgument unless ``value`` is an integer in [low, high] (high None = no cap)."""
    wanted = f"in {low}..{high}" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidArgument(f"{name} must be an integer {wanted}, got {value!r}")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise InvalidArgument(f"{name} {number} is out of range: must be {wanted}")


def _check_strings(name: str, value: object, most: int, blank: bool) -> tuple[str, ...]:
    """``value`` as a tuple of at most ``most`` distinct non-empty strings of at most
    ``MAX_WORD_CHARS`` characters each (first occurrence order; ``blank``: whitespace alone
    allowed); InvalidArgument otherwise."""
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise InvalidArgument(f"{name} must be a list of strings, got {value!r}")
    for index, text in enumerate(value):
        if not isinstance(text, str) or not (text if blank else text.strip()):
            raise InvalidArgument(
                f"{name}[{index}] must be a non-empty string, got {text!r}: remove it"
            )
        if len(text) > MAX_WORD_CHARS:
            raise InvalidArgument(
                f"{name}[{index}] is {len(text)} characters long: send at most {MAX_WORD_CHARS}"
            )
    strings = tuple(dict.fromkeys(value))
    if len(strings) > most:
        raise InvalidArgument(f"{name} holds {len(strings)} strings: send at most {most}")
    return strings


def _check_float(name: str, value: object, low: float, high: float) -> None:
    """Raise InvalidArgument unless ``value`` is a finite real number in [low, high]."""
    wanted = f"a finite number in [{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgument(f"{name} must be {wanted}, got {value!r}")
    if not math.isfinite(float(value)):
        raise InvalidArgument(f"{name} {value} is not finite: must be {wanted}")
    if not low <= float(value) <= high:
        raise InvalidArgument(f"{name} {value} is out of range: must be {wanted}")
