"""attnserve.v1 messages survive a serialize / parse round trip with their values and the
presence of optional fields (an explicit 0 stays distinguishable from unset)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.proto_gen.attnserve.v1 import attnserve_pb2

int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
float32s = st.floats(width=32, allow_nan=False)
OPTIONAL_FIELDS = ("length_penalty", "temperature", "top_p", "seed")


@st.composite
def decoding_options(draw: st.DrawFn) -> attnserve_pb2.DecodingOptions:
    """DecodingOptions with arbitrary values, each optional field set (0 included) or unset."""
    options = attnserve_pb2.DecodingOptions(
        max_new_tokens=draw(int32s),
        min_new_tokens=draw(int32s),
        beam_size=draw(int32s),
        top_k=draw(int32s),
        num_alternatives=draw(int32s),
    )
    for name in ("length_penalty", "temperature", "top_p"):
        value = draw(st.none() | st.just(0.0) | float32s)
        if value is not None:
            setattr(options, name, value)
    seed = draw(st.none() | st.just(0) | st.integers(min_value=0, max_value=2**64 - 1))
    if seed is not None:
        options.seed = seed
    return options


@st.composite
def translate_requests(draw: st.DrawFn) -> attnserve_pb2.TranslateRequest:
    """TranslateRequests with arbitrary texts and options (present or absent)."""
    request = attnserve_pb2.TranslateRequest(
        texts=draw(st.lists(st.text(max_size=40), max_size=6)),
        target_language=draw(st.sampled_from(["de", "fr", "es", ""]) | st.text(max_size=4)),
        model=draw(st.sampled_from(["", "translator"]) | st.text(max_size=12)),
        model_version=draw(st.sampled_from(["", "1"]) | st.text(max_size=4)),
    )
    options = draw(st.none() | decoding_options())
    if options is not None:
        request.options.CopyFrom(options)
    return request


@settings(max_examples=200, deadline=None)
@given(decoding_options())
def test_decoding_options_round_trip_keeps_values_and_presence(
    options: attnserve_pb2.DecodingOptions,
) -> None:
    parsed = attnserve_pb2.DecodingOptions.FromString(options.SerializeToString())
    assert parsed == options
    for name in OPTIONAL_FIELDS:
        # An explicit 0 must stay distinguishable from "unset".
        assert parsed.HasField(name) == options.HasField(name), name


@settings(max_examples=100, deadline=None)
@given(translate_requests())
def test_translate_request_round_trip(request: attnserve_pb2.TranslateRequest) -> None:
    parsed = attnserve_pb2.TranslateRequest.FromString(request.SerializeToString())
    assert parsed == request
    assert parsed.HasField("options") == request.HasField("options")
    assert parsed.SerializeToString(deterministic=True) == request.SerializeToString(
        deterministic=True
    )


def test_unset_optional_fields_differ_from_explicit_zero() -> None:
    unset = attnserve_pb2.DecodingOptions()
    zero = attnserve_pb2.DecodingOptions(temperature=0.0, top_p=0.0, seed=0, length_penalty=0.0)
    assert unset != zero
    assert zero.SerializeToString() != b""
    parsed = attnserve_pb2.DecodingOptions.FromString(zero.SerializeToString())
    assert all(parsed.HasField(name) for name in OPTIONAL_FIELDS)
    assert not any(unset.HasField(name) for name in OPTIONAL_FIELDS)
