"""Beam search for one request that occupies ``beam_size`` rows of the shared decode batch.

The engine runs the decoder for every row of every request together; after each step it hands
this request's rows of logits to ``BeamSearch.step``, reorders the request's KV-cache rows by the
returned ``parent_rows`` (new row i continues old row ``parent_rows[i]``) and feeds
``next_tokens`` as the next decoder input. The search is independent of the other rows of the
batch, so its result does not depend on the batch-mates.

Semantics follow Hugging Face ``transformers`` (v5 ``_beam_search``):

- candidates: the ``2 * beam_size`` best (row, token) pairs by cumulative log-probability
  (ties: lower row, then lower token id first);
- only the best ``beam_size`` candidates may become hypotheses: one ending in EOS is a finished
  hypothesis; on the step that reaches ``max_new_tokens`` every one of them is finalised (those
  without EOS as truncated, ``finished=False``);
- the best ``beam_size`` candidates not ending in EOS stay live;
- score = cumulative log-prob / length ** length_penalty, where length counts the generated
  tokens INCLUDING the EOS (HF's ``cur_len + 1 - decoder_prompt_len``); the decoder start token
  is not counted;
- EOS is suppressed (its log-prob set to -inf after the log-softmax, without renormalising, as
  HF's ``MinNewTokensLengthLogitsProcessor``) while fewer than ``min_new_tokens`` tokens exist;
- the model's suppressed tokens (``suppress_ids``: HF's ``bad_words_ids`` of one token) are set to
  -inf before the log-softmax, and on the last step (``forced_eos``: HF's
  ``forced_eos_token_id``) every token but EOS is, so EOS gets log-prob 0: HF's processors
  followed by its renormalisation (``renormalize_logits=True``, as Marian's generation configs
  set);
- stopping (``early_stopping``, as HF): ``False`` (default) stops once ``beam_size`` hypotheses
  are finished and the best live beam, scored at its current length, cannot beat the worst of
  them; ``True`` stops as soon as ``beam_size`` are finished; ``"never"`` uses an exact bound
  (the best live log-prob at ``max_new_tokens`` when length_penalty > 0) so no better hypothesis
  can be missed through stopping. The search always ends at ``max_new_tokens``.
- history rules (``rules``: ``repetition_penalty``, ``no_repeat_ngram_size``, bad words) apply,
  as in HF's beam search, to each beam's log-softmax over the whole vocabulary, before the token
  rules above and the renormalisation (``serving.generation.history_rules``).

- a target prefix (``prefix``): every beam starts with its tokens, which the engine feeds to the
  decoder before the search's first step (HF's ``decoder_input_ids`` after the start token). They
  are the hypotheses' first tokens and in the history the history rules read, not in the
  scores or lengths, nor in ``max_new_tokens`` / ``min_new_tokens`` (HF's ``decoder_prompt_len``).

First step: the request starts from the decoder start token (and the prefix), so all its beams
are identical.
``step`` accepts logits of shape (1, V) or (beam_size, V) on the first call and uses row 0 only
(every returned parent row is 0); afterwards it expects (beam_size, V).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from serving.generation.history_rules import HistoryRules
from serving.generation.ranking import top_indices
from serving.generation.sampling import clean_logits, log_softmax
from serving.generation.top_tokens import TopTokens, top_tokens

EarlyStopping = bool | Literal["never"]


@dataclass
class Hypothesis:
    """A candidate output of beam search.

    Attributes:
        tokens: the generated ids (the target prefix first), without the start token and
            without EOS.
        score: cumulative log-probability / length ** length_penalty (length includes EOS).
        finished: True when it ended with EOS; False when cut at max_new_tokens (or still live).
        log_probs: each token's log-probability where it was chosen (the log-softmax after the
            token rules; 0 for the prefix's), one per token; EOS's is in the score only.
        tops: with ``top``, each token's position's most likely tokens in the beam it came
            through (the prefix's: the token alone, 0), one per token; else empty.
    """

    tokens: list[int]
    score: float
    finished: bool
    log_probs: list[float] = field(default_factory=list)
    tops: list[TopTokens] = field(default_factory=list)


class BeamSearch:
    """Beam search state of one request.

    Args:
        beam_size: live beams (rows in the decode batch), at least 1.
        eos_id: the end-of-sequence token.
        max_new_tokens: the most tokens per hypothesis, EOS included (at least 1).
        min_new_tokens: EOS is impossible until this many tokens have been generated.
        length_penalty: exponent of the length normalisation (0 = raw log-prob; larger values
            favour longer hypotheses).
        num_alternatives: ``best`` returns up to ``1 + num_alternatives`` hypotheses
            (at most ``beam_size - 1``).
        early_stopping: ``False`` (HF's default heuristic), ``True`` or ``"never"`` (exact); see
            the module docstring.
        suppress_ids: tokens never chosen.
        forced_eos: the last step (``max_new_tokens``) chooses EOS.
        rules: repetition controls and bad words over each beam's tokens (None: none).
        prefix: the tokens every hypothesis starts with (see the module docstring).
        top: each hypothesis also carries, per token, the ``top`` most likely tokens of the
            beam's log-probabilities at that position (``top_log_probs``); 0 = none.

    Raises:
        ValueError: an argument outside its range.
    """

    def __init__(
        self,
        beam_size: int,
        eos_id: int,
        max_new_tokens: int,
        min_new_tokens: int = 0,
        length_penalty: float = 1.0,
        num_alternatives: int = 0,
        early_stopping: EarlyStopping = False,
        *,
        suppress_ids: tuple[int, ...] = (),
        forced_eos: bool = False,
        rules: HistoryRules | None = None,
        prefix: tuple[int, ...] = (),
        top: int = 0,
    ) -> None:
        _check_arguments(
            beam_size, eos_id, max_new_tokens, min_new_tokens, length_penalty, num_alternatives
        )
        if early_stopping not in (True, False, "never"):
            raise ValueError(
                f"early_stopping must be True, False or 'never', not {early_stopping!r}"
            )
        self.beam_size = int(beam_size)
        self.eos_id = int(eos_id)
        self.max_new_tokens = int(max_new_tokens)
        self.min_new_tokens = int(min_new_tokens)
        self.length_penalty = float(length_penalty)
        self.num_alternatives = int(num_alternatives)
        self.early_stopping = early_stopping
        self.suppress = np.asarray(sorted(set(suppress_ids)), dtype=np.int64)
        self.forced_eos = bool(forced_eos)
        self.rules = rules
        self.prefix = [int(token) for token in prefix]
        # live beams' tokens (rows, prefix + generated)
        self._sequences = np.asarray([self.prefix], dtype=np.int64).reshape(1, len(self.prefix))
        self._scores = np.zeros(1, dtype=np.float64)  # live beams' cumulative log-probs
        # live beams' tokens' own log-probabilities (the prefix's 0), as ``_sequences``
        self._token_log_probs = np.zeros((1, len(self.prefix)), dtype=np.float64)
        self.top = int(top)
        # with ``top``: live beams' tokens' positions' most likely tokens, as ``_sequences``
        self._tops: list[list[TopTokens]] = [[TopTokens.forced(t) for t in self.prefix]]
        self._step_tops: list[TopTokens] = []  # this step's, one per input row
        self._finished: list[Hypothesis] = []  # best first, at most beam_size
        self._generated = 0
        self._done = False

    @property
    def done(self) -> bool:
        """True when the search is over: call ``best`` and free the request's rows."""
        return self._done

    @property
    def generated(self) -> int:
        """How many steps (tokens per live beam) have been taken."""
        return self._generated

    @property
    def live_scores(self) -> np.ndarray:
        """Cumulative log-probabilities of the live beams (-inf marks a padding row)."""
        return self._scores.copy()

    def step(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every beam by one token.

        Args:
            logits: this request's rows of the decoder output for the newest position: (1, V)
                or (beam_size, V) on the first step (row 0 is used), (beam_size, V) afterwards.
                Any float dtype; NaN counts as -inf.

        Returns:
            ``(parent_rows, next_tokens)``, each int64 of shape (beam_size,): new row i continues
            input row ``parent_rows[i]`` with token ``next_tokens[i]``. When fewer than
            ``beam_size`` continuations are possible the rest repeat the best one (with a -inf
            score, so they never become hypotheses). After the step that sets ``done`` they
            need not be fed to the decoder.

        Raises:
            RuntimeError: the search is already done.
            ValueError: ``logits`` has the wrong shape or ``eos_id`` is not below V.
        """
        if self._done:
            raise RuntimeError("beam search is done: read best() instead of stepping again")
        log_probs = self._log_probs(logits)
        if self.top:
            self._step_tops = [top_tokens(row, self.top) for row in log_probs]
        scores, rows, tokens = self._candidates(log_probs)
        chosen = log_probs[rows, tokens]  # each candidate's own token's log-probability
        self._generated += 1
        last = self._generated >= self.max_new_tokens
        self._finalise(scores, rows, tokens, chosen, last)
        parents, next_tokens = self._keep_live(scores, rows, tokens, chosen)
        self._done = last or self._cannot_improve()
        return parents, next_tokens

    def best(self) -> list[Hypothesis]:
        """The best hypotheses, best first: at most ``1 + num_alternatives``, never empty.

        Before ``done`` (e.g. the engine stops the request at its position limit) the live beams
        count too, as unfinished hypotheses scored at their current length. If nothing was ever
        possible (all logits -inf or NaN) the single hypothesis is empty with score -inf.

        Returns:
            Hypotheses sorted by score, highest first.
        """
        pool = list(self._finished)
        if not self._done:
            pool.extend(self._live_hypotheses())
            pool.sort(key=lambda hyp: -hyp.score)
        if not pool:
            nothing = Hypothesis(
                list(self.prefix), float("-inf"), False, [0.0] * len(self.prefix), self._tops[0]
            )
            return [nothing]
        return pool[: 1 + self.num_alternatives]

    # --- one step -------------------------------------------------------------------------------
    def _log_probs(self, logits: np.ndarray) -> np.ndarray:
        """Log-softmax of the live rows (row 0 only on the first step), EOS suppressed if due."""
        x = clean_logits(logits)
        first = self._generated == 0
        allowed = (1, self.beam_size) if first else (self.beam_size,)
        if x.ndim != 2 or x.shape[0] not in allowed or not 0 <= self.eos_id < x.shape[1]:
            raise ValueError(
                f"expected logits of shape ({' or '.join(map(str, allowed))}, V) with "
                f"eos_id {self.eos_id} < V on step {self._generated}, got {x.shape}"
            )
        x = x[:1] if first else x
        if self.rules is not None:  # on log-probabilities, as HF's beam search
            if self.rules.penalty != 1:  # bans alone: the renormalisation below suffices
                x = log_softmax(x)
            for row, tokens in zip(x, self._sequences, strict=True):
                self.rules.apply(row, tokens)
        x[:, self.suppress[self.suppress < x.shape[1]]] = -np.inf
        if self.forced_eos and self._generated == self.max_new_tokens - 1:
            x[:] = -np.inf
            x[:, self.eos_id] = 0.0
        log_probs = log_softmax(x)
        if self._generated < self.min_new_tokens:
            log_probs[:, self.eos_id] = -np.inf
        return log_probs

    def _candidates(self, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The best ``2 * beam_size`` continuations: (scores, rows, tokens), best first."""
        total = (self._scores[:, None] + log_probs).ravel()
        flat = top_indices(total, 2 * self.beam_size)  # ties: lower row, then lower token
        vocab = log_probs.shape[1]
        return total[flat], flat // vocab, flat % vocab

    def _finalise(
        self,
        scores: np.ndarray,
        rows: np.ndarray,
        tokens: np.ndarray,
        chosen: np.ndarray,
        last: bool,
    ) -> None:
        """Make hypotheses of the top ``beam_size`` candidates that end (EOS or last step)."""
        denominator = float(self._generated) ** self.length_penalty
        for rank in range(min(self.beam_size, scores.size)):
            if not np.isfinite(scores[rank]):
                break  # sorted: the rest are impossible too
            ends = tokens[rank] == self.eos_id
            if not (ends or last):
                continue
            before = self._sequences[rows[rank]].tolist()
            hyp_tokens = before if ends else [*before, int(tokens[rank])]
            log_probs = self._token_log_probs[rows[rank]].tolist()
            tops = list(self._tops[rows[rank]]) if self.top else []
            if not ends:
                log_probs.append(float(chosen[rank]))
                if self.top:
                    tops.append(self._step_tops[rows[rank]])
            score = float(scores[rank]) / denominator
            self._add(Hypothesis(hyp_tokens, score, bool(ends), log_probs, tops))

    def _add(self, hypothesis: Hypothesis) -> None:
        self._finished.append(hypothesis)
        self._finished.sort(key=lambda hyp: -hyp.score)  # stable: earlier ones win ties
        del self._finished[self.beam_size :]

    def _keep_live(
        self, scores: np.ndarray, rows: np.ndarray, tokens: np.ndarray, chosen: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keep the best ``beam_size`` candidates that do not end in EOS as the live beams."""
        live = np.flatnonzero((tokens != self.eos_id) & np.isfinite(scores))[: self.beam_size]
        parents, next_tokens, live_scores = rows[live], tokens[live], scores[live]
        own = chosen[live]
        missing = self.beam_size - live.size
        if missing:
            fill = (parents[0], next_tokens[0]) if live.size else (0, self.eos_id)
            fill_parent, fill_token = fill
            parents = np.concatenate([parents, np.full(missing, fill_parent)])
            next_tokens = np.concatenate([next_tokens, np.full(missing, fill_token)])
            live_scores = np.concatenate([live_scores, np.full(missing, -np.inf)])
            own = np.concatenate([own, np.zeros(missing)])
        parents = parents.astype(np.int64)
        next_tokens = next_tokens.astype(np.int64)
        self._sequences = np.concatenate([self._sequences[parents], next_tokens[:, None]], axis=1)
        self._token_log_probs = np.concatenate(
            [self._token_log_probs[parents], own[:, None].astype(np.float64)], axis=1
        )
        if self.top:
            self._tops = [[*self._tops[p], self._step_tops[p]] for p in parents.tolist()]
        self._scores = live_scores.astype(np.float64)
        return parents, next_tokens

    def _cannot_improve(self) -> bool:
        """The stopping rule (``early_stopping``), checked after each step."""
        if not np.isfinite(self._scores).any():
            return True
        if len(self._finished) < self.beam_size:
            return False
        if self.early_stopping is True:
            return True
        exact = self.early_stopping == "never" and self.length_penalty > 0
        length = self.max_new_tokens if exact else self._generated
        best_possible = float(self._scores.max()) / float(length) ** self.length_penalty
        return best_possible <= self._finished[-1].score

    def _live_hypotheses(self) -> list[Hypothesis]:
        denominator = float(max(self._generated, 1)) ** self.length_penalty
        return [
            Hypothesis(
                self._sequences[row].tolist(),
                float(score) / denominator,
                False,
                self._token_log_probs[row].tolist(),
                list(self._tops[row]) if self.top else [],
            )
            for row, score in enumerate(self._scores)
            if np.isfinite(score)
        ]


def _check_arguments(
    beam_size: int,
    eos_id: int,
    max_new_tokens: int,
    min_new_tokens: int,
    length_penalty: float,
    num_alternatives: int,
) -> None:
    """Raise ValueError for arguments outside their ranges."""
    problems = []
    if beam_size < 1:
        problems.append(f"beam_size {beam_size} must be >= 1")
    if eos_id < 0:
        problems.append(f"eos_id {eos_id} must be >= 0")
    if max_new_tokens < 1:
        problems.append(f"max_new_tokens {max_new_tokens} must be >= 1")
    if not 0 <= min_new_tokens <= max_new_tokens:
        problems.append(f"min_new_tokens {min_new_tokens} must be in 0..max_new_tokens")
    if not np.isfinite(length_penalty):
        problems.append(f"length_penalty {length_penalty} must be finite")
    if not 0 <= num_alternatives <= beam_size - 1:
        problems.append(f"num_alternatives {num_alternatives} must be in 0..beam_size-1")
    if problems:
        raise ValueError("bad beam search arguments: " + "; ".join(problems))
