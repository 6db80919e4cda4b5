"""Target prefixes (``TranslateRequest.target_prefixes``, ``target_prefix``, ``prefix``) checked
against transformers itself.

A prefix's tokens are the model tokenizer's target-side tokens (hypothesis, against
``MarianTokenizer(text_target=...)``); the tiny random MarianMTModel and ViT + GPT-2 captioner of
``hf_repository``, served for real, give exactly ``generate``'s token ids with
``decoder_input_ids`` = the start token and the prefix's ids: greedy (texts with and without
prefixes in one call), beam search with its scores, ``max_new_tokens`` / ``min_new_tokens``
counted after the prefix, the tokens' log-probabilities, streams, KServe inputs, two frontend
processes and the CLI. Bad prefixes get INVALID_ARGUMENT or RESOURCE_EXHAUSTED saying what to
change, on both APIs.
"""

from __future__ import annotations

import io
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
from serving.client import AttnServeClient, ClientError  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from tests.export.hf_fixtures import (  # noqa: E402
    CAPTION_MAX_LENGTH,
    MARIAN_MAX_LENGTH,
    hf_generated,
    marian_texts,
    sample_images,
)
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

TEXTS = 24
TOLERANCE = 2e-4  # ONNX Runtime against PyTorch logits, through a log-softmax


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    """transformers' tokenizer and model, the test texts and a prefix for each: the text of the
    first 1-3 tokens of another text's greedy output ("" for every fourth text)."""
    directory = hf_sources["marian"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    texts = marian_texts(TEXTS, seed=31)
    marian = {"tokenizer": tokenizer, "model": model, "texts": texts}
    plain = [generate(marian, text, "") for text in texts]
    prefixes = []
    for index in range(TEXTS):
        other = plain[(index + 5) % TEXTS]
        words = tokenizer.decode(other[: 1 + index % 3], skip_special_tokens=True)
        prefixes.append("" if index % 4 == 3 else words)
    marian["plain"], marian["prefixes"] = plain, prefixes
    return marian


def prefix_ids(marian: dict[str, Any], prefix: str) -> list[int]:
    """transformers' target-side ids of ``prefix`` (without the EOS it appends)."""
    return marian["tokenizer"](text_target=prefix).input_ids[:-1] if prefix else []


def generate(marian: dict[str, Any], text: str, prefix: str, **options: Any) -> list[int]:
    """``generate``'s ids (prefix included, cut at EOS) of ``text`` decoded after ``prefix``."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    start = model.config.decoder_start_token_id
    options = {"num_beams": 1, "max_length": MARIAN_MAX_LENGTH, **options}
    with torch.no_grad():
        row = model.generate(
            **tokenizer([text], return_tensors="pt"),
            decoder_input_ids=torch.tensor([[start, *prefix_ids(marian, prefix)]]),
            do_sample=False,
            **options,
        )
    return hf_generated(row[0].tolist(), tokenizer.eos_token_id, tokenizer.pad_token_id)


# --- the prefix's tokens ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_tokenizer(hf_repository: Path) -> Any:
    entry = hf_repository / "marian"
    return load_text_tokenizer(resolve_version(entry), read_model_config(entry).tokenizer)


WORDS = ["die", "der", "und", "nicht", "ein", "zwei", "drei", "Haus", "über", "ß", "!"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(WORDS) | st.text("abcdefgh ,.", max_size=6), max_size=6))
def test_prefix_tokens_are_marians_target_tokens(
    served_tokenizer: Any, marian: dict[str, Any], pieces: list[str]
) -> None:
    text = " ".join(pieces)
    expected = marian["tokenizer"](text_target=text).input_ids[:-1]
    assert served_tokenizer.encode_target(text) == expected


# --- served, against generate() -----------------------------------------------------------------


def test_greedy_with_prefixes_is_generate(hf_client: AttnServeClient, marian: dict) -> None:
    """One call of texts with and without prefixes: each translation is generate()'s after its
    prefix, and starts with the prefix's tokens and text; unprefixed ones are unchanged."""
    texts, prefixes = marian["texts"], marian["prefixes"]
    served = hf_client.translate(texts, to="de", model="marian", prefix=prefixes)
    expected = [generate(marian, t, p) for t, p in zip(texts, prefixes, strict=True)]
    assert [r.token_ids for r in served] == expected
    decode = marian["tokenizer"].decode
    for result, prefix, plain in zip(served, prefixes, marian["plain"], strict=True):
        ids = prefix_ids(marian, prefix)
        assert result.token_ids[: len(ids)] == ids
        assert result.text == decode(result.token_ids, skip_special_tokens=True)
        assert result.text.startswith(decode(ids, skip_special_tokens=True))
        if not prefix:
            assert result.token_ids == plain
    changed = sum(r.token_ids != p for r, p in zip(served, marian["plain"], strict=True))
    assert changed >= TEXTS // 2  # the prefixes steer the outputs


def test_beam_search_with_a_prefix_is_generate(hf_client: AttnServeClient, marian: dict) -> None:
    """4 beams after the prefix: generate()'s ids and its sequence score (the prefix counted in
    neither the log-probabilities nor the length)."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    start = model.config.decoder_start_token_id
    for text, prefix in list(zip(marian["texts"], marian["prefixes"], strict=True))[:10]:
        with torch.no_grad():
            out = model.generate(
                **tokenizer([text], return_tensors="pt"),
                decoder_input_ids=torch.tensor([[start, *prefix_ids(marian, prefix)]]),
                num_beams=4,
                do_sample=False,
                max_length=MARIAN_MAX_LENGTH,
                output_scores=True,
                return_dict_in_generate=True,
            )
        expected = hf_generated(
            out.sequences[0].tolist(), tokenizer.eos_token_id, tokenizer.pad_token_id
        )
        (result,) = hf_client.translate([text], to="de", model="marian", beam_size=4, prefix=prefix)
        assert result.token_ids == expected
        assert result.score == pytest.approx(float(out.sequences_scores[0]), abs=TOLERANCE)


def test_token_limits_count_after_the_prefix(hf_client: AttnServeClient, marian: dict) -> None:
    pairs = zip(marian["texts"], marian["prefixes"], strict=True)
    short = [(t, p) for t, p in pairs if len(prefix_ids(marian, p)) <= 6]  # room for 8 more
    texts, prefixes = [t for t, _ in short], [p for _, p in short]
    assert len(texts) >= 12
    for options in ({"max_new_tokens": 2}, {"min_new_tokens": 8}):
        served = hf_client.translate(texts, to="de", model="marian", prefix=prefixes, **options)
        for text, prefix, result in zip(texts, prefixes, served, strict=True):
            assert result.token_ids == generate(marian, text, prefix, **options)
            new = len(result.token_ids) - len(prefix_ids(marian, prefix))
            assert new <= 2 if "max_new_tokens" in options else new >= 8


def test_log_probs_after_a_prefix_are_generates_scores(
    hf_client: AttnServeClient, marian: dict
) -> None:
    """The prefix's tokens' log-probabilities are 0 (given, as a forced EOS); the chosen tokens'
    are generate()'s scores, the score their sum with EOS's."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    start = model.config.decoder_start_token_id
    texts, prefixes = marian["texts"][:12], marian["prefixes"][:12]
    served = hf_client.translate(
        texts, to="de", model="marian", prefix=prefixes, return_log_probs=True
    )
    for text, prefix, result in zip(texts, prefixes, served, strict=True):
        ids = prefix_ids(marian, prefix)
        with torch.no_grad():
            out = model.generate(
                **tokenizer([text], return_tensors="pt"),
                decoder_input_ids=torch.tensor([[start, *ids]]),
                num_beams=1,
                do_sample=False,
                max_length=MARIAN_MAX_LENGTH,
                output_scores=True,
                return_dict_in_generate=True,
            )
        chosen = out.sequences[0, 1 + len(ids) :].tolist()
        scores = [float(step[0, token]) for step, token in zip(out.scores, chosen, strict=False)]
        new = len(result.token_ids) - len(ids)
        assert result.token_log_probs[: len(ids)] == pytest.approx([0.0] * len(ids))
        np.testing.assert_allclose(result.token_log_probs[len(ids) :], scores[:new], atol=TOLERANCE)
        ended = result.finish_reason == "stop"
        assert result.score == pytest.approx(sum(scores[: new + ended]), abs=3 * TOLERANCE)


def test_a_stream_starts_with_the_prefix(hf_server: ServerThread, marian: dict) -> None:
    text, prefix = marian["texts"][0], marian["prefixes"][0]
    expected = generate(marian, text, prefix)
    request = pb.TranslateStreamRequest(
        text=text, target_language="de", model="marian", target_prefix=prefix
    )
    with grpc.insecure_channel(hf_server.address) as channel:
        messages = list(pb_grpc.AttnServeStub(channel).TranslateStream(request, timeout=30))
    ids = [token for message in messages for token in message.token_ids]
    assert ids == expected
    assert next(m.index for m in messages if m.token_ids) == 0
    text_out = "".join(m.delta for m in messages)
    assert text_out == marian["tokenizer"].decode(expected, skip_special_tokens=True)
    assert messages[-1].usage.output_tokens == len(expected)  # the prefix's tokens count


def test_kserve_target_prefix_input(hf_server: ServerThread, marian: dict) -> None:
    texts, prefixes = marian["texts"][:8], marian["prefixes"][:8]
    expected = [generate(marian, t, p) for t, p in zip(texts, prefixes, strict=True)]
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian",
            ("text", "BYTES", [t.encode() for t in texts]),
            ("target_prefix", "BYTES", [p.encode() for p in prefixes]),
        )
        rows = decode_outputs(stub.ModelInfer(request, timeout=30))["token_ids"].tolist()
    assert [[t for t in row if t != -1] for row in rows] == expected


