"""config.yaml: sections per model kind, errors that name the field, older files still load."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.model_config import (
    ClassifierConfig,
    DecoderSpec,
    GeneratorConfig,
    ImageSpec,
    InFlightBatching,
    model_config_from_mapping,
)
from contract.repository import read_model_config, write_model_config
from contract.schema import SchemaError, to_mapping

GENERATOR_ONLY = {"decoder", "languages", "max_new_tokens", "max_source_length", "in_flight"}
GENERATOR_ONLY |= {"max_texts_per_request", "max_active_sequences", "token_budget"}
GENERATOR_ONLY |= {"stream_interval_ms", "join_interval_steps", "overlap_steps"}
CLASSIFIER_ONLY = {"labels", "max_queue_delay_us", "batch_buckets"}

CLASSIFIER = ClassifierConfig(name="vit", image=ImageSpec(32), labels=("0", "1"))
TRANSLATOR = GeneratorConfig(
    name="translator",
    task="translation",
    input="text",
    decoder=DecoderSpec(num_layers=2, num_heads=4, head_dim=8, vocab_size=100),
    languages=("de", "fr"),
)
CAPTIONER = GeneratorConfig(
    name="captioner",
    task="captioning",
    input="image",
    decoder=DecoderSpec(num_layers=1, num_heads=2, head_dim=8, vocab_size=50),
    image=ImageSpec(48),
    batching=InFlightBatching(in_flight=False, max_batch_size=4),
)

# What attnserve wrote before config.yaml had per-kind sections (every field for every kind).
LEGACY_CLASSIFIER = """
name: vit
kind: classifier
task: classification
input: image
backend: onnxruntime
precision: fp32
limits: {max_batch_size: 32, max_source_length: 1, max_new_tokens: 1,
         max_texts_per_request: 32, max_image_bytes: 4194304}
batching: {max_batch_size: 32, max_queue_delay_us: 0, max_queue_size: 256, timeout_ms: 30000,
           in_flight: false, max_active_sequences: 64, token_budget: 4096}
decoder: null
image: {size: 32, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}
languages: []
labels: ['0', '1']
onnxruntime: {intra_op_threads: 0, execution_providers: [CPUExecutionProvider]}
"""
LEGACY_TRANSLATOR = """
name: translator
kind: seq2seq
task: translation
input: text
limits: {max_batch_size: 32, max_source_length: 64, max_new_tokens: 64,
         max_texts_per_request: 32, max_image_bytes: 4194304}
batching: {max_batch_size: 32, max_queue_delay_us: 0, max_queue_size: 256, timeout_ms: 30000,
           in_flight: true, max_active_sequences: 64, token_budget: 4096}
