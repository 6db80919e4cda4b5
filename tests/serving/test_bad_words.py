"""Bad words (``bad_words``) checked against transformers itself.

The rule against HF's ``NoBadWordsLogitsProcessor`` on random rows (hypothesis); each word's
token sequences (alone and after a space) on Marian's SentencePiece and GPT-2's byte-level BPE;
then the tiny random ViT + GPT-2 captioner of ``hf_repository`` served for real: greedy decoding
and beam search with bad words give exactly ``generate(bad_words_ids=...)``'s token ids (the
attnserve API, KServe's ``bad_words`` input, a stream, two frontend processes, the CLI); bad words
say what to change.
"""

from __future__ import annotations

import collections
import functools
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402
from PIL import Image  # noqa: E402

import attnserve_cli  # noqa: E402
from contract.repository import read_model_config, resolve_version  # noqa: E402
from contract.text import load_text_tokenizer  # noqa: E402
from export.exporter import ExportOptions, export  # noqa: E402
from serving.client import AttnServeClient, ClientError  # noqa: E402
from serving.generation.history_rules import HistoryRules  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from serving.served.inputs import BadWords  # noqa: E402
from tests.export.hf_fixtures import CAPTION_MAX_LENGTH, hf_generated, sample_images  # noqa: E402
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.hf_marian import generate, load_marian, translate  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")


# --- the rule against HF's processor ------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(vocab=st.integers(2, 10), data=st.data())
def test_the_rule_is_hfs_no_bad_words_processor(vocab: int, data: st.DataObject) -> None:
    tokens = st.integers(0, vocab - 1)
    start = data.draw(tokens)
    generated = np.asarray(data.draw(st.lists(tokens, max_size=10)), dtype=np.int64)
    words = data.draw(
        st.lists(st.lists(tokens, min_size=1, max_size=3).map(tuple), min_size=1, max_size=4)
    )
    words = list(dict.fromkeys(words))
    scores = np.asarray(
        data.draw(st.lists(st.floats(-5, 5, width=32), min_size=vocab, max_size=vocab))
    )
    ours = scores.copy()
    HistoryRules(1.0, 0, start, tuple(words)).apply(ours, generated)
    ids = torch.tensor([[start, *generated.tolist()]])
    processor = transformers.NoBadWordsLogitsProcessor([list(w) for w in words])
    theirs = processor(ids, torch.tensor(scores[None]))
    np.testing.assert_array_equal(ours, theirs[0].numpy())


# --- each word's token sequences ----------------------------------------------------------------


def _served_tokenizer(repository: Path, name: str) -> Any:
    entry = repository / name
    return load_text_tokenizer(resolve_version(entry), read_model_config(entry).tokenizer)


def test_a_word_is_banned_alone_and_after_a_space(
    hf_repository: Path, hf_sources: dict[str, Path]
) -> None:
    gpt2 = transformers.AutoTokenizer.from_pretrained(hf_sources["hf-captioner"])
    words = BadWords("hf-captioner", _served_tokenizer(hf_repository, "hf-captioner"))
    # two tokens alone, one inside a sentence
    alone, spaced = (gpt2(t, add_special_tokens=False).input_ids for t in ("triangle", " triangle"))
    assert len(alone) == 2 and len(spaced) == 1
    assert words.ids(("triangle",)) == (tuple(alone), tuple(spaced))
    assert words.ids((" triangle",)) == words.ids(("triangle",))  # however it is sent
    # SentencePiece writes a word the same alone and after a space: kept once
    marian_tok = transformers.AutoTokenizer.from_pretrained(hf_sources["marian"])
    pieces = BadWords("marian", _served_tokenizer(hf_repository, "marian"))
    expected = marian_tok(text_target="zwei", add_special_tokens=False).input_ids
    assert pieces.ids(("zwei",)) == (tuple(expected),)


# --- served, against generate() -----------------------------------------------------------------
# The tiny random Marian never writes SentencePiece's word start, so words cannot change its
# outputs; the tiny GPT-2 captioner's byte-level BPE writes words as it spells them.


