"""Subword (BPE) tokenizer trained by the project, shared by training, export and serving.

The tokenizer wraps a Hugging Face ``tokenizers`` BPE model configured sentencepiece-style: an
NFC normalizer, a ``Metaspace`` pre-tokenizer (spaces become ``▁`` and start a new word) and the
matching ``Metaspace`` decoder, so that ``decode(encode(text)) == text`` for ordinary text made of
single-space separated words. The four special tokens always occupy the ids 0..3; extra special
tokens (for instance the language tags ``<2de>``) follow them and are encoded as single ids.

Part of ``contract``: no torch (the serving package imports it).
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
TOKENIZER_FILE = "tokenizer.json"

_METASPACE = "▁"
# Characters every tokenizer knows even when the training texts lack them, so that ordinary user
# input (digits, ASCII punctuation) does not collapse to <unk>.
_BASE_ALPHABET: tuple[str, ...] = tuple(string.ascii_letters + string.digits + string.punctuation)


class TokenizerError(ValueError):
    """Raised for a missing or corrupt tokenizer file, or an unknown token."""


class SubwordTokenizer:
    """A BPE tokenizer with fixed special-token ids and exact round trips for normal text.

    Build one with :meth:`train` or :meth:`load`; the constructor wraps an existing
    ``tokenizers.Tokenizer`` and checks that the special tokens sit at their fixed ids.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        """Wrap a ``tokenizers.Tokenizer``.

        Args:
            tokenizer: A tokenizer whose vocabulary starts with ``SPECIAL_TOKENS`` at ids 0..3.

        Raises:
            TokenizerError: If a special token is missing or has the wrong id.
        """
        _check_special_ids(tokenizer)
        self._tokenizer = tokenizer
        # Fixed once wrapped; decode checks ids against it for every streamed token.
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._special_ids = frozenset(
            token_id
            for token_id, added in tokenizer.get_added_tokens_decoder().items()
            if added.special
        )

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        extra_special_tokens: Sequence[str] = (),
    ) -> SubwordTokenizer:
        """Train a BPE tokenizer on ``texts``; the result depends only on the inputs.

        Args:
            texts: Training sentences (consumed once; NFC-normalised before training).
            vocab_size: Target vocabulary size including special tokens and the alphabet. The
                result can be larger when the alphabet alone exceeds it.
            extra_special_tokens: Additional special tokens (e.g. ``"<2de>"``), given ids right
                after the four fixed special tokens, in this order.

        Returns:
            The trained tokenizer.

        Raises:
            ValueError: If ``vocab_size`` is too small, no text is given, or an extra special
                token is empty, duplicated, contains whitespace or repeats a fixed one.
        """
        extras = _validate_extra_tokens(extra_special_tokens)
        specials = [*SPECIAL_TOKENS, *extras]
        if vocab_size <= len(specials):
            raise ValueError(
                f"vocab_size={vocab_size} leaves no room for subwords after {len(specials)} "
                "special tokens; use a vocab_size of at least a few hundred"
            )
        corpus = [unicodedata.normalize("NFC", text) for text in texts]
        if not corpus:
            raise ValueError("cannot train a tokenizer on an empty corpus; pass some texts")
        tokenizer = _empty_tokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=0,
            show_progress=False,
            special_tokens=specials,
            initial_alphabet=_alphabet(corpus),
        )
        tokenizer.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str | Path) -> SubwordTokenizer:
        """Load a tokenizer saved by :meth:`save`.

        Args:
            path: A directory holding ``tokenizer.json``, or the JSON file itself.

        Returns:
            The loaded tokenizer.

        Raises:
            TokenizerError: If the file is missing, unreadable, corrupt or lacks the special
                tokens at their fixed ids.
        """
        file = Path(path)
        if file.is_dir():
            file = file / TOKENIZER_FILE
        if not file.is_file():
            raise TokenizerError(
                f"no {TOKENIZER_FILE} at {file}; train one with SubwordTokenizer.train(...) and "
                "save it with .save(DIR), or pass the directory that holds it"
            )
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises a bare Exception for parse errors
            raise TokenizerError(
                f"{file} is not a valid tokenizer file ({err}); re-create it with "
                "SubwordTokenizer.train(...).save(DIR)"
            ) from err
        try:
            return cls(tokenizer)
        except TokenizerError as err:
            raise TokenizerError(f"{file}: {err}") from err

    def save(self, directory: str | Path) -> Path:
        """Write ``DIR/tokenizer.json`` (creating ``DIR`` if needed).

        Args:
            directory: Destination directory.

        Returns:
            The path of the written file.
        """
        out_dir = Path(directory)
        out_dir.mkdir(parents=True, exist_ok=True)
        file = out_dir / TOKENIZER_FILE
        file.write_text(self.to_json(), encoding="utf-8")
        return file

    def to_json(self) -> str:
        """Return the serialised tokenizer (the content of ``tokenizer.json``)."""
        return self._tokenizer.to_str(pretty=True)

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        """Encode one text to ids; characters the tokenizer never saw become ``<unk>``.

        Args:
            text: The text; special tokens written in it (``"<2de> three"``) map to their ids.
            add_eos: Append ``</s>`` (no ``<s>`` is ever added).

        Returns:
            The token ids.
        """
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [*ids, EOS_ID] if add_eos else list(ids)

    def encode_target(self, text: str) -> list[int]:
        """Ids of an output text as the decoder generates them (no ``</s>``)."""
        return self.encode(text, add_eos=False)

    def encode_batch(self, texts: Sequence[str], add_eos: bool = True) -> list[list[int]]:
        """Encode several texts (in parallel inside ``tokenizers``).

        Args:
            texts: The texts.
            add_eos: Append ``</s>`` to each sequence.

        Returns:
            One id list per text, unpadded.
        """
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        suffix = [EOS_ID] if add_eos else []
        return [[*enc.ids, *suffix] for enc in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode ids back to text.

        Args:
            ids: Token ids (e.g. a generated sequence, possibly with padding after ``</s>``).
            skip_special_tokens: Drop special tokens (pad, eos, unk, language tags...).

        Returns:
            The text.

        Raises:
            TokenizerError: If an id is outside the vocabulary.
        """
        id_list = [int(i) for i in ids]
        self._check_ids(id_list)
        return self._tokenizer.decode(id_list, skip_special_tokens=skip_special_tokens)

    def decode_batch(
        self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        """Decode several id sequences.

        Args:
            batch: Id sequences.
            skip_special_tokens: Drop special tokens.

        Returns:
            One text per sequence.

        Raises:
            TokenizerError: If an id is outside the vocabulary.
        """
        id_lists = [[int(i) for i in ids] for ids in batch]
        for id_list in id_lists:
            self._check_ids(id_list)
        return self._tokenizer.decode_batch(id_lists, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int:
        """Return the id of a token (e.g. ``"<2de>"``).

        Args:
            token: The token string.

        Returns:
            Its id.

        Raises:
            TokenizerError: If the vocabulary has no such token.
        """
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise TokenizerError(
                f"token {token!r} is not in the vocabulary; special tokens must be passed as "
                "extra_special_tokens when training"
            )
        return token_id

    def id_to_token(self, token_id: int) -> str:
        """Return the token string of an id.

        Args:
            token_id: The id.

        Returns:
            The token.

        Raises:
            TokenizerError: If the id is outside the vocabulary.
        """
        token = self._tokenizer.id_to_token(int(token_id))
        if token is None:
            raise TokenizerError(
                f"id {token_id} is outside the vocabulary (size {self.vocab_size})"
            )
        return token

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._vocab_size

    @property
    def pad_id(self) -> int:
        """Id of ``<pad>``."""
        return PAD_ID

    @property
    def bos_id(self) -> int:
        """Id of ``<s>``."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """Id of ``</s>``."""
        return EOS_ID

    @property
    def unk_id(self) -> int:
        """Id of ``<unk>``."""
        return UNK_ID

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of all special tokens, the extra ones included."""
        return self._special_ids

    def _check_ids(self, ids: list[int]) -> None:
        size = self._vocab_size
        if not ids or (min(ids) >= 0 and max(ids) < size):
            return
        bad = [i for i in ids if not 0 <= i < size]
        raise TokenizerError(
            f"ids {bad[:5]} are outside the vocabulary (size {size}); was the model trained "
            "with a different tokenizer?"
        )


def _empty_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_METASPACE, prepend_scheme="always", split=True
    )
    tokenizer.decoder = decoders.Metaspace(
        replacement=_METASPACE, prepend_scheme="always", split=True
    )
    return tokenizer


def _alphabet(corpus: list[str]) -> list[str]:
    chars = set(_BASE_ALPHABET)
    chars.add(_METASPACE)
    for text in corpus:
        chars.update(text)
    chars.discard(" ")  # spaces are replaced by the metaspace symbol
    return sorted(chars)


def _validate_extra_tokens(tokens: Sequence[str]) -> list[str]:
    extras = list(tokens)
    for token in extras:
        if not token or any(ch.isspace() for ch in token):
            raise ValueError(f"extra special token {token!r} must be non-empty without whitespace")
        if token in SPECIAL_TOKENS:
            raise ValueError(f"extra special token {token!r} repeats a fixed special token")
    if len(set(extras)) != len(extras):
        raise ValueError(f"extra special tokens {extras} contain duplicates")
    return extras


def _check_special_ids(tokenizer: Tokenizer) -> None:
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        actual = tokenizer.token_to_id(token)
        if actual != expected_id:
            raise TokenizerError(
                f"special token {token!r} has id {actual}, expected {expected_id}; the tokenizer "
                "was not trained with SubwordTokenizer.train"
            )
