"""Next-token choice for one sequence from numpy logits: greedy, temperature, top-k, top-p.

Every row is handled on its own with the sequence's own random generator, so a request's output
never depends on which other requests share its decode batch: a seeded request gives the same
tokens alone or batched. The filtering matches ``models.generation.sample_next`` (the PyTorch
reference): temperature first, then top-k (ties with the k-th logit are kept), then top-p (a
token is kept while the probability mass of the tokens ranked before it is below ``top_p``, so
the most likely token always stays).

Logits may be float16, float32 or float64; the arithmetic is done in float64. NaN logits count
as impossible tokens (-inf) and +inf logits as the largest finite value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.generation.history_rules import HistoryRules
from serving.generation.options import DecodingOptions
from serving.generation.ranking import NUCLEUS_PREFIX, kth_largest
from serving.generation.row_draw import clean_in_place, float_row, ranked, sample_float_row
from serving.generation.top_tokens import NONE, TopTokens, top_tokens


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax.

    Args:
        logits: any shape; float16 is computed in float32, float32 and float64 in their own type.
        axis: the vocabulary axis.

    Returns:
        Log-probabilities with the shape of ``logits``; -inf logits give -inf, and a slice whose
        logits are all -inf gives -inf everywhere (not NaN).
    """
    x = np.asarray(logits)
    x = x.astype(np.promote_types(x.dtype, np.float32), copy=False)
    top = np.max(x, axis=axis, keepdims=True)
    if not np.isfinite(top).all():  # a slice of -inf only (or +inf): shift it by 0
        top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        out = np.subtract(shifted, lse, out=shifted)  # in place: a beam step's 4 x 32k values
    dead = np.isneginf(lse)
    if dead.any():
        out = np.where(dead, -np.inf, out)
    return out.astype(x.dtype, copy=False)


def clean_logits(logits: np.ndarray) -> np.ndarray:
    """A float64 copy of ``logits`` with NaN set to -inf and +inf to the largest float.

    Args:
        logits: any shape and float dtype.

    Returns:
        A new float64 array of the same shape.
    """
    return clean_in_place(np.array(logits, dtype=np.float64))


