"""Hugging Face models served end to end, checked against transformers itself.

Tiny random-weight MarianMTModel, ViTForImageClassification and VisionEncoderDecoderModel
(ViT + GPT-2) directories with real tokenizer and image-processor files made here
(``tests/export/hf_fixtures.py``) are exported with ``attnserve export``'s code and served by the
real server; every served answer is compared with transformers on the same inputs: greedy token
ids with ``generate(num_beams=1, do_sample=False)`` at the same max length, texts with the
tokenizer's ``decode``, top-1 labels with the model's argmax, pixels with the image processor.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402
from PIL import Image  # noqa: E402

from contract.model_config import GeneratorConfig  # noqa: E402
from contract.repository import read_model_config, resolve_version  # noqa: E402
from contract.text import load_text_tokenizer  # noqa: E402
from serving.client import AttnServeClient  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from serving.served.inputs import ImageSource, TextSource  # noqa: E402
from tests.export.hf_fixtures import (  # noqa: E402
    CAPTION_MAX_LENGTH,
    MARIAN_MAX_LENGTH,
    count_pad,
    hf_generated,
    marian_texts,
    sample_images,
)
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

EXAMPLES = 120  # inputs per model (the goal: >= 100)
PIXEL_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return sample_images(EXAMPLES)


def _pil(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def _entry(repository: Path, name: str) -> tuple[Any, Path]:
    entry = repository / name
    return read_model_config(entry), resolve_version(entry)


# --- MarianMTModel ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    """transformers' tokenizer, model and greedy generations for the test texts."""
    directory = hf_sources["marian"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    texts = marian_texts(EXAMPLES)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(
            **batch, num_beams=1, do_sample=False, max_length=MARIAN_MAX_LENGTH
        )
        unsuppressed = model.generate(
            **batch, num_beams=1, do_sample=False, max_length=MARIAN_MAX_LENGTH, bad_words_ids=None
        )
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    return {
        "tokenizer": tokenizer,
        "texts": texts,
        "ids": [hf_generated(row, eos, pad) for row in generated.tolist()],
        "pad_without_rule": count_pad(unsuppressed, pad),
    }


def test_marian_source_ids_are_marian_tokenizers(hf_repository: Path, marian: dict) -> None:
    config, version_dir = _entry(hf_repository, "marian")
    assert isinstance(config, GeneratorConfig) and config.tokenizer.kind == "sentencepiece"
    assert config.languages == ("de",) and config.tokenizer.language_tag == ""
    source = TextSource(
        "marian",
        load_text_tokenizer(version_dir, config.tokenizer),
        config.languages,
        config.limits.max_source_length,
        config.tokenizer,
    )
    expected = marian["tokenizer"](marian["texts"]).input_ids
    assert [source.ids(text, "de").tolist() for text in marian["texts"]] == expected
    assert source.ids(marian["texts"][0], "").tolist() == expected[0]  # the one language


def test_marian_translate_is_generate(hf_client: AttnServeClient, marian: dict) -> None:
    """Greedy ids identical to generate() for every text; pad never generated (without the
    rule greedy decoding would choose it), forced EOS at max_length; text is decode()'s."""
    texts, tokenizer = marian["texts"], marian["tokenizer"]
    served = [
        r
        for i in range(0, len(texts), 32)
        for r in hf_client.translate(texts[i : i + 32], to="de", model="marian")
    ]
    assert [r.token_ids for r in served] == marian["ids"]
    assert [r.text for r in served] == [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in marian["ids"]
    ]
    assert marian["pad_without_rule"] > 0
    lengths = {len(ids) for ids in marian["ids"]}
    assert MARIAN_MAX_LENGTH - 2 in lengths and len(lengths) > 3  # forced EOS, and early ends
    assert all(r.finish_reason == "stop" for r in served)  # every one ends with EOS


def test_marian_stream_and_kserve_agree(
    hf_server: ServerThread, hf_client: AttnServeClient, marian
):
    texts = marian["texts"][:8]
    expected = [marian["tokenizer"].decode(ids, skip_special_tokens=True) for ids in marian["ids"]]
    for i, text in enumerate(texts):
        assert "".join(hf_client.translate_stream(text, to="de", model="marian")) == expected[i]
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian", ("text", "BYTES", [t.encode() for t in texts]), target_language="de"
        )
        outputs = decode_outputs(stub.ModelInfer(request, timeout=30))
        # one target language: the request may leave it out, as on the attnserve API
        untagged = infer_request("marian", ("text", "BYTES", [t.encode() for t in texts]))
        untagged_outputs = decode_outputs(stub.ModelInfer(untagged, timeout=30))
    assert [t.decode() for t in outputs["translation"].tolist()] == expected[:8]
    assert untagged_outputs["translation"].tolist() == outputs["translation"].tolist()
    for row, ids in zip(outputs["token_ids"].tolist(), marian["ids"][:8], strict=True):
        assert [t for t in row if t != -1] == ids


