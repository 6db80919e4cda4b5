"""Fuzzing attnserve.v1: Translate / TranslateStream with any texts, languages, models and
options; Caption / CaptionStream / Classify with valid, crafted, truncated, corrupt and huge
images; Score with any texts, images, targets and models."""

from __future__ import annotations

import math
import zlib
from typing import Any

import grpc
from hypothesis import example, given
from hypothesis import strategies as st

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from tests.reliability.fuzz.checker import Fuzz, budget
from tests.reliability.fuzz.strategies import (
    IMAGE_POOL,
    decoding_options,
    images,
    int32s,
    jpeg_claiming,
    languages,
    model_names,
    png_claiming,
    small_ints,
    texts,
    versions,
)

# how an answered generation may end (a stop string: STOP_SEQUENCE)
ENDED = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP_SEQUENCE)


# --- attnserve.v1 translation with any texts, languages, models and options -----------------------
def check_translation(request: Any, response: Any, unary: bool) -> None:
    """A successful answer is well formed: one translation per text, tokens within the limit
    (a target prefix's tokens count toward the model's, not toward max_new_tokens)."""
    prefixed = any(getattr(request, "target_prefixes", ())) or getattr(request, "target_prefix", "")
    asked = request.options.max_new_tokens
    limit = asked if asked > 0 and not prefixed else 32
    if unary:
        assert len(response.translations) == len(request.texts)
        for translation in response.translations:
            assert len(translation.token_ids) <= limit
            assert translation.finish_reason in ENDED
    else:
        assert response and response[-1].finish_reason in ENDED
        seen = 0  # a message may carry several tokens; its index is that of its first
        for message in response:
            if message.token_ids:
                assert message.index == seen
                seen += len(message.token_ids)
        assert seen <= limit


def test_fuzz_translate(fuzz: Fuzz) -> None:
    @budget("translate")
    @given(
        stream=st.booleans(),
        many=st.one_of(
            st.lists(texts, max_size=4), st.lists(st.just("five"), min_size=33, max_size=40)
        ),
        language=languages,
        model=st.one_of(st.just(""), st.just("translator"), model_names),
        version=st.one_of(st.just(""), versions),
        options=decoding_options(),
    )
    @example(False, ["x" * 4_000_000], "de", "", "", pb.DecodingOptions())  # 4 MB of text
    @example(True, ["five " * 800_000], "de", "", "", pb.DecodingOptions())
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(beam_size=10**9))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(max_new_tokens=10**9))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=math.nan))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=-1))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(temperature=math.inf))
    @example(False, ["five"], "de", "", "", pb.DecodingOptions(top_p=2))
    @example(True, ["five"], "de", "", "", pb.DecodingOptions(top_k=2**31 - 1, temperature=1))
    @example(True, ["five"], "de", "", "", pb.DecodingOptions(seed=2**64 - 1, temperature=99))
    @example(False, ["five"] * 4, "de", "", "", pb.DecodingOptions(beam_size=8, num_alternatives=7))
    def run(
        stream: bool,
        many: list[str],
        language: str,
        model: str,
        version: str,
        options: pb.DecodingOptions,
    ) -> None:
        # texts as target prefixes of other texts: in half the calls, one per text (some
        # tokenize to special tokens, some are too long)
        prefixes = many[1:] + many[:1] if len(many) % 2 == 0 else []
        if stream:
            request = pb.TranslateStreamRequest(
                text=many[0] if many else "",
                target_language=language,
                model=model,
                model_version=version,
                options=options,
                target_prefix=prefixes[0] if prefixes else "",
            )
            code, details, result = fuzz.call(
                lambda t: list(fuzz.stub.TranslateStream(request, timeout=t))
            )
        else:
            request = pb.TranslateRequest(
                texts=many,
                target_language=language,
                model=model,
                model_version=version,
                options=options,
                target_prefixes=prefixes,
            )
            code, details, result = fuzz.call(lambda t: fuzz.stub.Translate(request, timeout=t))
        fuzz.check("translate", code, details, what=request)
        if code == grpc.StatusCode.OK:
            check_translation(request, result, unary=not stream)

    run()
    fuzz.assert_still_correct()


