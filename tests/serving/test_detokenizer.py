"""Streamed text deltas: their concatenation is the full decode, however the tokens arrive."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.tokenizer import SubwordTokenizer
from models.data.translation import generate_pairs
from serving.generation.detokenizer import IncrementalDetokenizer

CHECKPOINT = Path(__file__).resolve().parents[2] / "models" / "checkpoints" / "translator"
TOKENIZER = SubwordTokenizer.load(CHECKPOINT)
TEXTS = [t for p in generate_pairs(100, seed=5, split="test") for t in (p.source, p.target)]
TEXTS += ["zwölf ünd ça", "dreihundertzwölf", ""]


def stream(ids: list[int], sizes: list[int]) -> tuple[list[str], str]:
    """Feed ``ids`` in chunks of ``sizes`` (cycled); the deltas and the final rest."""
    detok = IncrementalDetokenizer(TOKENIZER)
    deltas, start, turn = [], 0, 0
    while start < len(ids):
        size = sizes[turn % len(sizes)]
        deltas.append(detok.add(ids[start : start + size]))
        start, turn = start + size, turn + 1
    return deltas, detok.rest(TOKENIZER.decode(ids))


@settings(max_examples=300, deadline=None)
@given(text=st.sampled_from(TEXTS), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_deltas_add_up_to_the_full_decode(text: str, sizes: list[int]) -> None:
    ids = TOKENIZER.encode(text)
    deltas, rest = stream(ids, sizes)
    assert "".join(deltas) + rest == TOKENIZER.decode(ids)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(3, TOKENIZER.vocab_size - 1), max_size=30))
def test_any_token_sequence_streams_to_its_decode(ids: list[int]) -> None:
    deltas, rest = stream(ids, [1])
    assert "".join(deltas) + rest == TOKENIZER.decode(ids)


def test_one_token_at_a_time_emits_text_as_it_settles() -> None:
    ids = TOKENIZER.encode("three hundred and twelve")
    deltas, rest = stream(ids, [1])
    assert sum(1 for d in deltas if d) > 1 and rest == ""
