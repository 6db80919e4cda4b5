"""Request inputs checked and turned into what the graphs take: source token ids, pixels.

Both APIs (attnserve.v1 and KServe v2) call these, so they reject bad input with the same status
and message.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from contract.images import ImageDecodeError, decode_image, pixel_values
from contract.model_config import ImageSpec, TokenizerSpec
from contract.normalize import SourceNormalizer
from contract.text import TextTokenizer
from contract.tokenizer import TokenizerError
from serving.errors import InvalidArgument, TooLarge


class TextSource:
    """Source texts of a translation model: normalised, tagged with the target language,
    tokenized, bounded.

    Args:
        model: the model's name (for messages).
        tokenizer: the model's tokenizer.
        languages: target languages ("de", ...); one must be chosen when there are several.
        max_source_length: the most source tokens the model takes.
        spec: the entry's tokenizer section: its normaliser and its language tag ("<2{}>", the
            default, tags "<2de> ..." when there are languages; "" tags nothing).
    """

    def __init__(
        self,
        model: str,
        tokenizer: TextTokenizer,
        languages: tuple[str, ...],
        max_source_length: int,
        spec: TokenizerSpec | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.languages = languages
        self.max_source_length = max_source_length
        spec = spec or TokenizerSpec()
        self.normalize = SourceNormalizer(spec.normalizer)
        self.language_tag = spec.language_tag

    @functools.cached_property
    def max_chars(self) -> int:
        """Texts longer than this cannot fit ``max_source_length`` tokens, so they are refused
        before tokenizing (megabytes of text would hold the event loop for seconds): no token
        covers more characters than the longest vocabulary entry, and NFC normalisation shortens
        a text at most about 3x (4x here, for margin)."""
        return 4 * longest_token(self.tokenizer) * self.max_source_length

    def ids(self, text: str, language: str) -> np.ndarray:
        """Token ids of a source text: normalised, tagged, tokenized.

        A model with one target language takes an empty ``language`` as that one.

        Args:
            text: what the user sent.
            language: the target language.

        Returns:
            int64 ids, ending as the model's sources end (EOS).

        Raises:
            InvalidArgument: empty text (before or after normalising), unknown target language.
            TooLarge: the text is longer than the model's source limit.
        """
        if not text or not text.strip():
            raise InvalidArgument("text is empty; send the text to translate")
        if len(self.languages) == 1 and not language:
            language = self.languages[0]
        if self.languages and language not in self.languages:
            raise InvalidArgument(
                f"target_language {language[:40]!r} is not supported by {self.model!r}; "
                f"choose one of: {', '.join(self.languages)}"
            )
        if len(text) > self.max_chars:  # surely too long: refuse without tokenizing
            raise self._too_long(f"{len(text)} characters")
        text = self.normalize(text)
        if not text:
            raise InvalidArgument("text is empty once normalised; send the text to translate")
        if self.languages and self.language_tag:
            text = f"{self.language_tag.format(language)} {text}"
        ids = self.tokenizer.encode(text)
        if len(ids) > self.max_source_length:
            raise self._too_long(f"{len(ids)} tokens")
        return np.asarray(ids, dtype=np.int64)

    def _too_long(self, size: str) -> TooLarge:
        return TooLarge(
            f"the text is {size} long; model {self.model!r} accepts at most "
            f"{self.max_source_length} source tokens: split it into shorter texts"
        )


class TargetText:
    """Texts a request gives for the target side, tokenized as the decoder writes them and
    bounded: a prefix to start outputs with (``TargetPrefix``) or a target to score
    (``ScoreTarget``).

    Args:
        model: the model's name (for messages).
        tokenizer: the model's tokenizer (``encode_target``).
        max_tokens: the most tokens such a text may take.
    """

    what = "the target"

    def __init__(self, model: str, tokenizer: TextTokenizer, max_tokens: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens

    @functools.cached_property
    def max_chars(self) -> int:
        """Longer texts cannot fit ``max_tokens`` (as ``TextSource.max_chars``)."""
        return 4 * longest_token(self.tokenizer) * max(1, self.max_tokens)

    def ids(self, text: str) -> tuple[int, ...]:
        """The ids of ``text`` (none for an empty one), as the decoder would generate them.

        Raises:
            InvalidArgument: the text holds a special token (EOS, padding, a piece outside the
                vocabulary that becomes ``<unk>``): no output of the model writes it.
            TooLarge: more tokens than the model's outputs leave room for.
        """
        if not text:
            return ()
        if len(text) > self.max_chars:  # surely too long: refuse without tokenizing
            raise self._too_long(f"{len(text)} characters")
        ids = self.tokenizer.encode_target(text)
        refuse_special(self.tokenizer, ids, f"{self.what} {text[:40]!r}", self.model)
        if len(ids) > self.max_tokens:
            raise self._too_long(f"{len(ids)} tokens")
        return tuple(ids)

    def _too_long(self, size: str) -> TooLarge:
        return TooLarge(
            f"{self.what} is {size} long; model {self.model!r} writes at most "
            f"{self.max_tokens} tokens (limits.max_new_tokens): send a shorter one"
        )


class TargetPrefix(TargetText):
    """Target prefixes of a generation model: the text its outputs must start with (at most
    ``max_new_tokens`` - 1 tokens: a prefix leaves room for one more)."""

    what = "the target prefix"

    def __init__(self, model: str, tokenizer: TextTokenizer, max_new_tokens: int) -> None:
        super().__init__(model, tokenizer, max_new_tokens - 1)

    def _too_long(self, size: str) -> TooLarge:
        return TooLarge(
            f"the target prefix is {size} long; model {self.model!r} writes at most "
            f"{self.max_tokens + 1} tokens (limits.max_new_tokens) and a prefix must leave room "
            f"for one: send at most {self.max_tokens} tokens"
        )


class ScoreTarget(TargetText):
    """Targets to score (``Score``): at most ``max_new_tokens`` tokens, EOS not counted, as
    the model's outputs; an empty one scores EOS alone."""


