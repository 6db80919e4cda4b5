"""The tokenizer interface: the three kinds an entry can carry, loaded by config.yaml's kind.

transformers' own tokenizers are the reference where they are installed (the export extra);
the end-to-end comparison on served models is tests/serving/test_hf_served.py.
"""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest
from tokenizers import ByteLevelBPETokenizer

from contract.model_config import TokenizerSpec
from contract.text import (
    HuggingFaceTokenizer,
    SentencePiecePair,
    TextTokenizer,
    clean_up_tokenization,
    load_text_tokenizer,
    tokenizer_files,
)
from contract.tokenizer import SubwordTokenizer, TokenizerError

sentencepiece = pytest.importorskip("sentencepiece", reason="part of the serve extra")

SOURCES = [f"{w} {n} and {m}" for w in ("page", "room") for n in ("one", "two") for m in "xyz"]
TARGETS = [f"Seite {n} und {m}" for n in ("eins", "zwei", "drei") for m in "abc"]
MARIAN = TokenizerSpec(
    kind="sentencepiece", language_tag="", special_tokens=("</s>", "<unk>", "<pad>")
)


def _spm(texts: list[str], path: Path) -> None:
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 20),
        model_writer=buffer,
        vocab_size=40,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    path.write_bytes(buffer.getvalue())


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("marian_tokenizer")
    _spm(SOURCES, directory / "source.spm")
    _spm(TARGETS, directory / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2}
    for name in ("source.spm", "target.spm"):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / name))
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    return directory


def test_sentencepiece_pair_encodes_like_marian(marian_dir: Path) -> None:
    tokenizer = load_text_tokenizer(marian_dir, MARIAN)
    assert isinstance(tokenizer, SentencePiecePair) and isinstance(tokenizer, TextTokenizer)
    vocab = json.loads((marian_dir / "vocab.json").read_text())
    source = sentencepiece.SentencePieceProcessor(model_file=str(marian_dir / "source.spm"))
    text = "page two and y"
    expected = [vocab.get(p, 1) for p in source.encode(text, out_type=str)] + [0]
    assert tokenizer.encode(text) == expected
    # special tokens are matched in the text; a leading >>xx<< code is one token
    assert tokenizer.encode(f"{text} </s>")[-2:] == [0, 0]
    assert tokenizer.encode(f">>de<< {text}") == [2, *expected]
    assert tokenizer.encode("page ✓")[-2] == 1  # unknown to vocab.json: <unk>
    if importlib.util.find_spec("transformers") is None:  # the export extra: the reference
        return
    import transformers

    reference = transformers.MarianTokenizer(
        *(str(marian_dir / f) for f in tokenizer_files(MARIAN))
    )
    for sample in (text, f" {text} </s> <unk> x", ">>de<< page one", "Room ✓ zwei"):
        assert tokenizer.encode(sample) == reference(sample).input_ids


def test_sentencepiece_pair_decodes_target_pieces(marian_dir: Path) -> None:
    tokenizer = load_text_tokenizer(marian_dir, MARIAN)
    vocab = json.loads((marian_dir / "vocab.json").read_text())
    target = sentencepiece.SentencePieceProcessor(model_file=str(marian_dir / "target.spm"))
    ids = [vocab[p] for p in target.encode("Seite zwei und b", out_type=str)]
    assert tokenizer.decode(ids) == "Seite zwei und b"
    assert tokenizer.decode([*ids, vocab["</s>"], vocab["<pad>"]]) == "Seite zwei und b"
    kept = tokenizer.decode([*ids, vocab["</s>"]], skip_special_tokens=False)
    assert kept == "Seite zwei und b</s>"
    assert tokenizer.special_ids == {vocab["</s>"], vocab["<unk>"], vocab["<pad>"]}
    with pytest.raises(TokenizerError, match=r"not in vocab\.json"):
        tokenizer.decode([10_000])


def test_sentencepiece_pair_refuses_broken_files(marian_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no source\.spm"):
        load_text_tokenizer(tmp_path, MARIAN)
    for name in ("source.spm", "target.spm"):
        (tmp_path / name).write_bytes((marian_dir / name).read_bytes())
    (tmp_path / "vocab.json").write_text('{"</s>": 0}')
    with pytest.raises(TokenizerError, match=r"lacks the special tokens \['<unk>', '<pad>'\]"):
        load_text_tokenizer(tmp_path, MARIAN)
    (tmp_path / "vocab.json").write_text("[1, 2]")
    with pytest.raises(TokenizerError, match="must map pieces to ids"):
        load_text_tokenizer(tmp_path, MARIAN)
    (tmp_path / "source.spm").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        load_text_tokenizer(tmp_path, MARIAN)


def test_huggingface_json_decodes_as_tokenizers(tmp_path: Path) -> None:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["a small red circle", "a large blue square"] * 5,
        vocab_size=280,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_text_tokenizer(tmp_path, TokenizerSpec(kind="huggingface"))
    assert isinstance(tokenizer, HuggingFaceTokenizer) and isinstance(tokenizer, TextTokenizer)
    ids = tokenizer.encode("a small wörld , ok")
    assert tokenizer.decode([*ids, 0]) == "a small wörld , ok"  # special id 0 dropped
    assert tokenizer.decode([*ids, 0], skip_special_tokens=False).endswith("<|endoftext|>")
    assert tokenizer.special_ids == {0}
    cleaned = HuggingFaceTokenizer(tmp_path / "tokenizer.json", TokenizerSpec(clean_up_spaces=True))
    assert cleaned.decode(ids) == "a small wörld, ok"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        load_text_tokenizer(tmp_path / "missing", TokenizerSpec(kind="huggingface"))


def test_subword_is_the_default_kind(tmp_path: Path) -> None:
    SubwordTokenizer.train(["forty-two", "zweiundvierzig"], 80).save(tmp_path)
    tokenizer = load_text_tokenizer(tmp_path, TokenizerSpec())
    assert isinstance(tokenizer, SubwordTokenizer) and isinstance(tokenizer, TextTokenizer)
    assert tokenizer_files(TokenizerSpec()) == ("tokenizer.json",)


def test_clean_up_is_transformers() -> None:
    assert clean_up_tokenization("it 's a test , is n't it ?") == "it's a test, isn't it?"