# --- images: Caption, CaptionStream, Classify -----------------------------------------------------
def test_fuzz_images(fuzz: Fuzz) -> None:
    @budget("images")
    @given(
        method=st.sampled_from(["Caption", "CaptionStream", "Classify"]),
        image=images(),
        model=st.one_of(st.just(""), st.just(""), model_names),
        version=st.one_of(st.just(""), versions),
        options=decoding_options(),
        top_k=st.one_of(small_ints, int32s),
    )
    @example("Classify", b"\x89PNG" + b"\x00" * (4 * 1024 * 1024), "", "", pb.DecodingOptions(), 0)
    @example(
        "Caption",
        png_claiming(4096, 4096, zlib.compress(b"\x00" * (1 + 3 * 4096) * 4096)),  # 48 MB of pixels
        "",
        "",
        pb.DecodingOptions(max_new_tokens=2),
        0,
    )
    @example("CaptionStream", png_claiming(100_000, 100_000), "", "", pb.DecodingOptions(), 0)
    @example("Classify", jpeg_claiming(65535, 65535), "", "", pb.DecodingOptions(), 0)
    @example("Classify", IMAGE_POOL[0], "", "", pb.DecodingOptions(), -1)
    @example("Classify", IMAGE_POOL[0], "", "", pb.DecodingOptions(), 2**31 - 1)
    def run(
        method: str,
        image: bytes,
        model: str,
        version: str,
        options: pb.DecodingOptions,
        top_k: int,
    ) -> None:
        if method == "Classify":
            request: Any = pb.ClassifyRequest(
                image=image, model=model, model_version=version, top_k=top_k
            )
            code, details, result = fuzz.call(lambda t: fuzz.stub.Classify(request, timeout=t))
        else:
            request = pb.CaptionRequest(
                image=image, model=model, model_version=version, options=options
            )
            rpc = getattr(fuzz.stub, method)
            streaming = method == "CaptionStream"
            code, details, result = fuzz.call(
                lambda t: list(rpc(request, timeout=t)) if streaming else rpc(request, timeout=t)
            )
        fuzz.check("images", code, details, what=(method, model, version, image[:40], options))
        if code == grpc.StatusCode.OK and method == "Classify":
            scores = [label.score for label in result.labels]
            assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
            assert len(scores) == min(top_k or 5, 10)

    run()
    fuzz.assert_still_correct()


# --- Score: any sources, targets and models -------------------------------------------------------
def test_fuzz_score(fuzz: Fuzz) -> None:
    @budget("score")
    @given(
        sources=st.lists(texts, max_size=4),
        pictures=st.lists(images(), max_size=2),
        targets=st.one_of(
            st.lists(texts, max_size=4), st.lists(st.just("fünf"), min_size=33, max_size=40)
        ),
        language=languages,
        model=st.one_of(
            st.just(""), st.sampled_from(["translator", "captioner", "vit"]), model_names
        ),
        version=st.one_of(st.just(""), versions),
    )
    @example(["five"], [], ["x" * 4_000_000], "de", "", "")  # 4 MB of target
    @example(["five"], [], ["fünf " * 200], "de", "", "")  # too many target tokens
    @example(["five", "six"], [], ["fünf", ""], "de", "", "")  # an empty target: EOS alone
    @example([], [IMAGE_POOL[0]], ["a circle"], "", "", "")
    @example(["five"], [IMAGE_POOL[0]], ["fünf"], "de", "", "")  # both kinds of source
    def run(
        sources: list[str],
        pictures: list[bytes],
        targets: list[str],
        language: str,
        model: str,
        version: str,
    ) -> None:
        request = pb.ScoreRequest(
            texts=sources,
            images=pictures,
            targets=targets,
            target_language=language,
            model=model,
            model_version=version,
        )
        code, details, result = fuzz.call(lambda t: fuzz.stub.Score(request, timeout=t))
        what = (model, version, language, sources[:2], [p[:20] for p in pictures], targets[:2])
        fuzz.check("score", code, details, what=what)
        if code == grpc.StatusCode.OK:
            assert len(result.scores) == len(targets)
            for scored in result.scores:
                values = [*scored.token_log_probs, scored.eos_log_prob]
                assert len(scored.token_log_probs) == len(scored.token_ids)
                assert all(math.isfinite(v) and v <= 0 for v in values)
                assert math.isclose(scored.score, sum(values), rel_tol=1e-4, abs_tol=1e-3)

    run()
    fuzz.assert_still_correct()
