"""The tokenizer interface serving uses, and the tokenizers a repository entry can carry.

``TextTokenizer`` is what the served models need of a tokenizer: source text -> model input ids
(the end-of-sequence token included, as the model was trained), generated ids -> text, and the
vocabulary for input bounds. Three kinds implement it, named by an entry's config.yaml
``tokenizer.kind`` (``contract.model_config.TokenizerSpec``):

- ``subword``: ``contract.tokenizer.SubwordTokenizer`` (tokenizer.json), the models trained here;
- ``sentencepiece``: ``SentencePiecePair``, Marian's source.spm / target.spm / vocab.json,
  encoding and decoding as transformers' ``MarianTokenizer`` does;
- ``huggingface``: ``HuggingFaceTokenizer``, a ``tokenizers`` tokenizer.json (GPT-2's byte-level
  BPE, saved by transformers), decoding as transformers' tokenizers backend does.

Part of ``contract``: no torch and no transformers. ``sentencepiece`` is imported only when an
entry carries SentencePiece models.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tokenizers import Tokenizer

from contract.model_config import TokenizerSpec
from contract.tokenizer import TOKENIZER_FILE, SubwordTokenizer, TokenizerError

SOURCE_SPM, TARGET_SPM, VOCAB_FILE = "source.spm", "target.spm", "vocab.json"
SENTENCEPIECE_FILES: tuple[str, ...] = (SOURCE_SPM, TARGET_SPM, VOCAB_FILE)
_SPIECE_UNDERLINE = "▁"


@runtime_checkable
class TextTokenizer(Protocol):
    """What serving needs of a tokenizer (``SubwordTokenizer`` and the classes below)."""

    @property
    def vocab_size(self) -> int:
        """Number of ids."""

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids that decoding drops."""

    def encode(self, text: str) -> list[int]:
        """Model input ids of a source text, ending as the model's sources end (EOS)."""

    def encode_target(self, text: str) -> list[int]:
        """Ids of an output text as the decoder generates them: the target side's
        tokenization, no special tokens added (a target prefix)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of generated ids."""

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of an id."""


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: no space before punctuation and contractions.

    Args:
        text: Decoded text.

    Returns:
        The text with " ." -> ".", " n't" -> "n't", ... as transformers replaces them.
    """
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


class SentencePiecePair:
    """Marian's tokenizer: SentencePiece source and target models over one vocab.json.

    Encoding splits the text at the special tokens, takes a leading ``>>xx<<`` language code as
    one token, runs the source model on the rest, maps each piece through vocab.json (``<unk>``
    for pieces it lacks) and appends EOS, as ``MarianTokenizer`` does. Decoding drops special
    ids and joins the target model's pieces.

    Args:
        directory: The folder with source.spm, target.spm and vocab.json.
        spec: The entry's tokenizer section (special tokens, EOS and unknown tokens).

    Raises:
        TokenizerError: Missing or unreadable files, a vocab.json that is not a mapping of
            pieces to ids, special tokens it lacks, or no ``sentencepiece`` package.
    """

    def __init__(self, directory: str | Path, spec: TokenizerSpec) -> None:
        directory = Path(directory)
        self.source = _load_spm(directory / SOURCE_SPM)
        self.target = _load_spm(directory / TARGET_SPM)
        self.vocab = _read_vocab(directory / VOCAB_FILE)
        self.tokens = {token_id: piece for piece, token_id in self.vocab.items()}
        needed = dict.fromkeys((*spec.special_tokens, spec.eos_token, spec.unk_token))
        missing = [token for token in needed if token not in self]
        if missing:
            raise TokenizerError(f"{directory / VOCAB_FILE} lacks the special tokens {missing}")
        self.eos_id = self.vocab[spec.eos_token]
        self.unk_id = self.vocab[spec.unk_token]
        self.clean_up_spaces = spec.clean_up_spaces
        specials = sorted({*spec.special_tokens, spec.eos_token, spec.unk_token}, key=len)
        self._special_ids = frozenset(self.vocab[t] for t in specials)
        self._split = re.compile("(" + "|".join(map(re.escape, reversed(specials))) + ")")

    def __contains__(self, token: str) -> bool:
        return token in self.vocab

    @property
    def vocab_size(self) -> int:
        """Number of ids (the model's vocabulary: vocab.json's largest id + 1)."""
        return max(self.tokens) + 1

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special tokens."""
        return self._special_ids

    def encode(self, text: str) -> list[int]:
        """Source ids of ``text``, EOS appended (``MarianTokenizer(text).input_ids``).

        Args:
            text: The source text, with its language code first when the model has them.

        Returns:
            The ids.
        """
        ids: list[int] = []
        for chunk in self._split.split(text):
            if not chunk:
                continue
            if chunk in self.vocab and self.vocab[chunk] in self._special_ids:
                ids.append(self.vocab[chunk])
                continue
            if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                ids.append(self.vocab.get(chunk[: end + 2], self.unk_id))
                chunk = chunk[end + 2 :]
            pieces = self.source.encode(chunk, out_type=str)
            ids.extend(self.vocab.get(piece, self.unk_id) for piece in pieces)
        return [*ids, self.eos_id]

    def encode_target(self, text: str) -> list[int]:
        """Target ids of ``text`` without EOS: the target SentencePiece model's pieces mapped
        through vocab.json (``MarianTokenizer(text_target=text).input_ids`` without its EOS)."""
        pieces = self.target.encode(text, out_type=str)
        return [self.vocab.get(piece, self.unk_id) for piece in pieces]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of target ids, joined by the target SentencePiece model.

        Args:
            ids: Generated ids.
            skip_special_tokens: Drop special ids (kept ones are written as their token).

        Returns:
            The text, stripped.

        Raises:
            TokenizerError: For an id outside the vocabulary.
        """
        text = ""
        pieces: list[str] = []
        for token_id in ids:
            token = self.id_to_token(int(token_id))
            if int(token_id) in self._special_ids:
                if not skip_special_tokens:
                    text += self.target.decode_pieces(pieces) + token + " "
                    pieces = []
                continue
            pieces.append(token)
        text = (text + self.target.decode_pieces(pieces)).replace(_SPIECE_UNDERLINE, " ").strip()
        return clean_up_tokenization(text) if self.clean_up_spaces else text

    def id_to_token(self, token_id: int) -> str:
        """The vocab.json entry of ``token_id``.

        Raises:
            TokenizerError: For an id vocab.json does not have.
        """
        token = self.tokens.get(int(token_id))
        if token is None:
            raise TokenizerError(f"id {token_id} is not in vocab.json (size {self.vocab_size})")
        return token


