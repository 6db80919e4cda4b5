"""A model's token rules at the token choice (DecoderSpec.suppress_ids / forced_eos), and
request text through TextSource (normaliser, language tag)."""

from __future__ import annotations

import numpy as np
import pytest

from contract.model_config import DecoderSpec, TokenizerSpec
from contract.tokenizer import SubwordTokenizer
from serving.errors import InvalidArgument
from serving.generation.beam import BeamSearch
from serving.generation.options import DecodingOptions
from serving.generation.sampling import RowSampler
from serving.served.inputs import TextSource

EOS, PAD = 2, 0


def test_greedy_never_chooses_a_suppressed_token() -> None:
    logits = np.array([9.0, 1.0, 0.5, 3.0, 2.0], dtype=np.float32)  # pad is the argmax
    plain = RowSampler(DecodingOptions(), EOS)
    ruled = RowSampler(DecodingOptions(), EOS, suppress_ids=(PAD,))
    assert plain.choose(logits, 0) == PAD
    assert ruled.choose(logits, 0) == 3
    assert RowSampler(DecodingOptions(), EOS, suppress_ids=(0, 3)).choose(logits, 0) == 4
    everything = RowSampler(DecodingOptions(), EOS, suppress_ids=(0, 1, 3, 4))
    assert everything.choose(np.array([9.0, 1, -np.inf, 3, 2]), 0) == EOS  # nothing left: end


def test_sampling_never_draws_a_suppressed_token() -> None:
    logits = np.log(np.array([0.5, 0.1, 0.1, 0.2, 0.1]))
    chooser = RowSampler(DecodingOptions(temperature=1.0, seed=3), EOS, suppress_ids=(PAD, 3))
    drawn = {chooser.choose(logits, i) for i in range(300)}
    assert drawn == {1, 2, 4}


def test_forced_eos_takes_the_last_position() -> None:
    logits = np.array([0.0, 5.0, -1.0, 0.0], dtype=np.float32)
    chooser = RowSampler(DecodingOptions(), EOS, forced_eos_at=3)
    assert [chooser.choose(logits, generated) for generated in range(4)] == [1, 1, 1, EOS]


def test_beam_search_applies_the_rules() -> None:
    logits = np.tile(np.array([4.0, 1.0, 0.5, 2.0, 1.5]), (2, 1))  # pad always best
    search = BeamSearch(2, EOS, max_new_tokens=3, suppress_ids=(PAD,), forced_eos=True)
    tokens = []
    while not search.done:
        _, chosen = search.step(logits[: 1 if not tokens else 2])
        tokens.append(chosen.tolist())
    best = search.best()[0]
    assert PAD not in best.tokens and len(best.tokens) == 2  # 2 tokens, then the forced EOS
    assert best.finished
    assert all(t != PAD for step in tokens for t in step)
    # renormalised: the best hypothesis scores log-softmax without pad, EOS step adds 0
    without_pad = logits[0, 1:] - np.log(np.exp(logits[0, 1:]).sum())
    assert best.score == pytest.approx(2 * without_pad[2] / 3)


def test_decoder_spec_refuses_suppressing_eos() -> None:
    with pytest.raises(ValueError, match="suppress_ids"):
        DecoderSpec(num_layers=1, num_heads=1, head_dim=4, vocab_size=10, suppress_ids=(2,))
    with pytest.raises(ValueError, match="suppress_ids"):
        DecoderSpec(num_layers=1, num_heads=1, head_dim=4, vocab_size=10, suppress_ids=(10,))


@pytest.fixture(scope="module")
def tokenizer() -> SubwordTokenizer:
    texts = ["forty-two", "three hundred and twelve", "zweiundvierzig"]
    return SubwordTokenizer.train(texts, 120, extra_special_tokens=["<2de>", "<2fr>"])


def test_text_source_normalises_then_tags(tokenizer: SubwordTokenizer) -> None:
    spec = TokenizerSpec(normalizer=("lowercase", "whitespace", "final_stop", "en_number_words"))
    source = TextSource("t", tokenizer, ("de", "fr"), 64, spec)
    assert source.ids("  Forty two. ", "de").tolist() == tokenizer.encode("<2de> forty-two")
    plain = TextSource("t", tokenizer, ("de", "fr"), 64)  # older entries: tagged, not normalised
    assert plain.ids("forty-two", "fr").tolist() == tokenizer.encode("<2fr> forty-two")
    with pytest.raises(InvalidArgument, match="empty once normalised"):
        source.ids(" ... ", "de")
    with pytest.raises(InvalidArgument, match="choose one of: de, fr"):
        source.ids("forty-two", "")


def test_text_source_without_tags(tokenizer: SubwordTokenizer) -> None:
    single = TextSource("m", tokenizer, ("de",), 64, TokenizerSpec(language_tag=""))
    assert single.ids("forty-two", "").tolist() == tokenizer.encode("forty-two")  # the one
    assert single.ids("forty-two", "de").tolist() == tokenizer.encode("forty-two")
    with pytest.raises(InvalidArgument, match="choose one of: de"):
        single.ids("forty-two", "fr")
    multi = TextSource("m", tokenizer, ("de", "fr"), 64, TokenizerSpec(language_tag=">>{}<<"))
    assert multi.ids("x", "fr").tolist() == tokenizer.encode(">>fr<< x")