decoder: {num_layers: 2, num_heads: 4, head_dim: 8, vocab_size: 100}
image: null
languages: [de, fr]
labels: []
"""


def keys(tree: Any) -> set[str]:
    """Every mapping key anywhere in a YAML tree."""
    if isinstance(tree, dict):
        return set(tree) | {k for value in tree.values() for k in keys(value)}
    if isinstance(tree, list):
        return {k for value in tree for k in keys(value)}
    return set()


@pytest.mark.parametrize("config", [CLASSIFIER, TRANSLATOR, CAPTIONER], ids=lambda c: c.name)
def test_round_trip_through_config_yaml(tmp_path: Path, config: Any) -> None:
    write_model_config(config, tmp_path)
    assert read_model_config(tmp_path) == config


def test_each_kind_writes_only_its_own_sections(tmp_path: Path) -> None:
    write_model_config(CLASSIFIER, tmp_path)
    classifier = keys(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert not classifier & GENERATOR_ONLY
    assert classifier >= CLASSIFIER_ONLY
    write_model_config(TRANSLATOR, tmp_path)
    generator = keys(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert not generator & CLASSIFIER_ONLY
    assert generator >= GENERATOR_ONLY


@pytest.mark.parametrize(
    ("legacy", "expected"),
    [(LEGACY_CLASSIFIER, CLASSIFIER), (LEGACY_TRANSLATOR, TRANSLATOR)],
    ids=["classifier", "translator"],
)
def test_configs_written_before_per_kind_sections_still_load(legacy: str, expected: Any) -> None:
    assert model_config_from_mapping(yaml.safe_load(legacy)) == expected


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"kind": "regressor"}, r"kind: must be one of 'classifier', 'seq2seq', got 'regressor'"),
        ({"kind": None}, "kind: must be one of"),
        ({"decoder": {"num_layers": 1}}, r"unknown field\(s\) decoder"),
        ({"limits": {"max_image_bytes": 0}}, "max_image_bytes must be >= 1"),
        ({"languages": ["de"]}, r"unknown field\(s\) languages"),
        ({"batching": {"max_queue_size": -1}}, "max_queue_size must be >= 0"),
        ({"batching": {"max_batch_sise": 4}}, r"batching: unknown field\(s\) max_batch_sise"),
        ({"image": {"size": "big"}}, "image.size: must be an integer"),
        ({"image": None}, r"image: missing required field\(s\) size"),
        ({"task": "translation"}, "task: must be one of 'classification'"),
    ],
)
def test_a_bad_classifier_field_is_named(edit: dict[str, Any], message: str) -> None:
    data = {**to_mapping(CLASSIFIER), **edit}
    with pytest.raises(SchemaError, match=message):
        model_config_from_mapping(data)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"decoder": None}, r"decoder: missing required field\(s\) num_layers"),
        ({"labels": ["a"]}, r"unknown field\(s\) labels"),
        ({"input": "image"}, "needs an `image` section"),
        ({"batching": {"in_flight": "yes"}}, "batching.in_flight: must be true or false"),
        ({"decoder": {"num_layers": 2}}, r"decoder: missing required field\(s\) num_heads"),
    ],
)
def test_a_bad_generator_field_is_named(edit: dict[str, Any], message: str) -> None:
    data = {**to_mapping(TRANSLATOR), **edit}
    with pytest.raises(SchemaError, match=message):
        model_config_from_mapping(data)


def test_read_model_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("name: x\nkind: seq2seq\n")
    with pytest.raises(SchemaError, match=r"config.yaml: GeneratorConfig: missing required"):
        read_model_config(tmp_path)


def _paths(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix]
    return [p for key, value in tree.items() for p in _paths(value, f"{prefix}{key}.")]


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from([CLASSIFIER, TRANSLATOR, CAPTIONER]),
    data=st.data(),
)
def test_any_mutated_config_loads_or_names_the_field(base: Any, data: st.DataObject) -> None:
    """Replace one field anywhere with junk: either it still loads (the junk was valid) or a
    SchemaError names a field path; never another exception."""
    tree = to_mapping(base)
    path = data.draw(st.sampled_from(_paths(tree))).rstrip(".").split(".")
    value = data.draw(JUNK)
    node = tree
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    try:
        loaded = model_config_from_mapping(tree)
    except SchemaError as err:
        assert str(err) and any(key in str(err) for key in (*path, "kind", "must", "needs"))
    else:
        assert dataclasses.is_dataclass(loaded) and loaded.kind == base.kind


@pytest.mark.parametrize("config", [CLASSIFIER, TRANSLATOR], ids=lambda c: c.name)
def test_cuda_graph_option_of_earlier_exports_still_loads(config: Any) -> None:
    data = to_mapping(config)
    assert data["onnxruntime"]["cuda_graph"] is True  # the default since 2026-11-26
    del data["onnxruntime"]["cuda_graph"]  # exports from before the option: the default
    assert model_config_from_mapping(data) == config
    data["onnxruntime"]["cuda_graph"] = False  # what exports wrote until 2026-11-26: kept
    assert model_config_from_mapping(data).onnxruntime.cuda_graph is False
    data["onnxruntime"]["cuda_graph"] = "yes"
    with pytest.raises(SchemaError, match=r"onnxruntime\.cuda_graph"):
        model_config_from_mapping(data)


@pytest.mark.parametrize("config", [CLASSIFIER, TRANSLATOR], ids=lambda c: c.name)
def test_the_convolution_search_defaults_to_exhaustive_and_takes_only_its_three_values(
    config: Any,
) -> None:
    data = to_mapping(config)
    del data["onnxruntime"]["cudnn_conv_algo_search"]  # what earlier exports wrote: nothing
    assert model_config_from_mapping(data).onnxruntime.cudnn_conv_algo_search == "exhaustive"
    data["onnxruntime"]["cudnn_conv_algo_search"] = "heuristic"
    assert model_config_from_mapping(data).onnxruntime.cudnn_conv_algo_search == "heuristic"
    data["onnxruntime"]["cudnn_conv_algo_search"] = "fastest"
    with pytest.raises(SchemaError, match=r"onnxruntime\.cudnn_conv_algo_search"):
        model_config_from_mapping(data)