class BadWords:
    """Bad words of a generation model: each text as the token sequences that would write it.

    A word is tokenized alone and after a space, as vLLM's ``bad_words`` are: with a byte-level
    BPE (GPT-2) ``"triangle"`` and ``" triangle"`` are different tokens, the second the word
    inside a sentence; with SentencePiece (Marian) both give the same pieces, kept once.

    Args:
        model: the model's name (for messages).
        tokenizer: the model's tokenizer (``encode_target``).
    """

    def __init__(self, model: str, tokenizer: TextTokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one per served model, which lives long)
    def ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """The token sequences of ``words`` (``DecodingOptions.bad_words``, checked there).

        Raises:
            InvalidArgument: a word tokenizes to special tokens (characters the vocabulary
                lacks become ``<unk>``): banning those would ban what the model cannot spell.
        """
        sequences: dict[tuple[int, ...], None] = {}
        for word in words:
            for form in (word.lstrip(), " " + word.lstrip()):  # alone, inside a sentence
                ids = tuple(self.tokenizer.encode_target(form))
                self._check(word, ids)
                sequences[ids] = None
        return tuple(sequences)

    def _check(self, word: str, ids: tuple[int, ...]) -> None:
        if not ids:
            raise InvalidArgument(
                f"the bad word {word[:40]!r} tokenizes to nothing for model {self.model!r}: "
                "send a word with characters the model writes"
            )
        refuse_special(self.tokenizer, ids, f"the bad word {word[:40]!r}", self.model)


def refuse_special(tokenizer: TextTokenizer, ids: Sequence[int], what: str, model: str) -> None:
    """InvalidArgument where ``ids`` (the tokens of ``what``, a text a request gave) hold a
    special token: a piece outside the vocabulary that became ``<unk>``, or EOS written out."""
    special = tokenizer.special_ids
    if bad := [token for token in ids if token in special]:
        pieces = ", ".join(repr(tokenizer.id_to_token(t)) for t in bad[:3])
        raise InvalidArgument(
            f"{what} tokenizes to special tokens of model {model!r} ({pieces}: characters its "
            "vocabulary lacks, or a special token written out); send text the model writes"
        )


def longest_token(tokenizer: TextTokenizer) -> int:
    """Characters of the tokenizer's longest vocabulary entry (at least 1)."""
    chars = 1
    for token_id in range(tokenizer.vocab_size):
        try:
            chars = max(chars, len(tokenizer.id_to_token(token_id)))
        except TokenizerError:  # an id the vocabulary skips
            continue
    return chars


_CHANNELS = np.arange(3)[:, None, None]  # indexes the table's channel for every (c, y, x)


class ImageSource:
    """Encoded images of an image model: bounded, decoded, resized and normalised.

    Args:
        model: the model's name (for messages).
        spec: the model's preprocessing (size, mean, std).
        max_bytes: the largest encoded image accepted.
        dtype: the graph's float type (float16 for fp16 exports).
    """

    def __init__(self, model: str, spec: ImageSpec, max_bytes: int, dtype: type) -> None:
        self.model = model
        self.spec = spec
        self.max_bytes = max_bytes
        self.dtype = dtype
        # Per channel, what each of the 256 byte values normalises to: ``pixel_values`` of an
        # image holding every value, so a lookup gives its results bit for bit (one gather per
        # image instead of five float passes).
        every_value = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)
        table = pixel_values(every_value, spec.mean, spec.std)[0, :, 0, :]
        self._table: np.ndarray = table.astype(dtype)

    def pixels(self, data: bytes) -> np.ndarray:
        """Decoded, resized and normalised pixels (3, H, W) of an encoded image.

        Raises:
            InvalidArgument: empty or undecodable image data.
            TooLarge: the encoded image exceeds ``max_bytes``.
        """
        if not data:
            raise InvalidArgument("image is empty; send PNG or JPEG bytes")
        if len(data) > self.max_bytes:
            raise TooLarge(
                f"the image is {len(data)} bytes; model {self.model!r} accepts at most "
                f"{self.max_bytes}"
            )
        try:
            image = decode_image(data, self.spec.size, self.spec.resample)
        except ImageDecodeError as err:
            raise InvalidArgument(str(err)) from err
        return self.normalise(image)

    def normalise(self, image: np.ndarray) -> np.ndarray:
        """uint8 (H, W, 3) at the model's size -> (3, H, W) in the graph's float type: what
        ``pixel_values`` gives (cast to that type), by table lookup."""
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"expected a uint8 (H, W, 3) image, got {image.dtype} {image.shape}")
        planes = np.ascontiguousarray(image.transpose(2, 0, 1))  # bytes: the cheap copy
        return self._table[_CHANNELS, planes]  # laid out as its index: (3, H, W), C order


def float_dtype(precision: str) -> type:
    """The float type of a model's graph inputs: float16 for fp16 exports, else float32."""
    return np.float16 if precision == "fp16" else np.float32
