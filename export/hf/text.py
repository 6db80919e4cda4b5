"""The tokenizer of a Hugging Face directory, as files and settings a repository entry carries.

transformers loads the tokenizer (``AutoTokenizer``, local files only), so that what the entry
records is what transformers itself would do; serving then reads the files with
``contract.text`` and never imports transformers:

- ``MarianTokenizer`` -> ``sentencepiece``: source.spm, target.spm and vocab.json as they are,
  plus its special tokens, EOS and unknown tokens and its target language(s);
- a tokenizers-backed tokenizer (GPT-2's byte-level BPE) -> ``huggingface``: its tokenizer.json.

Anything else (separate source / target vocabularies, SentencePiece sampling, other tokenizer
classes) is refused with a ``SourceError`` that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.model_config import TokenizerSpec
from contract.text import SENTENCEPIECE_FILES
from contract.tokenizer import TOKENIZER_FILE
from export.errors import SourceError

_LANGUAGE_CODE = re.compile(r">>(.+)<<")


@dataclass(frozen=True)
class EntryTokenizer:
    """A tokenizer as a repository entry carries it."""

    spec: TokenizerSpec  # config.yaml `tokenizer`
    files: tuple[tuple[str, bytes], ...]  # (name, content) for the version folder
    languages: tuple[str, ...]  # target languages, () when the tokenizer names none
    notes: dict[str, Any]  # what manifest.json records about it


def load_tokenizer(transformers: Any, architecture: str, directory: Path) -> Any:
    """transformers' tokenizer of the directory.

    Args:
        transformers: The imported ``transformers`` module.
        architecture: The HF architecture (for messages).
        directory: The save_pretrained directory.

    Returns:
        The tokenizer ``AutoTokenizer.from_pretrained`` loads from local files.

    Raises:
        SourceError: When the directory has no tokenizer files or transformers cannot load them.
    """
    if not any((directory / name).is_file() for name in (*SENTENCEPIECE_FILES, TOKENIZER_FILE)):
        raise SourceError(
            f"{directory} has no tokenizer (tokenizer.json, or source.spm / target.spm / "
            f"vocab.json): a {architecture} entry serves text, so save the tokenizer next to the "
            "model with tokenizer.save_pretrained(DIR)"
        )
    try:
        return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # transformers raises many types for broken tokenizer files
        raise SourceError(f"cannot load the tokenizer in {directory}: {err}") from err


def marian_tokenizer(tokenizer: Any, directory: Path, ids: dict[str, int]) -> EntryTokenizer:
    """A ``MarianTokenizer`` as a ``sentencepiece`` entry tokenizer.

    Args:
        tokenizer: The loaded ``MarianTokenizer``.
        directory: Its directory (the .spm and vocab.json files are copied from it).
        ids: The model's ``pad``, ``eos`` and ``unk`` ids where it has them; the tokenizer's
            tokens must have the same ids.

    Returns:
        The files and settings; languages are the ``>>xx<<`` codes of the vocabulary (tagged
        ">>{}<<") or else the tokenizer's ``target_lang`` (no tag).

    Raises:
        SourceError: For another tokenizer class, separate vocabularies, SentencePiece sampling,
            added tokens that are not special, or special-token ids the model does not share.
    """
    _check_marian(tokenizer, directory, ids)
    specials = tuple(dict.fromkeys(tokenizer.added_tokens_encoder))
    matches = (_LANGUAGE_CODE.fullmatch(c) for c in tokenizer.supported_language_codes)
    codes = [m.group(1) for m in matches if m]
    target = getattr(tokenizer, "target_lang", None)
    languages = tuple(codes) if codes else ((str(target),) if target else ())
    spec = TokenizerSpec(
        kind="sentencepiece",
        language_tag=">>{}<<" if codes else "",
        special_tokens=specials,
        eos_token=str(tokenizer.eos_token),
        unk_token=str(tokenizer.unk_token),
        clean_up_spaces=bool(tokenizer.clean_up_tokenization_spaces),
    )
    files = tuple((file, (directory / file).read_bytes()) for file in SENTENCEPIECE_FILES)
    notes = {
        "class": type(tokenizer).__name__,
        "files": list(SENTENCEPIECE_FILES),
        "languages": list(languages),
    }
    return EntryTokenizer(spec, files, languages, notes)


def _check_marian(tokenizer: Any, directory: Path, ids: dict[str, int]) -> None:
    """Refuse a MarianTokenizer that ``SentencePiecePair`` would not reproduce."""
    name = type(tokenizer).__name__
    if name != "MarianTokenizer":
        raise SourceError(f"a MarianMTModel needs a MarianTokenizer, {directory} holds a {name}")
    if getattr(tokenizer, "separate_vocabs", False):
        raise SourceError(f"unsupported MarianTokenizer in {directory}: separate_vocabs=true")
    if any(getattr(tokenizer, "sp_model_kwargs", {}).values()):
        raise SourceError(
            f"unsupported MarianTokenizer in {directory}: sp_model_kwargs "
            f"{tokenizer.sp_model_kwargs} (serving encodes deterministically)"
        )
    specials = set(tokenizer.added_tokens_encoder)
    loose = sorted(specials - set(tokenizer.all_special_tokens))
    if loose:
        raise SourceError(f"unsupported MarianTokenizer in {directory}: added tokens {loose}")
    for role, token_id in ids.items():
        token = getattr(tokenizer, f"{role}_token", None)
        if token is not None and tokenizer.convert_tokens_to_ids(token) != token_id:
            raise SourceError(
                f"the tokenizer in {directory} has {role} token {token!r} at id "
                f"{tokenizer.convert_tokens_to_ids(token)}, the model's {role} id is {token_id}"
            )


def tokenizers_json(tokenizer: Any, directory: Path) -> EntryTokenizer:
    """A tokenizers-backed tokenizer (GPT-2's) as a ``huggingface`` entry tokenizer.

    The tokenizer.json written is transformers' own backend tokenizer (its added tokens
    included). transformers 5 never cleans up spaces after a BPE decode, so neither does serving.

    Args:
        tokenizer: The loaded tokenizer.
        directory: Its directory (for messages).

    Returns:
        The tokenizer.json and settings (no languages).

    Raises:
        SourceError: For a tokenizer without a ``tokenizers`` backend.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise SourceError(
            f"unsupported tokenizer {type(tokenizer).__name__} in {directory}: serving reads "
            "tokenizers JSON (tokenizer.json) or Marian's SentencePiece files"
        )
    bpe = type(backend.model).__name__ == "BPE"
    forced = getattr(
        tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
    )
    clean_up = bool(tokenizer.clean_up_tokenization_spaces) and (not bpe or bool(forced))
    spec = TokenizerSpec(kind="huggingface", language_tag="", clean_up_spaces=clean_up)
    files = ((TOKENIZER_FILE, backend.to_str().encode("utf-8")),)
    notes = {"class": type(tokenizer).__name__, "files": [TOKENIZER_FILE]}
    return EntryTokenizer(spec, files, (), notes)
