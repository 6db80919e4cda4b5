"""What a Hugging Face entry carries for serving: token rules, image preprocessing, tokenizer;
and what serving could not follow, refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="needs the export extra")

from export.errors import SourceError  # noqa: E402
from export.hf.generation import token_rules  # noqa: E402
from export.hf.text import load_tokenizer, marian_tokenizer  # noqa: E402
from export.hf.vit import image_preprocessing  # noqa: E402
from tests.export.hf_fixtures import save_marian_tokenizer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


def _rules(**fields) -> object:
    return token_rules("MarianMTModel", transformers.GenerationConfig(**fields), 0, 100)


def test_marian_generation_rules() -> None:
    rules = _rules(bad_words_ids=[[99]], forced_eos_token_id=0, num_beams=4, suppress_tokens=[7])
    assert (rules.suppress_ids, rules.forced_eos) == ((7, 99), True)
    assert rules.notes["request_defaults_not_applied"]["num_beams"] == 4
    assert _rules().suppress_ids == () and not _rules().forced_eos


def test_bad_words_of_several_tokens_are_the_models_bad_words() -> None:
    """``bad_words_ids`` entries of several tokens go to ``DecoderSpec.bad_words`` (every
    request bans them); those of one token stay suppressed ids."""
    rules = _rules(bad_words_ids=[[5, 6], [9], [5, 6], [1, 2, 3]])
    assert (rules.suppress_ids, rules.bad_words) == ((9,), ((5, 6), (1, 2, 3)))
    assert rules.notes["bad_words"] == [[5, 6], [1, 2, 3]]


def test_repetition_controls_are_request_defaults() -> None:
    """A generation config's repetition controls are request options (DecodingOptions):
    recorded, not refused; switched off, not recorded."""
    rules = _rules(repetition_penalty=1.2, no_repeat_ngram_size=3)
    defaults = rules.notes["request_defaults_not_applied"]
    assert (defaults["repetition_penalty"], defaults["no_repeat_ngram_size"]) == (1.2, 3)
    assert not {"repetition_penalty", "no_repeat_ngram_size"} & set(
        _rules().notes["request_defaults_not_applied"]
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bad_words_ids": [[5, 600]]}, r"suppressed token ids \[600\]"),
        ({"encoder_repetition_penalty": 1.2}, "encoder_repetition_penalty=1.2"),
        ({"encoder_no_repeat_ngram_size": 3}, "encoder_no_repeat_ngram_size=3"),
        ({"min_length": 4}, "min_length=4"),
        ({"forced_bos_token_id": 5}, "forced_bos_token_id=5"),
        ({"forced_eos_token_id": 5}, "forced_eos_token_id=5 is not eos 0"),
        ({"bad_words_ids": [[0]]}, r"suppressed token ids \[0\]"),
        ({"suppress_tokens": [100]}, r"suppressed token ids \[100\]"),
    ],
)
def test_generation_rules_serving_cannot_apply_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        _rules(**fields)


def _processor(tmp_path: Path, **fields) -> Path:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(fields))
    return tmp_path


def test_image_processor_steps(tmp_path: Path) -> None:
    assert image_preprocessing(tmp_path, 32).resample == "bilinear"  # none: ViT's defaults
    vit = _processor(
        tmp_path, image_processor_type="ViTImageProcessor", size={"height": 32, "width": 32},
        resample=3, image_mean=[0.1, 0.2, 0.3], image_std=0.5,
    )  # fmt: skip
    steps = image_preprocessing(vit, 32)
    assert (steps.mean, steps.std, steps.resample) == ((0.1, 0.2, 0.3), (0.5,) * 3, "bicubic")
    legacy = _processor(tmp_path, feature_extractor_type="ViTFeatureExtractor", size=32)
    assert image_preprocessing(legacy, 32).resample == "bilinear"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image_processor_type": "ConvNextImageProcessor"}, "ConvNextImageProcessor"),
        ({"do_center_crop": True}, "centre crop"),
        ({"do_resize": False}, "no resize"),
        ({"size": {"shortest_edge": 32}}, "size"),
        ({"size": {"height": 64, "width": 64}}, "the model takes 32 px"),
        ({"rescale_factor": 0.5}, "rescale factor 0.5"),
        ({"resample": 9}, "resample 9"),
    ],
)
def test_image_processors_serving_cannot_follow_are_refused(
    tmp_path: Path, fields: dict, message: str
) -> None:
    with pytest.raises(SourceError, match=message):
        image_preprocessing(_processor(tmp_path, **fields), 32)


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    directory = tmp_path_factory.mktemp("marian_tokenizer")
    return directory, save_marian_tokenizer(directory)


def test_marian_tokenizer_languages_and_ids(marian_files: tuple[Path, dict]) -> None:
    directory, vocab = marian_files
    tokenizer = load_tokenizer(transformers, "MarianMTModel", directory)
    text = marian_tokenizer(tokenizer, directory, {"pad": vocab["<pad>"], "eos": 0})
    assert text.languages == ("de",) and text.spec.language_tag == ""
    assert text.spec.special_tokens == ("</s>", "<unk>", "<pad>")
    with pytest.raises(SourceError, match=r"pad token '<pad>' at id \d+, the model's pad id is 3"):
        marian_tokenizer(tokenizer, directory, {"pad": 3})


def test_multilingual_marian_is_tagged_with_its_codes(tmp_path: Path, marian_files) -> None:
    directory, vocab = marian_files
    for name in ("source.spm", "target.spm"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    codes = {">>fr<<": len(vocab), ">>es<<": len(vocab) + 1}
    (tmp_path / "vocab.json").write_text(json.dumps({**vocab, **codes}))
    tokenizer = transformers.MarianTokenizer(
        *(str(tmp_path / n) for n in ("source.spm", "target.spm", "vocab.json"))
    )
    text = marian_tokenizer(tokenizer, tmp_path, {})
    assert text.languages == ("fr", "es") and text.spec.language_tag == ">>{}<<"


def test_a_text_model_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"has no tokenizer .*save_pretrained\(DIR\)"):
        load_tokenizer(transformers, "MarianMTModel", tmp_path)


def test_marian_with_a_non_marian_tokenizer_is_refused(tmp_path: Path) -> None:
    from tests.export.hf_fixtures import save_word_tokenizer

    save_word_tokenizer(tmp_path, 10, {"<pad>": 0, "</s>": 1})
    tokenizer = load_tokenizer(transformers, "MarianMTModel", tmp_path)
    with pytest.raises(SourceError, match="needs a MarianTokenizer"):
        marian_tokenizer(tokenizer, tmp_path, {})
