"""Hugging Face import: tiny random HF models saved locally, imported and compared with HF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face import tests need `pip install 'transformers>=4.50'`"
)

from export.errors import SourceError  # noqa: E402
from export.hf import load_hf_directory  # noqa: E402
from export.hf.weights import current_param_name  # noqa: E402
from export.sources import load_source  # noqa: E402
from models.generation import greedy_generate  # noqa: E402
from models.layers import sinusoidal_table  # noqa: E402
from tests.export.hf_fixtures import (  # noqa: E402
    VIT_LABELS,
    randomise,
    save_marian_tokenizer,
    save_word_tokenizer,
    tiny_marian_config,
)

TOLERANCE = 1e-4
MARIAN_PAD, MARIAN_EOS, MARIAN_VOCAB = 63, 0, 64


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the hub: every load is from a local directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@torch.no_grad()
def _save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory, safe_serialization=True)
    if isinstance(model, transformers.MarianMTModel):
        save_marian_tokenizer(directory, vocab_size=MARIAN_VOCAB)  # </s> 0, <pad> 63
    elif isinstance(model, transformers.VisionEncoderDecoderModel):
        save_word_tokenizer(directory, 40, {"<pad>": 0, "<s>": 1, "</s>": 2})
    return directory


def _marian(**overrides) -> torch.nn.Module:
    config = tiny_marian_config(MARIAN_VOCAB, MARIAN_PAD, MARIAN_EOS, **overrides)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    randomise(model, 1)
    with torch.no_grad():
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(2))
    model.generation_config.max_length = 17  # -> 16 new tokens: short parity runs
    return model.eval()


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    model = _marian()
    return model, _save(model, tmp_path_factory.mktemp("marian"))


def _vit_config(**overrides) -> object:
    fields = {
        "image_size": 32,
        "patch_size": 8,
        "num_channels": 3,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        **overrides,
    }
    return transformers.ViTConfig(**fields)


def _vit_classifier(qkv_bias: bool = True) -> torch.nn.Module:
    labels = ["cat", "dog", "owl", "eel", "yak"]
    config = _vit_config(
        qkv_bias=qkv_bias,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config)
    randomise(model, 3)
    return model.eval()


def _captioner(decoder_overrides: dict | None = None) -> torch.nn.Module:
    encoder = _vit_config(image_size=48, patch_size=16, layer_norm_eps=1e-5)
    fields = {
        "vocab_size": 40,
        "n_positions": 32,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 64,
        "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5,
        "add_cross_attention": True,
        "is_decoder": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        **(decoder_overrides or {}),
    }
    decoder = transformers.GPT2Config(**fields)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
    torch.manual_seed(0)
    model = transformers.VisionEncoderDecoderModel(config=config)
    randomise(model, 4)
    model.generation_config.max_length = 13
    return model.eval()


@pytest.fixture(scope="module")
def captioner(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    model = _captioner()
    return model, _save(model, tmp_path_factory.mktemp("captioner"))


def _strip(row: list[int], eos_id: int) -> list[int]:
    """HF generate output without the start token, cut at the first EOS."""
    row = row[1:]
    return row[: row.index(eos_id)] if eos_id in row else row


def _max_real_diff(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    return float((ours[real] - theirs[real]).abs().max())


# --- Marian -------------------------------------------------------------------------------------


def test_marian_imports_as_a_post_norm_translator(marian) -> None:
    hf_model, directory = marian
    loaded = load_hf_directory(directory)
    config = loaded.model.config
    assert loaded.kind == "translator" and loaded.tokenizer is None
    assert loaded.hf_tokenizer_dir == directory and loaded.origin == str(directory)
    entry = loaded.entry  # the tokenizer files serving reads, the generation rules it applies
    assert entry.tokenizer.kind == "sentencepiece" and entry.languages == ("de",)
    assert [name for name, _ in entry.tokenizer_files] == ["source.spm", "target.spm", "vocab.json"]
    assert (entry.suppress_ids, entry.forced_eos) == ((), False)  # this config sets neither
    assert not config.norm_first and config.activation == "swish" and config.scale_embedding
    assert (config.pad_id, config.eos_id, config.decoder_start_id) == (63, 0, 63)
    assert (config.num_heads, config.ffn_dim, config.max_positions) == (4, 64, 64)
    assert (config.max_source_length, config.max_target_length) == (64, 16)
    assert not loaded.model.training
    bias = loaded.model.decoder.final_logits_bias
    assert torch.equal(bias, hf_model.final_logits_bias) and bias.abs().sum() > 0
    assert len(loaded.checksum) == 64


def test_marian_sinusoidal_positions_match_ours(marian) -> None:
    hf_model, _ = marian
    theirs = hf_model.model.encoder.embed_positions.weight
    assert float((theirs - sinusoidal_table(64, 32)).abs().max()) < 1e-6


@torch.no_grad()
def test_marian_teacher_forced_logits_match_hf(marian) -> None:
    hf_model, directory = marian
    ours = load_hf_directory(directory).model
    src = torch.tensor([[5, 9, 17, 30, 41, 12, MARIAN_EOS], [7, 22, 3, MARIAN_EOS, 63, 63, 63]])
    src_mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    tgt = torch.tensor([[MARIAN_PAD, 4, 8, 15, 16], [MARIAN_PAD, 23, 42, 63, 63]])
    tgt_mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    theirs = hf_model(
        input_ids=src,
        attention_mask=src_mask,
        decoder_input_ids=tgt,
        decoder_attention_mask=tgt_mask,
    ).logits
    diff = _max_real_diff(ours(src, src_mask, tgt, tgt_mask), theirs, tgt_mask)
    assert diff <= TOLERANCE, f"max abs logits diff {diff:.3g}"


@torch.no_grad()
def test_marian_greedy_generation_matches_hf_generate(marian) -> None:
    hf_model, directory = marian
    ours = load_hf_directory(directory).model
    generator = torch.Generator().manual_seed(5)
    src = torch.randint(3, MARIAN_VOCAB - 1, (6, 9), generator=generator)
    src[:, -1] = MARIAN_EOS
    src_mask = torch.ones_like(src)
    src_mask[3, 5:] = 0
    src[3, 5:] = MARIAN_PAD
    new_tokens = 12
    theirs = hf_model.generate(
        input_ids=src,
        attention_mask=src_mask,
        num_beams=1,
        do_sample=False,
        max_new_tokens=new_tokens,
    )
    expected = [_strip(row, MARIAN_EOS) for row in theirs.tolist()]
    _, cross = ours.encode(src, src_mask)
    produced = greedy_generate(
        ours,
        cross,
        src_mask,
        max_new_tokens=new_tokens,
        start_id=ours.config.decoder_start_id,
        eos_id=ours.config.eos_id,
    )
    assert produced == expected


def test_load_source_dispatches_hf_directories(marian) -> None:
    _, directory = marian
    loaded = load_source(str(directory))
    assert loaded.kind == "translator" and loaded.extra["hf_architecture"] == "MarianMTModel"


def test_marian_with_untied_lm_head_is_refused(tmp_path: Path) -> None:
    model = _marian(tie_word_embeddings=False)  # separate shared / encoder / decoder / LM head
    with torch.no_grad():
        model.model.encoder.embed_tokens.weight.copy_(model.model.shared.weight)
        model.model.decoder.embed_tokens.weight.copy_(model.model.shared.weight)
        model.lm_head.weight.copy_(model.model.shared.weight + 1.0)
    _save(model, tmp_path)
    with pytest.raises(SourceError, match=r"LM head \(lm_head.weight\) is not tied"):
        load_hf_directory(tmp_path)


def test_marian_config_features_we_lack_are_refused(tmp_path: Path, marian) -> None:
    _, directory = marian
    for name in ("model.safetensors", "generation_config.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "normalize_before": True}))
    with pytest.raises(SourceError, match=r"unsupported MarianMTModel: normalize_before"):
        load_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "decoder_attention_heads": 2}))
    with pytest.raises(SourceError, match=r"attention heads"):
        load_hf_directory(tmp_path)


# --- ViT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("qkv_bias", [True, False])
@torch.no_grad()
def test_vit_logits_match_hf(tmp_path: Path, qkv_bias: bool) -> None:
    hf_model = _vit_classifier(qkv_bias)
    _save(hf_model, tmp_path)
    loaded = load_hf_directory(tmp_path)
    assert loaded.kind == "vit"
    assert loaded.model.config.labels == ("cat", "dog", "owl", "eel", "yak")
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    diff = float((loaded.model(pixels) - hf_model(pixel_values=pixels).logits).abs().max())
    assert diff <= TOLERANCE, f"max abs logits diff {diff:.3g}"


def test_vit_normalisation_comes_from_preprocessor_config(tmp_path: Path) -> None:
    _save(_vit_classifier(), tmp_path)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": mean, "image_std": std, "rescale_factor": 1 / 255})
    )
    config = load_hf_directory(tmp_path).model.config
    assert config.image_mean == tuple(mean) and config.image_std == tuple(std)
    assert config.layer_norm_eps == 1e-12


def test_transformers_4_vit_names_map_onto_the_5_names() -> None:
    pairs = [
        (
            "vit.encoder.layer.1.attention.attention.query.weight",
            "vit.layers.1.attention.q_proj.weight",
        ),
        (
            "vit.encoder.layer.1.attention.attention.value.bias",
            "vit.layers.1.attention.v_proj.bias",
        ),
        (
            "vit.encoder.layer.1.attention.output.dense.weight",
            "vit.layers.1.attention.o_proj.weight",
        ),
        ("vit.encoder.layer.1.intermediate.dense.bias", "vit.layers.1.mlp.fc1.bias"),
        ("vit.encoder.layer.1.output.dense.weight", "vit.layers.1.mlp.fc2.weight"),
        (
            "encoder.encoder.layer.0.layernorm_before.weight",
            "encoder.layers.0.layernorm_before.weight",
        ),
        ("model.encoder.layers.0.self_attn.out_proj.weight", None),  # Marian: unchanged
    ]
    for legacy, current in pairs:
        assert current_param_name(legacy) == (current or legacy)


# --- VisionEncoderDecoder (ViT + GPT-2) ---------------------------------------------------------


@torch.no_grad()
def test_captioner_logits_and_greedy_match_hf(captioner) -> None:
    hf_model, directory = captioner
    loaded = load_hf_directory(directory)
    ours = loaded.model
    assert loaded.kind == "captioner"
    assert (ours.config.decoder_start_id, ours.config.eos_id, ours.config.pad_id) == (1, 2, 0)
    pixels = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(7))
    tgt = torch.tensor([[1, 5, 9, 30, 12], [1, 7, 0, 0, 0]])
    tgt_mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0]])
    theirs = hf_model(
        pixel_values=pixels, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
    ).logits
    diff = _max_real_diff(ours(pixels, tgt, tgt_mask), theirs, tgt_mask)
    assert diff <= TOLERANCE, f"max abs logits diff {diff:.3g}"

    generated = hf_model.generate(
        pixel_values=pixels, num_beams=1, do_sample=False, max_new_tokens=10
    )
    _, cross = ours.encode(pixels)
    produced = greedy_generate(
        ours,
        cross,
        torch.ones(2, cross[0][0].shape[2], dtype=torch.long),
        max_new_tokens=10,
        start_id=1,
        eos_id=2,
    )
    assert produced == [_strip(row, 2) for row in generated.tolist()]


def test_captioner_with_other_decoders_is_refused(tmp_path: Path) -> None:
    encoder = _vit_config()
    decoder = transformers.BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        is_decoder=True,
        add_cross_attention=True,
    )
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.save_pretrained(tmp_path)
    with pytest.raises(SourceError, match=r"unsupported decoder 'bert'.*supported: gpt2"):
        load_hf_directory(tmp_path)


def test_captioner_with_tanh_gelu_decoder_is_refused(tmp_path: Path) -> None:
    _save(_captioner({"activation_function": "gelu_new"}), tmp_path)
    with pytest.raises(SourceError, match=r"activation.*'gelu_new'"):
        load_hf_directory(tmp_path)


# --- bad sources ---------------------------------------------------------------------------------


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["BertModel"], "model_type": "bert"})
    )
    message = (
        "unsupported Hugging Face architecture 'BertModel'; supported: MarianMTModel, "
        "ViTForImageClassification, VisionEncoderDecoderModel"
    )
    with pytest.raises(SourceError, match=message):
        load_hf_directory(tmp_path)
    with pytest.raises(SourceError, match="BertModel"):
        load_source(str(tmp_path))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_bad_weights_name_the_file(tmp_path: Path, marian, damage: str) -> None:
    _, directory = marian
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    weights = tmp_path / "model.safetensors"
    if damage == "garbage":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.unlink()
    with pytest.raises(SourceError, match=r"model\.safetensors"):
        load_hf_directory(tmp_path)


# --- end to end through export() ---------------------------------------------------------------


def test_marian_import_exports_with_full_parity(hf_repository: Path, hf_sources) -> None:
    """The session's export of an HF Marian directory (``hf_repository``, which the serving
    tests serve)."""
    manifest = json.loads((hf_repository / "marian" / "1" / "manifest.json").read_text())
    assert manifest["parity"]["greedy_examples"] >= 100
    assert manifest["parity"]["greedy_agreement"] == 1.0
    assert max(manifest["parity"]["real_max_abs_diff"].values()) <= TOLERANCE
    assert all(g["attention_nodes"] > 0 for g in manifest["graphs"].values())
    assert manifest["fused_attention"] is True
    assert manifest["source"]["origin"] == str(hf_sources["marian"])


@pytest.mark.parametrize("kind", ["vit", "captioner"])
def test_vision_imports_export_with_full_parity(kind: str, hf_repository: Path) -> None:
    entry = hf_repository / f"hf-{kind}"
    manifest = json.loads((entry / "1" / "manifest.json").read_text())
    parity = manifest["parity"]
    assert max(parity["real_max_abs_diff"].values()) <= TOLERANCE
    if kind == "vit":
        assert parity["top1_identical"] == parity["top1_examples"] >= 100
        assert (entry / "1" / "labels.txt").read_text().split() == list(VIT_LABELS)
    else:
        assert parity["greedy_agreement"] == 1.0
    assert all(g["attention_nodes"] > 0 for g in manifest["graphs"].values())