@pytest.fixture(scope="module")
def captioner(hf_sources: dict[str, Path]) -> dict[str, Any]:
    """The captioner in PyTorch, 12 images, their plain greedy captions and bad words that
    change them: the commonest token spelled alone and a two-token sequence of another."""
    directory = hf_sources["hf-captioner"]
    processor = transformers.AutoImageProcessor.from_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.VisionEncoderDecoderModel.from_pretrained(directory).eval()
    images = sample_images(12, seed=9)
    pixels = processor(
        images=[Image.open(io.BytesIO(b)) for b in images], return_tensors="pt"
    ).pixel_values
    found = {"tokenizer": tokenizer, "model": model, "images": images, "pixels": pixels}
    plain = caption_ids(found)
    spell = functools.partial(_spelled, tokenizer)
    counts = collections.Counter(t for ids in plain for t in ids)
    single = next(t for t, _ in counts.most_common() if spell([t]) is not None)
    pair = next(
        ids[i : i + 2]
        for ids in plain
        for i in range(len(ids) - 1)
        if single not in ids[i : i + 2] and spell(ids[i : i + 2]) is not None
    )
    words = [spell([single]), spell(pair)]
    ids = {tuple(_ids(tokenizer, form)) for w in words for form in (w, " " + w.lstrip())}
    return found | {"plain": plain, "words": words, "ids": sorted(ids)}


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _spelled(tokenizer: Any, ids: list[int]) -> str | None:
    """The text of ``ids`` where tokenizing it gives them back (and it is not blank)."""
    text = tokenizer.decode(ids)
    return text if text.strip() and _ids(tokenizer, text.lstrip()) == ids else None


def caption_ids(captioner: dict[str, Any], **options: Any) -> list[list[int]]:
    """``generate``'s caption ids of every image (greedy unless ``num_beams``)."""
    end = captioner["tokenizer"].eos_token_id
    rows = []
    for index in range(len(captioner["images"])):  # one at a time: GPT-2 pads with its EOS
        with torch.no_grad():
            row = captioner["model"].generate(
                pixel_values=captioner["pixels"][index : index + 1],
                do_sample=False,
                max_length=CAPTION_MAX_LENGTH,
                **options,
            )
        rows.append(hf_generated(row[0].tolist(), end, end))
    return rows


def test_greedy_with_bad_words_is_generate(
    hf_client: AttnServeClient, captioner: dict[str, Any]
) -> None:
    words, ids = captioner["words"], captioner["ids"]
    expected = caption_ids(captioner, bad_words_ids=[list(i) for i in ids])
    assert expected != captioner["plain"]  # the words change outputs
    served = [
        hf_client.caption(data, model="hf-captioner", bad_words=words).token_ids
        for data in captioner["images"]
    ]
    assert served == expected
    for tokens, word in ((t, w) for t in served for w in ids):  # no output holds a word
        assert all(tuple(tokens[i : i + len(word)]) != word for i in range(len(tokens)))
    streamed = "".join(
        hf_client.caption_stream(captioner["images"][0], model="hf-captioner", bad_words=words)
    )
    assert streamed == captioner["tokenizer"].decode(expected[0], skip_special_tokens=True)


def test_beam_search_with_bad_words_is_generate(
    hf_client: AttnServeClient, captioner: dict[str, Any]
) -> None:
    """Beam search renormalises each beam's log-probabilities after the bans, as ``generate``
    with ``renormalize_logits`` (Marian's generation configs set it)."""
    words, ids = captioner["words"], captioner["ids"]
    beams = {"num_beams": 4, "renormalize_logits": True}
    expected = caption_ids(captioner, bad_words_ids=[list(i) for i in ids], **beams)
    assert expected != caption_ids(captioner, **beams)
    served = [
        hf_client.caption(data, model="hf-captioner", beam_size=4, bad_words=words).token_ids
        for data in captioner["images"]
    ]
    assert served == expected


def _kserve_rows(stub: Any, captioner: dict[str, Any]) -> list[list[int]]:
    request = infer_request(
        "hf-captioner",
        ("image", "BYTES", captioner["images"]),
        ("bad_words", "BYTES", [w.encode() for w in captioner["words"]]),
    )
    rows = decode_outputs(stub.ModelInfer(request, timeout=30))["token_ids"].tolist()
    return [[t for t in row if t != -1] for row in rows]


