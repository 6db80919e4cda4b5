"""The tiny random MarianMTModel of ``hf_sources`` in PyTorch, and what ``generate`` and the
served copy (``hf_repository``'s "marian") give: the oracle of the decoding-option tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.client import AttnServeClient
from tests.export.hf_fixtures import MARIAN_MAX_LENGTH, hf_generated, marian_texts


def load_marian(directory: Path, texts: int = 40, seed: int = 11) -> dict[str, Any]:
    """Its tokenizer, model (eval) and ``texts`` source texts."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    return {"tokenizer": tokenizer, "model": model, "texts": marian_texts(texts, seed=seed)}


def generate(marian: dict[str, Any], texts: list[str], **options: Any) -> list[list[int]]:
    """``generate``'s ids of ``texts`` (no start token, cut at EOS) with ``options``."""
    import torch

    tokenizer = marian["tokenizer"]
    with torch.no_grad():
        rows = marian["model"].generate(
            **tokenizer(texts, return_tensors="pt", padding=True),
            do_sample=False,
            max_length=MARIAN_MAX_LENGTH,
            **options,
        )
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if "stop_strings" in options:  # a row a stop string ended is padded without an EOS
        return [hf_generated(_cut_at(row, pad, start=1), eos, pad) for row in rows.tolist()]
    return [hf_generated(row, eos, pad) for row in rows.tolist()]


def generate_greedy(marian: dict[str, Any], text: str, **options: Any) -> Any:
    """``generate``'s greedy search of ``text`` with ``options``, with the steps' scores
    (``output_scores``, ``return_dict_in_generate``)."""
    import torch

    with torch.no_grad():
        return marian["model"].generate(
            **marian["tokenizer"]([text], return_tensors="pt"),
            num_beams=1,
            do_sample=False,
            max_length=MARIAN_MAX_LENGTH,
            output_scores=True,
            return_dict_in_generate=True,
            **options,
        )


def generate_beams(marian: dict[str, Any], text: str, beams: int = 4, returned: int = 3) -> Any:
    """``generate``'s beam search of ``text``: its ``returned`` best sequences with the steps'
    scores and beam indices (``output_scores``, ``return_dict_in_generate``)."""
    import torch

    with torch.no_grad():
        return marian["model"].generate(
            **marian["tokenizer"]([text], return_tensors="pt"),
            num_beams=beams,
            num_return_sequences=returned,
            do_sample=False,
            max_length=MARIAN_MAX_LENGTH,
            output_scores=True,
            return_dict_in_generate=True,
        )


def _cut_at(row: list[int], token: int, start: int) -> list[int]:
    """``row`` up to the first ``token`` at or after ``start``."""
    return row[: row.index(token, start)] if token in row[start:] else row


def translate(hf_client: AttnServeClient, texts: list[str], **options: Any) -> list[list[int]]:
    """The served copy's token ids of ``texts`` (German) with ``options``."""
    return [r.token_ids for r in hf_client.translate(texts, to="de", model="marian", **options)]
