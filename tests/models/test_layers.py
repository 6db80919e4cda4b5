"""KV-cache decoding equals full recomputation; the decoder is causal; preset shapes."""

from __future__ import annotations

import pytest
import torch

from models import captioner, translator, vit
from models.attention import causal_self_mask
from models.generation import greedy_generate, sample_next
from models.layers import sinusoidal_table


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Each test's random models and inputs the same whatever ran before it."""
    torch.manual_seed(0)


def _translator(**overrides) -> translator.Translator:
    return translator.Translator(translator.preset("tiny", **overrides)).eval()


def _captioner() -> captioner.Captioner:
    return captioner.Captioner(captioner.preset("tiny")).eval()


def _source(batch: int = 3, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(4, 128, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, 6:] = 0  # a padded row: ragged sources share the batch
    return ids.masked_fill(mask == 0, 0), mask


def _incremental_vs_full(model, cross, cross_mask, tokens: torch.Tensor) -> float:
    """Max |logits| difference between step-by-step decoding with the cache and one full pass,
    relative to the full pass's largest |logit| (fp32 sums in another order: ~1e-7 of it)."""
    batch, length = tokens.shape
    empty = model.decoder.empty_past(batch, cross[0][0])
    full_mask = torch.ones(batch, length, dtype=torch.long)
    positions = torch.arange(length).expand(batch, -1)
    full, _ = model.decode_step(tokens, positions, empty, full_mask, cross, cross_mask)
    past, worst = empty, 0.0
    for step in range(length):
        logits, past = model.decode_step(
            tokens[:, step : step + 1],
            positions[:, step : step + 1],
            past,
            full_mask[:, : step + 1],
            cross,
            cross_mask,
        )
        worst = max(worst, (logits[:, 0] - full[:, step]).abs().max().item())
    return worst / full.abs().max().item()


@pytest.mark.parametrize("norm_first", [True, False])
def test_translator_kv_cache_matches_full_recompute(norm_first: bool) -> None:
    model = _translator(norm_first=norm_first)
    src, mask = _source()
    with torch.no_grad():
        _, cross = model.encode(src, mask)
        tokens = torch.randint(4, 128, (3, 12))
        assert _incremental_vs_full(model, cross, mask, tokens) < 1e-6


def test_captioner_kv_cache_matches_full_recompute() -> None:
    model = _captioner()
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        memory, cross = model.encode(pixels)
        mask = torch.ones(memory.shape[:2], dtype=torch.long)
        tokens = torch.randint(4, 64, (2, 10))
        assert _incremental_vs_full(model, cross, mask, tokens) < 1e-6


def test_greedy_with_cache_equals_greedy_without() -> None:
    model = _translator()
    src, mask = _source()
    with torch.no_grad():
        _, cross = model.encode(src, mask)
        kwargs = dict(max_new_tokens=15, start_id=1, eos_id=2)
        assert greedy_generate(model, cross, mask, **kwargs) == greedy_generate(
            model, cross, mask, use_cache=False, **kwargs
        )


def test_future_tokens_never_change_earlier_logits() -> None:
    model = _translator()
    src, mask = _source()
    tokens = torch.randint(4, 128, (3, 10))
    changed = tokens.clone()
    changed[:, 6:] = torch.randint(4, 128, (3, 4))
    with torch.no_grad():
        _, cross = model.encode(src, mask)
        empty = model.decoder.empty_past(3, cross[0][0])
        key_mask = torch.ones(3, 10, dtype=torch.long)
        positions = torch.arange(10).expand(3, -1)
        a, _ = model.decode_step(tokens, positions, empty, key_mask, cross, mask)
        b, _ = model.decode_step(changed, positions, empty, key_mask, cross, mask)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_padding_in_the_source_is_ignored() -> None:
    model = _translator()
    src, mask = _source(batch=1)
    longer = torch.cat([src, torch.randint(4, 128, (1, 5))], dim=1)  # junk after the real tokens
    longer_mask = torch.cat([mask, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    with torch.no_grad():
        _, cross_a = model.encode(src, mask)
        _, cross_b = model.encode(longer, longer_mask)
        kwargs = dict(max_new_tokens=10, start_id=1, eos_id=2)
        assert greedy_generate(model, cross_a, mask, **kwargs) == greedy_generate(
            model, cross_b, longer_mask, **kwargs
        )


def test_ragged_past_with_holes_matches_unpadded_row() -> None:
    """A row whose cache has padding holes (in-flight batching) decodes like the row alone."""
    model = _translator()
    src, mask = _source(batch=1)
    tokens = torch.randint(4, 128, (1, 4))
    with torch.no_grad():
        _, cross = model.encode(src, mask)
        empty = model.decoder.empty_past(1, cross[0][0])
        ones = torch.ones(1, 4, dtype=torch.long)
        alone, _ = model.decode_step(tokens, torch.arange(4)[None], empty, ones, cross, mask)
        # Same tokens, but two padding slots in the middle of the cache.
        _, past = model.decode_step(
            tokens[:, :2], torch.arange(2)[None], empty, ones[:, :2], cross, mask
        )
        pad_ids = torch.zeros(1, 2, dtype=torch.long)
        _, past = model.decode_step(
            pad_ids,
            torch.zeros(1, 2, dtype=torch.long),
            past,
            torch.tensor([[1, 1, 0, 0]]),
            cross,
            mask,
        )
        holey, _ = model.decode_step(
            tokens[:, 2:],
            torch.tensor([[2, 3]]),
            past,
            torch.tensor([[1, 1, 0, 0, 1, 1]]),
            cross,
            mask,
        )
    assert torch.allclose(alone[:, 2:], holey, atol=1e-5)


def _inplace_vs_full(model, cross, cross_mask, tokens: torch.Tensor, capacity: int) -> float:
    """Max |logits| difference between in-place steps (rows starting at different steps, as in
    flight) and one full pass per row, relative to the full pass's largest |logit|."""
    batch, length = tokens.shape
    config = model.config
    caches = [
        (torch.zeros(batch, config.num_heads, capacity, config.head_dim),) * 2
        for _ in range(config.decoder_layers)
    ]
    start = torch.arange(batch)  # row b joins at step b: the rows' caches have ragged lengths
    cross_lengths = cross_mask.sum(1)
    empty = model.decoder.empty_past(batch, cross[0][0])
    positions = torch.arange(length).expand(batch, -1)
    full, _ = model.decode_step(
        tokens, positions, empty, torch.ones(batch, length, dtype=torch.long), cross, cross_mask
    )
    worst = 0.0
    for step in range(length + batch):
        fed = (step - start).clamp(0, length - 1)  # each row's position; idle rows repeat
        logits, written = model.decode_step_inplace(
            tokens.gather(1, fed[:, None]), fed, caches, cross, cross_lengths
        )
        live = (step >= start) & (step - start < length)
        caches = [  # rows that did not really take a step keep their cache
            tuple(torch.where(live[:, None, None, None], n, o) for n, o in zip(w, c, strict=True))
            for w, c in zip(written, caches, strict=True)
        ]
        for row in live.nonzero().flatten().tolist():
            diff = (logits[row, 0] - full[row, fed[row]]).abs().max().item()
            worst = max(worst, diff)
    return worst / full.abs().max().item()


@pytest.mark.parametrize("norm_first", [True, False])
def test_inplace_cache_matches_full_recompute_on_ragged_rows(norm_first: bool) -> None:
    model = _translator(norm_first=norm_first)
    src, mask = _source()
    with torch.no_grad():
        _, cross = model.encode(src, mask)
        tokens = torch.randint(4, 128, (3, 10))
        assert _inplace_vs_full(model, cross, mask, tokens, capacity=16) < 1e-6


def test_captioner_inplace_cache_matches_full_recompute() -> None:
    model = _captioner()
    with torch.no_grad():
        size = model.config.image_size
        _, cross = model.encode(torch.randn(2, 3, size, size))
        mask = torch.ones(2, cross[0][0].shape[2], dtype=torch.long)
        assert _inplace_vs_full(model, cross, mask, torch.randint(4, 60, (2, 7)), 8) < 1e-6


def test_causal_mask_shape_and_content() -> None:
    mask = causal_self_mask(torch.tensor([[1, 0, 1, 1, 1]]), 2)  # 3 past (one hole) + 2 new
    assert mask.shape == (1, 1, 2, 5)
    assert mask[0, 0].tolist() == [
        [True, False, True, True, False],
        [True, False, True, True, True],
    ]


def test_sinusoidal_table_layout() -> None:
    table = sinusoidal_table(4, 8)
    assert torch.allclose(table[0, :4], torch.zeros(4)) and torch.allclose(
        table[0, 4:], torch.ones(4)
    )
    assert torch.isclose(table[1, 0], torch.sin(torch.tensor(1.0)))


@pytest.mark.parametrize("name", list(translator.PRESETS))
def test_translator_preset_shapes(name: str) -> None:
    config = translator.preset(name)
    model = translator.Translator(config).eval()
    src = torch.randint(4, config.vocab_size, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    with torch.no_grad():
        memory, cross = model.encode(src, mask)
        empty = model.decoder.empty_past(2, memory)
        logits, presents = model.decode_step(
            torch.ones(2, 3, dtype=torch.long),
            torch.arange(3).expand(2, -1),
            empty,
            torch.ones(2, 3, dtype=torch.long),
            cross,
            mask,
        )
    assert memory.shape == (2, 5, config.d_model)
    assert len(cross) == len(presents) == config.decoder_layers
    assert cross[0][0].shape == (2, config.num_heads, 5, config.head_dim)
    assert presents[-1][1].shape == (2, config.num_heads, 3, config.head_dim)
    assert logits.shape == (2, 3, config.vocab_size)


@pytest.mark.parametrize("name", list(vit.PRESETS))
def test_vit_preset_shapes(name: str) -> None:
    config = vit.preset(name)
    model = vit.ViT(config).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, config.num_channels, config.image_size, config.image_size))
    assert logits.shape == (2, config.num_classes)


@pytest.mark.parametrize("name", list(captioner.PRESETS))
def test_captioner_preset_shapes(name: str) -> None:
    config = captioner.preset(name)
    model = captioner.Captioner(config).eval()
    with torch.no_grad():
        memory, cross = model.encode(torch.randn(1, 3, config.image_size, config.image_size))
    assert memory.shape == (1, config.num_patches + 1, config.d_model)
    assert cross[0][0].shape == (1, config.num_heads, config.num_patches + 1, config.head_dim)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: base, small, tiny"):
        translator.preset("huge")


def test_sampling_options() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, -2.0]])
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature=0).item() == 1
    draws = {sample_next(logits, top_k=2, generator=generator).item() for _ in range(50)}
    assert draws <= {1, 2}
    assert {sample_next(logits, top_p=0.5, generator=generator).item() for _ in range(20)} == {1}
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, top_p=0)


def test_patch_embedding_is_the_strided_convolution() -> None:
    """The patch embedding's reshape and matmul compute a stride-p convolution, patches in
    row-major order, and a checkpoint's convolution weight (D, C, p, p) loads into it."""
    conv = torch.nn.Conv2d(3, 16, kernel_size=8, stride=8)
    embedding = vit.PatchEmbedding(3, 8, 16)
    embedding.load_state_dict(_as_projection(conv))  # (16, 3, 8, 8) -> (16, 192)
    images = torch.randn(5, 3, 24, 40)  # 3 x 5 patches: rows and columns told apart
    expected = conv(images).flatten(2).transpose(1, 2)
    got = embedding(images)
    assert got.shape == (5, 15, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="size mismatch"):  # a wrong conv still fails to load
        embedding.load_state_dict(_as_projection(torch.nn.Conv2d(3, 16, 4, stride=4)))


def _as_projection(conv: torch.nn.Conv2d) -> dict[str, torch.Tensor]:
    return {f"projection.{name}": value for name, value in conv.state_dict().items()}