def test_kserve_bad_words_input(hf_server: ServerThread, captioner: dict[str, Any]) -> None:
    expected = caption_ids(captioner, bad_words_ids=[list(i) for i in captioner["ids"]])
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        assert _kserve_rows(stub, captioner) == expected


def test_two_frontend_processes_carry_bad_words(
    hf_repository: Path, captioner: dict[str, Any]
) -> None:
    expected = caption_ids(captioner, bad_words_ids=[list(i) for i in captioner["ids"]])
    with two_frontends(hf_repository, models=("hf-captioner",), connections=2) as (_, stubs):
        for stub in stubs:
            assert _kserve_rows(stub, captioner) == expected


def test_the_cli_passes_bad_words(
    hf_server: ServerThread,
    captioner: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = caption_ids(captioner, bad_words_ids=[list(i) for i in captioner["ids"]])[0]
    image = tmp_path / "image.png"
    image.write_bytes(captioner["images"][0])
    flags = [flag for word in captioner["words"] for flag in ("--bad-word", word)]
    args = ["caption", str(image), "--model", "hf-captioner", "--server", hf_server.address]
    assert attnserve_cli.main([*args, *flags]) == 0
    text = captioner["tokenizer"].decode(expected, skip_special_tokens=True)
    assert capsys.readouterr().out.rstrip("\n") == text


# --- bad values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["  "], "bad_words[0] must be a non-empty string"),
        (["x" * 257], "bad_words[0] is 257 characters long: send at most 256"),
        ([f"w{i}" for i in range(65)], "bad_words holds 65 strings: send at most 64"),
        (["日本"], "tokenizes to special tokens"),
    ],
    ids=["blank", "long", "many", "unknown"],
)
def test_bad_words_say_what_to_change(
    hf_server: ServerThread, hf_client: AttnServeClient, words: list[str], message: str
) -> None:
    with pytest.raises(ClientError, match="INVALID_ARGUMENT") as caught:
        hf_client.translate(["one two"], to="de", model="marian", bad_words=words)
    assert message in str(caught.value)
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian",
            ("text", "BYTES", [b"one two"]),
            ("bad_words", "BYTES", [w.encode() for w in words]),
        )
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(request, timeout=30)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in rpc.value.details()


# --- a model's own bad words (its generation config's bad_words_ids) ----------------------------


def test_a_models_own_bad_words_apply_to_every_request(
    hf_sources: dict[str, Path], tmp_path: Path
) -> None:
    """A generation config's ``bad_words_ids`` entry of two tokens (the commonest pair of the
    plain greedy outputs) is exported as ``DecoderSpec.bad_words``: served greedy and beam
    outputs are ``generate``'s, which applies the config by itself, and change."""
    source = tmp_path / "marian"
    shutil.copytree(hf_sources["marian"], source)
    plain_model = load_marian(source, texts=16)
    plain = generate(plain_model, plain_model["texts"], num_beams=1)
    pairs = collections.Counter(tuple(ids[i : i + 2]) for ids in plain for i in range(len(ids) - 1))
    (pair, _), *_ = pairs.most_common(1)
    config = json.loads((source / "generation_config.json").read_text())
    config["bad_words_ids"] = [*config["bad_words_ids"], list(pair)]
    (source / "generation_config.json").write_text(json.dumps(config))
    banned_model = load_marian(source, texts=16)
    texts = banned_model["texts"]
    expected = generate(banned_model, texts, num_beams=1)
    assert expected != plain
    export(str(source), tmp_path / "repository", ExportOptions(name="marian", parity_examples=20))
    spec = read_model_config(tmp_path / "repository" / "marian").decoder
    assert spec.bad_words == (pair,)
    repository = tmp_path / "repository"
    with (
        ServerThread(repository, metrics_port=-1) as server,
        AttnServeClient(server.address) as client,
    ):
        assert translate(client, texts) == expected
        beams = [translate(client, [t], beam_size=4)[0] for t in texts[:6]]
    assert beams == generate(banned_model, texts[:6], num_beams=4)
