"""A Hugging Face model's generation config as the token rules serving applies to every request.

``generate()`` runs logits processors built from the model's ``generation_config``. Those that
change which token greedy decoding picks must be applied by serving too, or they are refused:

- applied: ``bad_words_ids`` of one token and ``suppress_tokens`` (never generated: Marian's
  ``[[pad]]``), ``bad_words_ids`` of several tokens (``DecoderSpec.bad_words``: every request
  bans them as it bans its own bad words), ``forced_eos_token_id`` (the last position is EOS);
- refused: ``begin_suppress_tokens``, the encoder's
  repetition penalty and n-gram ban, ``min_length`` / ``min_new_tokens``,
  ``forced_bos_token_id``, ``sequence_bias``;
- recorded, not applied: the request-level defaults (``num_beams``, ``do_sample``,
  ``temperature``, ..., ``repetition_penalty``, ``no_repeat_ngram_size``), which attnserve
  requests set themselves (greedy without repetition controls by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from export.hf.common import unsupported

# Processors that change greedy tokens, with the value that switches them off.
_REFUSED_WHEN_SET: dict[str, Any] = {
    "begin_suppress_tokens": None,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
}
# Request options (DecodingOptions), with the value that switches a control off (not recorded).
_REQUEST_DEFAULTS: dict[str, Any] = {
    "num_beams": None,
    "do_sample": None,
    "temperature": None,
    "top_k": None,
    "top_p": None,
    "length_penalty": None,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}


@dataclass(frozen=True)
class TokenRules:
    """The generation rules serving applies (``DecoderSpec.suppress_ids`` / ``bad_words`` /
    ``forced_eos``)."""

    suppress_ids: tuple[int, ...] = ()
    forced_eos: bool = False
    bad_words: tuple[tuple[int, ...], ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)


def token_rules(architecture: str, generation: Any, eos_id: int, vocab_size: int) -> TokenRules:
    """The rules of a model's ``generation_config``.

    Args:
        architecture: The HF architecture (for messages).
        generation: The loaded model's ``generation_config`` (what ``generate()`` uses).
        eos_id: Our model's end-of-sequence id.
        vocab_size: Our model's vocabulary size.

    Returns:
        The suppressed ids, whether EOS is forced at the last position, the banned sequences of
        several tokens, and notes for the manifest (the rules and the request defaults that
        were not applied).

    Raises:
        SourceError: For a processor serving does not apply, a forced EOS other than the
            model's EOS, or a suppressed id outside the vocabulary (or EOS itself).
    """
    for name, off in _REFUSED_WHEN_SET.items():
        value = getattr(generation, name, off)
        if value not in (off, None, [], {}):
            raise unsupported(architecture, f"generation config {name}={value!r} (not applied)")
    suppress, longer = _bans(generation)
    bad = [i for i in suppress if not 0 <= i < vocab_size or i == eos_id]
    bad += [i for word in longer for i in word if not 0 <= i < vocab_size]
    if bad:
        raise unsupported(architecture, f"suppressed token ids {bad} (vocab {vocab_size}, eos)")
    forced = getattr(generation, "forced_eos_token_id", None)
    if isinstance(forced, (list, tuple)):
        forced = forced[0] if len(set(forced)) == 1 else forced
    if forced is not None and forced != eos_id:
        raise unsupported(architecture, f"forced_eos_token_id={forced!r} is not eos {eos_id}")
    defaults = {
        name: getattr(generation, name)
        for name, off in _REQUEST_DEFAULTS.items()
        if getattr(generation, name, None) not in (None, off)
    }
    notes = {
        "suppress_ids": list(suppress),
        "bad_words": [list(word) for word in longer],
        "forced_eos": forced is not None,
        "request_defaults_not_applied": defaults,
    }
    return TokenRules(suppress, forced is not None, longer, notes)


def _bans(generation: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Ids of ``bad_words_ids`` entries of one token and of ``suppress_tokens``; the entries of
    several tokens (first occurrence order)."""
    banned: list[int] = []
    longer: dict[tuple[int, ...], None] = {}
    for sequence in getattr(generation, "bad_words_ids", None) or []:
        if len(sequence) == 1:
            banned.append(int(sequence[0]))
        elif sequence:
            longer[tuple(int(i) for i in sequence)] = None
    banned += [int(i) for i in getattr(generation, "suppress_tokens", None) or []]
    return tuple(sorted(set(banned))), tuple(longer)
