"""Tests of the project's BPE tokenizer on the real training data (translation and captions)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    UNK_ID,
    SubwordTokenizer,
    TokenizerError,
)
from models.data import shapes
from models.data.translation import LANGUAGES, generate_pairs, language_tag, language_tags

VOCAB_SIZE = 1000


@functools.cache
def _corpus() -> list[str]:
    pairs = generate_pairs(3000, seed=0, split="train")
    captions = [shapes.caption(s) for s in shapes.generate_scenes(300, seed=0, split="train")]
    return [p.source for p in pairs] + [p.target for p in pairs] + captions


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _corpus()


@pytest.fixture(scope="module")
def tokenizer(corpus: list[str]) -> SubwordTokenizer:
    return SubwordTokenizer.train(corpus, VOCAB_SIZE, extra_special_tokens=language_tags())


def test_special_tokens_have_fixed_ids(tokenizer: SubwordTokenizer) -> None:
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    tag_ids = [tokenizer.token_to_id(tag) for tag in language_tags()]
    assert tag_ids == [4, 5, 6]
    assert tokenizer.special_ids == frozenset({0, 1, 2, 3, 4, 5, 6})
    assert tokenizer.vocab_size == VOCAB_SIZE


@pytest.mark.parametrize("lang", LANGUAGES)
def test_language_tag_is_a_single_id(tokenizer: SubwordTokenizer, lang: str) -> None:
    ids = tokenizer.encode(f"{language_tag(lang)} three hundred", add_eos=False)
    assert ids[0] == tokenizer.token_to_id(language_tag(lang))
    assert ids[1:] == tokenizer.encode("three hundred", add_eos=False)
    assert tokenizer.decode(ids) == "three hundred"
    assert tokenizer.decode(ids, skip_special_tokens=False) == f"<2{lang}> three hundred"


def test_eos_is_appended_and_bos_never(tokenizer: SubwordTokenizer) -> None:
    with_eos = tokenizer.encode("page twelve")
    without = tokenizer.encode("page twelve", add_eos=False)
    assert with_eos == [*without, EOS_ID]
    assert BOS_ID not in with_eos
    assert tokenizer.encode("") == [EOS_ID]


def test_round_trip_on_translation_pairs_and_captions(tokenizer: SubwordTokenizer) -> None:
    pairs = generate_pairs(600, seed=1, split="test")
    assert {p.lang for p in pairs} == set(LANGUAGES)
    texts = [p.tagged_source() for p in pairs] + [p.target for p in pairs]
    texts += [shapes.caption(s) for s in shapes.generate_scenes(100, seed=1, split="test")]
    encoded = tokenizer.encode_batch(texts)
    assert encoded[:50] == [tokenizer.encode(t) for t in texts[:50]]
    assert tokenizer.decode_batch(encoded, skip_special_tokens=False) == [f"{t}</s>" for t in texts]
    sources = [p.source for p in pairs]
    assert tokenizer.decode_batch(tokenizer.encode_batch(sources)) == sources
    assert all(UNK_ID not in ids for ids in encoded)


@pytest.mark.parametrize(
    "text",
    [
        "zwölf",
        "dieciséis",
        "quatre-vingt-dix",
        "Seite zwölf",
        "nine hundred and ninety-nine thousand, nine hundred and ninety-nine",
        "im Jahr neunzehnhundertvierundachtzig",
    ],
)
def test_round_trip_of_tricky_text(tokenizer: SubwordTokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decomposed_accents_are_normalised_to_nfc(tokenizer: SubwordTokenizer) -> None:
    decomposed = "zwo\u0308lf"  # o + combining diaeresis
    assert tokenizer.encode(decomposed) == tokenizer.encode("zwölf")


def test_unknown_characters_map_to_unk(tokenizer: SubwordTokenizer) -> None:
    ids = tokenizer.encode("page 三 twelve ☃", add_eos=False)
    assert ids.count(UNK_ID) == 2
    assert tokenizer.decode(ids, skip_special_tokens=False) == "page <unk> twelve <unk>"
    assert tokenizer.decode(ids) == "page  twelve "


def test_training_is_deterministic(corpus: list[str], tokenizer: SubwordTokenizer) -> None:
    again = SubwordTokenizer.train(corpus, VOCAB_SIZE, extra_special_tokens=language_tags())
    assert again.to_json() == tokenizer.to_json()


def test_save_and_load_round_trip(tokenizer: SubwordTokenizer, tmp_path: Path) -> None:
    path = tokenizer.save(tmp_path / "tok")
    assert path == tmp_path / "tok" / TOKENIZER_FILE
    for source in (tmp_path / "tok", path, str(path)):
        loaded = SubwordTokenizer.load(source)
        assert loaded.to_json() == tokenizer.to_json()
        assert loaded.special_ids == tokenizer.special_ids
        text = "<2fr> chapter forty-two"
        assert loaded.encode(text) == tokenizer.encode(text)
    assert tokenizer.save(tmp_path / "again").read_bytes() == path.read_bytes()


def test_load_missing_directory_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json .*train one"):
        SubwordTokenizer.load(tmp_path / "nowhere")
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        SubwordTokenizer.load(tmp_path)


def test_load_corrupt_file_raises_tokenizer_error(tmp_path: Path) -> None:
    (tmp_path / TOKENIZER_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a valid tokenizer file"):
        SubwordTokenizer.load(tmp_path)


def test_load_rejects_a_tokenizer_with_other_special_ids(
    tokenizer: SubwordTokenizer, tmp_path: Path
) -> None:
    data = json.loads(tokenizer.to_json())
    vocab = data["model"]["vocab"]
    vocab["<pad>"], vocab["<s>"] = vocab["<s>"], vocab["<pad>"]
    for added in data["added_tokens"]:
        added["id"] = {0: 1, 1: 0}.get(added["id"], added["id"])
    (tmp_path / TOKENIZER_FILE).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TokenizerError, match="expected 0"):
        SubwordTokenizer.load(tmp_path)


def test_unknown_token_and_out_of_range_ids_raise(tokenizer: SubwordTokenizer) -> None:
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tokenizer.token_to_id("<2xx>")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.decode([5, tokenizer.vocab_size])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.decode_batch([[5], [-1]])


def test_train_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        SubwordTokenizer.train(["a b"], 4)
    with pytest.raises(ValueError, match="empty corpus"):
        SubwordTokenizer.train([], 100)
    with pytest.raises(ValueError, match="duplicates"):
        SubwordTokenizer.train(["a b"], 100, extra_special_tokens=["<x>", "<x>"])
    with pytest.raises(ValueError, match="fixed special token"):
        SubwordTokenizer.train(["a b"], 100, extra_special_tokens=["</s>"])


_ALPHABET = sorted({ch for text in _corpus() for ch in text} - {" "})


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=12), min_size=1, max_size=6))
def test_round_trip_property(tokenizer: SubwordTokenizer, words: list[str]) -> None:
    text = " ".join(words)
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == text