def filter_logits(
    logits_row: np.ndarray, *, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """Apply temperature, top-k and top-p to one row, as ``sample_next`` does before its draw.

    Args:
        logits_row: (V,) logits of one sequence (any float dtype; NaN counts as -inf).
        temperature: above 0; the logits are divided by it.
        top_k: keep the tokens whose logit is at least the k-th largest; 0 (or >= V) = off.
        top_p: in (0, 1]; keep the smallest prefix of the tokens ranked by probability (ties in
            vocabulary order) whose mass reaches ``top_p``; 1 = off.

    Returns:
        (V,) float64 scaled logits, shifted so that the largest is 0, with -inf for every token
        that may not be drawn. At least one token stays finite when any input logit is finite.

    Raises:
        ValueError: bad options, or a row that is not 1-D or has no finite logit.
    """
    _check_sampling_options(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("filter_logits needs temperature > 0 (temperature 0 is greedy argmax)")
    x = clean_logits(logits_row)
    if x.ndim != 1:
        raise ValueError(f"expected one row of logits (V,), got shape {x.shape}")
    if not np.isfinite(x).any():
        raise ValueError("every logit is -inf or NaN: no token can be drawn")
    with np.errstate(over="ignore"):  # shifted first: only unlikely tokens can reach -inf
        x = (x - x.max()) / temperature
    if 0 < top_k < x.size:
        x[x < kth_largest(x, top_k)] = -np.inf
    if top_p < 1:
        _apply_top_p(x, top_p)
    return x


def _apply_top_p(x: np.ndarray, top_p: float) -> None:
    """Set to -inf (in place) every token outside the nucleus of mass ``top_p``.

    The tokens are ranked by probability, ties in vocabulary order. A token is kept while the
    mass ranked strictly before it is below ``top_p``; tokens whose probability underflows to 0
    are dropped. Only the best ``NUCLEUS_PREFIX`` tokens
    (and their ties) are sorted when they already hold ``top_p`` of the mass: every other token
    then has at least that mass before it, so the result equals a full sort's.
    """
    probs = _exp_from_max(x)
    probs /= probs.sum()
    candidates = np.flatnonzero(probs > 0)  # zero-probability tokens are never drawn anyway
    if candidates.size > NUCLEUS_PREFIX:
        live = probs[candidates]
        threshold = kth_largest(live, NUCLEUS_PREFIX)
        order, before, total = _ranked_mass(probs, candidates[live >= threshold])
        if total < top_p:  # the nucleus reaches past the prefix: rank every token
            order, before, total = _ranked_mass(probs, candidates)
    else:
        order, before, total = _ranked_mass(probs, candidates)
    keep = np.zeros(x.size, dtype=bool)
    keep[order[before < top_p]] = True
    x[~keep] = -np.inf


def _exp_from_max(x: np.ndarray) -> np.ndarray:
    """``np.exp(x - x.max())`` of a row with a finite largest value, value for value, with exp
    computed only where ``x`` is finite (-inf gives 0): after top-k nearly every logit is -inf,
    and numpy's exp of -inf takes its slow path (25 against 7 µs over 8,000 values, Zen 4 VM)."""
    top = x.max()
    finite = x != -np.inf
    if not np.isfinite(top) or finite.all():
        return np.exp(x - top)
    out = np.zeros_like(x)
    out[finite] = np.exp(x[finite] - top)
    return out


def _ranked_mass(probs: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Rank ``tokens`` (ascending ids) by probability; the mass before each and the total."""
    return ranked(tokens, probs[tokens])


def draw(filtered: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from ``softmax(filtered)`` with a single uniform number from ``rng``.

    Args:
        filtered: (V,) float64 logits from ``filter_logits`` (-inf = never drawn).
        rng: the sequence's generator; exactly one ``rng.random()`` is consumed.

    Returns:
        A token id whose probability is above 0.
    """
    weights = _exp_from_max(filtered)
    cumulative = np.cumsum(weights)
    target = rng.random() * cumulative[-1]
    token = int(np.searchsorted(cumulative, target, side="right"))
    if token >= weights.size:  # rounding put the target on the total: take the last possible
        token = int(np.flatnonzero(weights)[-1])
    return token


class RowSampler:
    """Chooses the next token of one sequence; owns the sequence's random generator.

    Args:
        options: the request's decoding options (temperature, top_k, top_p, seed,
            min_new_tokens are used).
        eos_id: the end-of-sequence token, suppressed while fewer than ``min_new_tokens`` tokens
            have been generated.
        rng: a generator to use instead of one seeded from ``options.seed`` (tests).
        suppress_ids: tokens never chosen (the model's ``DecoderSpec.suppress_ids``, e.g.
            Marian's pad: Hugging Face's ``bad_words_ids`` / ``suppress_tokens``).
        forced_eos_at: the token chosen after this many generated tokens is EOS (Hugging Face's
            ``forced_eos_token_id``: the sequence's last position); None = never forced.
        rules: the request's history rules, repetition controls and bad words (applied first,
            to the raw logits); ``choose`` then needs the tokens generated so far.
        prefix: the target prefix: ``choose`` returns its tokens first, whatever the logits
            (each with log-probability 0, as a forced EOS); ``min_new_tokens`` counts after it.

    Raises:
        ValueError: a negative ``eos_id`` or sampling options outside their ranges.
    """

    def __init__(
        self,
        options: DecodingOptions,
        eos_id: int,
        rng: np.random.Generator | None = None,
        *,
        suppress_ids: tuple[int, ...] = (),
        forced_eos_at: int | None = None,
        rules: HistoryRules | None = None,
        prefix: Sequence[int] = (),
    ) -> None:
        _check_sampling_options(options.temperature, options.top_k, options.top_p)
        if eos_id < 0:
            raise ValueError(f"eos_id must be a token id >= 0, got {eos_id}")
        self.options = options
        self.eos_id = int(eos_id)
        self.suppress = np.asarray(sorted(set(suppress_ids)), dtype=np.int64)
        self.forced_eos_at = forced_eos_at
        self.rules = rules
        self.prefix = tuple(int(token) for token in prefix)
        self.min_new = len(self.prefix) + options.min_new_tokens  # EOS suppressed below it
        # ``options.return_log_probs``: ``choose`` keeps the chosen token's log-probability
        self.log_probs = bool(options.return_log_probs)
        self.last_log_prob = 0.0
        # ``options.top_log_probs``: and the step's most likely tokens in ``last_top``
        self.top = int(options.top_log_probs) if self.log_probs else 0
        self.last_top = NONE
        self._rng = rng

    @property
    def rng(self) -> np.random.Generator:
        """The sequence's generator, made on the first draw: greedy rows never pay for it.
        default_rng(None) seeds from OS entropy; a seed in 0..2**64-1 makes the draws repeatable."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.options.seed)
        return self._rng

    def choose(
        self, logits_row: np.ndarray, generated: int, history: np.ndarray | None = None
    ) -> int:
        """The next token of this sequence.

        Args:
            logits_row: (V,) logits of this sequence's row (float16, float32 or float64).
            generated: how many tokens this sequence has generated before this one.
            history: those tokens (int64, without the start token); needed with ``rules``.

        Returns:
            The token id: the prefix's next one while it lasts (log-probability 0). Greedy
            (temperature 0) takes the argmax, lowest id on ties; sampling
            draws one uniform number from the sequence's generator. Suppressed tokens are never
            chosen; at ``forced_eos_at`` EOS is. When no token is possible (every logit -inf or
            NaN, or only EOS while it is suppressed) ``eos_id`` is returned so that the sequence
            ends instead of emitting an arbitrary token. With ``log_probs`` the token's
            log-probability goes to ``last_log_prob``: the log-softmax of the logits after the
            repetition controls and the token rules, before temperature, top-k and top-p (a
            forced EOS's is 0, an EOS chosen because nothing else is possible -inf).

        Raises:
            ValueError: ``logits_row`` is not 1-D or ``eos_id`` is not a valid index into it.
        """
        if generated < len(self.prefix):
            self.last_log_prob = 0.0
            self.last_top = TopTokens.forced(self.prefix[generated]) if self.top else NONE
            return self.prefix[generated]
        if generated == self.forced_eos_at:
            self.last_log_prob = 0.0
            self.last_top = TopTokens.forced(self.eos_id) if self.top else NONE
            return self.eos_id
        plain = self.rules is None and not self.log_probs
        if self.options.temperature == 0 and logits_row.ndim == 1 and plain:
            token = self._greedy(logits_row, generated)
            if token is not None:
                return token
        if logits_row.ndim != 1 or not 0 <= self.eos_id < logits_row.size:
            raise ValueError(
                f"expected one row of logits (V,) with eos_id {self.eos_id} < V, "
                f"got {logits_row.shape}"
            )
        x = float_row(logits_row)  # this thread's buffer: clean_logits without a fresh array
        if self.rules is not None:
            if history is None or len(history) != generated:
                raise ValueError(f"history rules need the {generated} tokens generated so far")
            self.rules.apply(x, history)
        if generated < self.min_new:
            x[self.eos_id] = -np.inf
        x[self.suppress[self.suppress < x.size]] = -np.inf
        if not np.isfinite(x).any():
            self.last_log_prob = -np.inf
            self.last_top = NONE
            return self.eos_id
        if self.log_probs:
            return self._scored(x)
        if self.options.temperature == 0:
            return int(np.argmax(x))
        options = self.options  # draw(filter_logits(x, ...), rng)'s token, in fewer passes
        return sample_float_row(x, options.temperature, options.top_k, options.top_p, self.rng)

    def _scored(self, x: np.ndarray) -> int:
        """``choose``'s token of the prepared row ``x`` (overwritten), its log-probability in
        ``last_log_prob`` (and with ``top`` the most likely tokens in ``last_top``)."""
        log_probs = log_softmax(x)  # a new array: the draw scales ``x`` in place
        if self.top:
            self.last_top = top_tokens(log_probs, self.top)
        options = self.options
        if options.temperature == 0:
            token = int(np.argmax(x))
        else:
            token = sample_float_row(x, options.temperature, options.top_k, options.top_p, self.rng)
        self.last_log_prob = float(log_probs[token])
        return token

    def _greedy(self, logits_row: np.ndarray, generated: int) -> int | None:
        """Greedy choice without the float64 copy; None where the general path must decide.

        ``np.argmax`` already takes the lowest id on ties and the first +inf; only a NaN winner
        (NaN compares above everything in argmax), a suppressed token or an EOS that must be
        suppressed needs the cleaned copy.
        """
        if not 0 <= self.eos_id < logits_row.size:
            return None
        token = int(np.argmax(logits_row))
        best = logits_row[token]
        if np.isnan(best) or (token == self.eos_id and generated < self.min_new):
            return None
        if self.suppress.size and token in self.suppress:
            return None
        if best == -np.inf:  # every logit is -inf: end the sequence
            return self.eos_id
        return token


def greedy_rows(
    logits: np.ndarray,
    generated: np.ndarray,
    min_new_tokens: np.ndarray,
    eos_id: int,
    suppress: np.ndarray,
    forced_eos_at: np.ndarray,
) -> np.ndarray:
    """Greedy tokens of many rows in one pass: what ``RowSampler.choose`` returns for each row
    whose temperature is 0, or -1 where it must decide (a NaN winner, a suppressed token, an EOS
    before ``min_new_tokens``).

    Args:
        logits: (N, V) one row per sequence.
        generated: (N,) tokens each sequence generated before this one.
        min_new_tokens: (N,) each sequence's ``min_new_tokens``.
        eos_id: the end-of-sequence token (0 <= eos_id < V).
        suppress: token ids never chosen (``RowSampler.suppress``).
        forced_eos_at: (N,) the ``generated`` at which EOS is forced, -1 for never.

    Returns:
        (N,) int64: the token, or -1 for ``RowSampler.choose`` to decide.
    """
    tokens = np.argmax(logits, axis=1)  # lowest id on ties, the first +inf, as per row
    best = logits[np.arange(len(tokens)), tokens]
    return greedy_decide(tokens, best, generated, min_new_tokens, eos_id, suppress, forced_eos_at)


def greedy_decide(
    tokens: np.ndarray,
    best: np.ndarray,
    generated: np.ndarray,
    min_new_tokens: np.ndarray,
    eos_id: int,
    suppress: np.ndarray,
    forced_eos_at: np.ndarray,
) -> np.ndarray:
    """``greedy_rows`` from each row's argmax ``tokens`` and its logit ``best`` (NaN where the
    row holds a NaN), as ``DecodeCache.step_greedy`` gives them; the other arguments are
    ``greedy_rows``'."""
    undecided = np.isnan(best)
    undecided |= (tokens == eos_id) & (generated < min_new_tokens)
    if suppress.size:
        undecided |= is_in(tokens, suppress)
    chosen = tokens.astype(np.int64)  # a copy
    chosen[best == -np.inf] = eos_id  # every logit -inf: end the sequence
    chosen[undecided] = -1
    chosen[generated == forced_eos_at] = eos_id
    return chosen


def is_in(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``np.isin(values, ids)``: for a few ids (a model's suppressed tokens) by comparing with
    each, about 7x faster than ``np.isin`` for a step's rows (it sorts)."""
    if ids.size > 16:
        return np.isin(values, ids)
    return (values[:, None] == ids).any(axis=1)


def _check_sampling_options(temperature: float, top_k: int, top_p: float) -> None:
    if not (np.isfinite(temperature) and temperature >= 0 and top_k >= 0 and 0 < top_p <= 1):
        raise ValueError(
            f"bad sampling options temperature={temperature} top_k={top_k} top_p={top_p}: "
            "need a finite temperature >= 0, top_k >= 0, 0 < top_p <= 1"
        )