class HuggingFaceTokenizer:
    """A ``tokenizers`` tokenizer.json saved by transformers (GPT-2's byte-level BPE).

    Args:
        file: The tokenizer.json.
        spec: The entry's tokenizer section (``clean_up_spaces``).

    Raises:
        TokenizerError: A missing or unreadable file.
    """

    def __init__(self, file: str | Path, spec: TokenizerSpec) -> None:
        self._tokenizer = _load_tokenizers_json(Path(file))
        self.clean_up_spaces = spec.clean_up_spaces
        self._special_ids = frozenset(
            token_id
            for token_id, added in self._tokenizer.get_added_tokens_decoder().items()
            if added.special
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special added tokens."""
        return self._special_ids

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with the tokenizer's own special tokens (its post-processor)."""
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def encode_target(self, text: str) -> list[int]:
        """Ids of ``text`` without the post-processor's special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (transformers' tokenizers-backend decode).

        Raises:
            TokenizerError: For an id outside the vocabulary.
        """
        id_list = [int(i) for i in ids]
        bad = [i for i in id_list if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"ids {bad[:5]} are outside the vocabulary ({self.vocab_size})")
        text = self._tokenizer.decode(id_list, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_spaces else text

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id``.

        Raises:
            TokenizerError: For an id outside the vocabulary.
        """
        token = self._tokenizer.id_to_token(int(token_id))
        if token is None:
            raise TokenizerError(f"id {token_id} is outside the vocabulary ({self.vocab_size})")
        return token


def tokenizer_files(spec: TokenizerSpec) -> tuple[str, ...]:
    """The files of a version folder that hold the tokenizer of ``spec``.

    Args:
        spec: An entry's tokenizer section.

    Returns:
        File names, relative to the version folder.
    """
    return SENTENCEPIECE_FILES if spec.kind == "sentencepiece" else (TOKENIZER_FILE,)


def load_text_tokenizer(version_dir: str | Path, spec: TokenizerSpec) -> TextTokenizer:
    """The tokenizer of a repository version folder, as its config.yaml describes it.

    Args:
        version_dir: REPOSITORY/NAME/VERSION.
        spec: The entry's ``tokenizer`` section.

    Returns:
        A ``SubwordTokenizer``, ``SentencePiecePair`` or ``HuggingFaceTokenizer``.

    Raises:
        TokenizerError: Missing or unreadable tokenizer files (named).
    """
    version_dir = Path(version_dir)
    if spec.kind == "sentencepiece":
        return SentencePiecePair(version_dir, spec)
    if spec.kind == "huggingface":
        return HuggingFaceTokenizer(version_dir / TOKENIZER_FILE, spec)
    return SubwordTokenizer.load(version_dir)


def _load_spm(path: Path) -> Any:
    """A SentencePieceProcessor of ``path``."""
    try:
        import sentencepiece
    except ImportError as err:
        raise TokenizerError(
            f"{path.name} is a SentencePiece model: pip install 'sentencepiece>=0.2' (part of "
            "the serve extra)"
        ) from err
    if not path.is_file():
        raise TokenizerError(f"no {path.name} in {path.parent}; re-export the model")
    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise TokenizerError(f"{path} is not a SentencePiece model ({err})") from err


def _read_vocab(path: Path) -> dict[str, int]:
    """vocab.json: piece -> id."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokenizerError(f"no {path.name} in {path.parent}; re-export the model") from None
    except (OSError, ValueError) as err:
        raise TokenizerError(f"{path} is not valid JSON ({err})") from err
    if (
        not isinstance(data, dict)
        or not data
        or not all(isinstance(v, int) and v >= 0 for v in data.values())
    ):
        raise TokenizerError(f"{path} must map pieces to ids >= 0")
    return {str(piece): int(token_id) for piece, token_id in data.items()}


def _load_tokenizers_json(file: Path) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from its JSON file."""
    if not file.is_file():
        raise TokenizerError(f"no {file.name} in {file.parent}; re-export the model")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception for parse errors
        raise TokenizerError(f"{file} is not a valid tokenizer file ({err})") from err