def test_two_frontend_processes_carry_the_prefix(hf_repository: Path, marian: dict) -> None:
    texts, prefixes = marian["texts"][:6], marian["prefixes"][:6]
    expected = [generate(marian, t, p) for t, p in zip(texts, prefixes, strict=True)]
    with two_frontends(hf_repository, models=("marian",), connections=2) as (_, stubs):
        for stub in stubs:
            request = infer_request(
                "marian",
                ("text", "BYTES", [t.encode() for t in texts]),
                ("target_prefix", "BYTES", [p.encode() for p in prefixes]),
            )
            rows = decode_outputs(stub.ModelInfer(request, timeout=60))["token_ids"].tolist()
            assert [[t for t in row if t != -1] for row in rows] == expected


def test_the_cli_passes_the_prefix(
    hf_server: ServerThread, marian: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    text, prefix = marian["texts"][1], marian["prefixes"][1]
    expected = marian["tokenizer"].decode(generate(marian, text, prefix), skip_special_tokens=True)
    args = ["translate", text, "--to", "de", "--model", "marian", "--server", hf_server.address]
    assert attnserve_cli.main([*args, "--prefix", prefix]) == 0
    assert capsys.readouterr().out.strip() == expected


# --- the captioner ------------------------------------------------------------------------------


def test_captioner_prefix_is_generate(
    hf_server: ServerThread, hf_client: AttnServeClient, hf_sources: dict[str, Path]
) -> None:
    """A caption after a prefix (the attnserve API and KServe's ``prefix`` input) is
    generate()'s with the prefix's GPT-2 tokens as decoder input."""
    directory = hf_sources["hf-captioner"]
    processor = transformers.AutoImageProcessor.from_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.VisionEncoderDecoderModel.from_pretrained(directory).eval()
    images = sample_images(6, seed=9)
    start = model.config.decoder_start_token_id
    pixels = processor(
        images=[Image.open(io.BytesIO(b)) for b in images], return_tensors="pt"
    ).pixel_values
    with torch.no_grad():
        plain = model.generate(pixel_values=pixels, do_sample=False, max_length=CAPTION_MAX_LENGTH)
    end = tokenizer.eos_token_id
    prefixes = [
        tokenizer.decode(hf_generated(plain[(i + 1) % 6].tolist(), end, end)[:2]) for i in range(6)
    ]
    expected = []
    for i, prefix in enumerate(prefixes):
        ids = tokenizer(prefix, add_special_tokens=False).input_ids
        with torch.no_grad():
            row = model.generate(
                pixel_values=pixels[i : i + 1],
                decoder_input_ids=torch.tensor([[start, *ids]]),
                do_sample=False,
                max_length=CAPTION_MAX_LENGTH,
            )
        expected.append(hf_generated(row[0].tolist(), end, end))
    served = [
        hf_client.caption(data, model="hf-captioner", prefix=prefix)
        for data, prefix in zip(images, prefixes, strict=True)
    ]
    assert [r.token_ids for r in served] == expected
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "hf-captioner",
            ("image", "BYTES", images),
            ("prefix", "BYTES", [p.encode() for p in prefixes]),
        )
        rows = decode_outputs(stub.ModelInfer(request, timeout=30))["token_ids"].tolist()
    assert [[t for t in row if t != -1] for row in rows] == expected