def test_marian_refuses_another_target_language(hf_client: AttnServeClient) -> None:
    with pytest.raises(Exception, match="choose one of: de"):
        hf_client.translate(["forty-two"], to="fr", model="marian")


# --- ViTForImageClassification ------------------------------------------------------------------


def test_vit_preprocessing_is_the_image_processors(
    hf_repository: Path, hf_sources: dict[str, Path], images: list[bytes]
) -> None:
    for name in ("hf-vit", "hf-captioner"):
        config, _ = _entry(hf_repository, name)
        processor = transformers.AutoImageProcessor.from_pretrained(hf_sources[name])
        expected = processor(images=[_pil(b) for b in images], return_tensors="np").pixel_values
        source = ImageSource(name, config.image, config.limits.max_image_bytes, np.float32)
        served = np.stack([source.pixels(data) for data in images])
        assert served.shape == expected.shape
        worst = float(np.abs(served - expected).max())
        assert worst <= PIXEL_TOLERANCE, f"{name}: max |pixel diff| {worst:.3g}"
    assert _entry(hf_repository, "hf-vit")[0].image.resample == "bicubic"


def test_vit_classify_is_the_models_argmax(
    hf_server: ServerThread,
    hf_client: AttnServeClient,
    hf_sources: dict[str, Path],
    images: list[bytes],
) -> None:
    processor = transformers.AutoImageProcessor.from_pretrained(hf_sources["hf-vit"])
    model = transformers.ViTForImageClassification.from_pretrained(hf_sources["hf-vit"]).eval()
    pixels = processor(images=[_pil(b) for b in images], return_tensors="pt").pixel_values
    with torch.no_grad():
        top = model(pixel_values=pixels).logits.argmax(-1).tolist()
    expected = [model.config.id2label[i] for i in top]
    assert len(set(expected)) > 2  # the images do not all look alike to the model
    served = [hf_client.classify(data, top_k=1, model="hf-vit")[0].label for data in images]
    assert served == expected
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request("hf-vit", ("image", "BYTES", images[:16]))
        labels = decode_outputs(stub.ModelInfer(request, timeout=30))["label"].tolist()
    assert [label.decode() for label in labels] == expected[:16]


# --- VisionEncoderDecoderModel (ViT + GPT-2) ----------------------------------------------------


def test_captioner_caption_is_generate(
    hf_client: AttnServeClient, hf_sources: dict[str, Path], images: list[bytes]
) -> None:
    directory = hf_sources["hf-captioner"]
    processor = transformers.AutoImageProcessor.from_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.VisionEncoderDecoderModel.from_pretrained(directory).eval()
    pixels = processor(images=[_pil(b) for b in images], return_tensors="pt").pixel_values
    with torch.no_grad():
        generated = model.generate(
            pixel_values=pixels, num_beams=1, do_sample=False, max_length=CAPTION_MAX_LENGTH
        )
    end = tokenizer.eos_token_id
    expected = [hf_generated(row, end, end) for row in generated.tolist()]
    assert len({len(ids) for ids in expected}) > 3  # some captions end early
    served = [hf_client.caption(data, model="hf-captioner") for data in images]
    assert [r.token_ids for r in served] == expected
    assert [r.text for r in served] == [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in expected
    ]
    streamed = "".join(hf_client.caption_stream(images[0], model="hf-captioner"))
    assert streamed == served[0].text


def test_marian_beam_search_is_generate(
    hf_client: AttnServeClient, hf_sources: dict[str, Path], marian
):
    """Beam search (4 beams, Marian's default) applies the same token rules as generate()."""
    model = transformers.MarianMTModel.from_pretrained(hf_sources["marian"]).eval()
    tokenizer, texts = marian["tokenizer"], marian["texts"][:24]
    with torch.no_grad():
        generated = model.generate(
            **tokenizer(texts, return_tensors="pt", padding=True),
            num_beams=4,
            do_sample=False,
            max_length=MARIAN_MAX_LENGTH,
        )
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    expected = [hf_generated(row, eos, pad) for row in generated.tolist()]
    served = [hf_client.translate([t], to="de", model="marian", beam_size=4)[0] for t in texts]
    assert [r.token_ids for r in served] == expected
