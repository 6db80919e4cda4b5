"""``batching.batch_buckets``: a classifier's batches padded up to a few sizes, each run once at
load (on a GPU provider a new input shape costs a convolution-algorithm search the first time).

Asserted: the buckets (powers of two, then the maximum) never more than double a batch; "auto"
pads on a GPU provider or TensorRT and not on the CPU; with the tiny ViT on the CPU and buckets
on, loading runs every bucket once per session, a batch of 3 runs as 4 and its probabilities are
those of the unpadded batch; with buckets off the batch runs as it comes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.model_config import ClassifierConfig, DynamicBatching, ImageSpec, OnnxRuntimeOptions
from contract.schema import SchemaError, from_mapping
from serving.repository import ModelRepository
from serving.served.classifier import ServedClassifier, batch_buckets, pads_batches
from tests.reliability.harness import copy_repository


@given(st.integers(1, 4096))
def test_buckets_are_powers_of_two_then_the_maximum_and_never_double_a_batch(top: int) -> None:
    buckets = batch_buckets(top)
    assert buckets[0] == 1 and buckets[-1] == top
    assert list(buckets) == sorted(set(buckets))
    assert all(b & (b - 1) == 0 for b in buckets[:-1])
    for rows in range(1, min(top, 300) + 1):
        assert next(b for b in buckets if b >= rows) < 2 * rows


def config(setting: str = "auto", providers: tuple[str, ...] = ("CPUExecutionProvider",), **more):
    return ClassifierConfig(
        name="vit",
        image=ImageSpec(32),
        batching=DynamicBatching(batch_buckets=setting),  # type: ignore[arg-type]
        onnxruntime=OnnxRuntimeOptions(execution_providers=providers),
        **more,
    )


def test_auto_pads_on_a_gpu_provider_only() -> None:
    gpu = ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert not pads_batches(config())
    assert pads_batches(config(providers=gpu))
    assert pads_batches(config(backend="tensorrt"))
    assert pads_batches(config("on")) and not pads_batches(config("off", providers=gpu))
    with pytest.raises(SchemaError, match="batch_buckets"):
        from_mapping(DynamicBatching, {"batch_buckets": "sometimes"})


def recorded(model: ServedClassifier) -> list[int]:
    """The batch sizes ``model``'s graph runs from now on."""
    sizes: list[int] = []
    (backend,) = {id(b): b for b in model._instances}.values()
    run = backend.run

    def recording(graph: str, feeds: dict[str, np.ndarray]) -> Any:
        sizes.append(len(next(iter(feeds.values()))))
        return run(graph, feeds)

    backend.run = recording  # type: ignore[method-assign]
    return sizes


def load(repository: Path) -> ServedClassifier:
    model = ModelRepository.load(repository, names=("vit",)).get("vit")
    assert isinstance(model, ServedClassifier)
    return model


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_tiny_vit_runs_padded_batches_with_the_same_probabilities(
    tiny_repository: Path, tmp_path: Path, setting: str
) -> None:
    repository = copy_repository(
        tiny_repository, tmp_path / "repository", vit={"batching": {"batch_buckets": setting}}
    )
    model, plain = load(repository), load(tiny_repository)  # plain: the CPU default, no padding
    sizes = recorded(model)
    size = model.config.image.size
    shape = (3, 3, size, size)
    images = list(np.random.default_rng(0).uniform(-1, 1, shape).astype(model.float_dtype))

    async def main() -> list[np.ndarray]:
        await model.start()  # the warm-up, with buckets on
        try:
            return model._classify_batch(images)
        finally:
            await model.stop()

    probabilities = asyncio.run(main())
    top = model.config.batching.max_batch_size
    if setting == "on":
        assert model.buckets == batch_buckets(top)
        assert sizes == [*batch_buckets(top), 4]  # each bucket once at load, then 3 -> 4
    else:
        assert model.buckets == () and sizes == [3]
    expected = plain._classify_batch(images)
    assert len(probabilities) == 3
    for got, want in zip(probabilities, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_batch_of_the_maximum_runs_as_it_comes(tiny_repository: Path, tmp_path: Path) -> None:
    repository = copy_repository(
        tiny_repository, tmp_path / "repository", vit={"batching": {"batch_buckets": "on"}}
    )
    model = load(repository)
    top = model.config.batching.max_batch_size
    sizes = recorded(model)
    size = model.config.image.size
    image = np.zeros((3, size, size), model.float_dtype)
    assert len(model._classify_batch([image] * top)) == top
    assert sizes == [top]