# --- bad prefixes -------------------------------------------------------------------------------


LONG = " ".join(["zwei drei"] * 40)


@pytest.mark.parametrize(
    ("prefixes", "options", "code", "message"),
    [
        (["a", "b"], {}, "INVALID_ARGUMENT", "2 target_prefixes for 1 texts"),
        ([LONG], {}, "RESOURCE_EXHAUSTED", "a prefix must leave room"),
        (["zwei"], {"max_new_tokens": 19}, "INVALID_ARGUMENT", "less the target prefix's"),
        (["日本"], {}, "INVALID_ARGUMENT", "tokenizes to special tokens"),
    ],
    ids=["count", "long", "room", "unknown"],
)
def test_bad_prefixes_say_what_to_change(
    hf_server: ServerThread,
    hf_client: AttnServeClient,
    prefixes: list[str],
    options: dict[str, Any],
    code: str,
    message: str,
) -> None:
    with pytest.raises(ClientError, match=code) as caught:
        hf_client.translate(["one two"], to="de", model="marian", prefix=prefixes, **options)
    assert message in str(caught.value)
    if len(prefixes) != 1:
        return
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian",
            ("text", "BYTES", [b"one two"]),
            ("target_prefix", "BYTES", [prefixes[0].encode()]),
            **options,
        )
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(request, timeout=30)
    assert rpc.value.code().name == code
    assert message in rpc.value.details()
