"""Hypothesis against the live HTTP/REST port: random and half-right bodies, headers and routes
never get a 500 or a non-JSON error, every error says something, and the server keeps
answering good requests after them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serving.rest.conftest import request

ALLOWED = {200, 400, 404, 405, 409, 413, 429}
MODELS = st.sampled_from(["translator", "captioner", "vit", "nope", "", "..", "vit/versions/1"])
ROUTES = st.sampled_from(["infer", "generate", "generate_stream", "ready", "config", "stats"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
DATATYPES = st.sampled_from(["BYTES", "UINT8", "FP32", "FP16", "INT64", "BOOL", "BF16", "X"])
NAMES = st.sampled_from(["text", "image", "pixel_values", "target_language", "stop", "x"])
SHAPES = st.lists(st.integers(-2, 4), max_size=4) | JSON


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": draw(NAMES), "datatype": draw(DATATYPES)}
    tensor["shape"] = draw(SHAPES)
    if draw(st.booleans()):
        tensor["data"] = draw(st.lists(st.integers(-3, 300) | st.text(max_size=5), max_size=8))
    if draw(st.booleans()):
        tensor["parameters"] = draw(
            st.dictionaries(
                st.sampled_from(["binary_data_size", "shared_memory_region", "y"]),
                st.integers(-1, 20) | st.text(max_size=4),
                max_size=2,
            )
        )
    return tensor


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A body (half-right infer or generate object, random JSON, or random bytes) and headers."""
    kind = draw(st.sampled_from(["infer", "generate", "json", "bytes"]))
    if kind == "infer":
        document: Any = {"inputs": draw(st.lists(tensors(), max_size=3))}
        if draw(st.booleans()):
            document["parameters"] = draw(st.dictionaries(st.text(max_size=8), JSON, max_size=3))
        if draw(st.booleans()):
            document["outputs"] = draw(st.lists(JSON, max_size=2))
    elif kind == "generate":
        document = draw(
            st.dictionaries(
                st.sampled_from(["text", "target_language", "image", "max_new_tokens", "stop"]),
                JSON,
                max_size=4,
            )
        )
    elif kind == "json":
        document = draw(JSON)
    else:
        return draw(st.binary(max_size=64)), {}
    body = json.dumps(document).encode() + draw(st.binary(max_size=16))
    headers = {}
    if draw(st.booleans()):
        headers["Inference-Header-Content-Length"] = draw(
            st.sampled_from([str(len(body)), "0", "-1", "x", str(len(body) + 5)])
        )
    return body, headers


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(model=MODELS, route=ROUTES, body=bodies())
def test_random_requests_get_json_errors(
    url: str, model: str, route: str, body: tuple[bytes, dict[str, str]]
) -> None:
    data, headers = body
    method = "POST" if route.startswith(("infer", "generate")) else "GET"
    answer = request(
        f"{url}/v2/models/{model}/{route}", data if method == "POST" else None, headers, method
    )
    assert answer.status in ALLOWED, (answer.status, answer.body[:300])
    if route == "ready" and answer.status in (200, 400):  # a health answer: the status says
        assert answer.body == b""
    elif answer.status >= 400:
        error = json.loads(answer.body)["error"]
        assert isinstance(error, str) and len(error) > 10
    assert request(f"{url}/v2/health/live").status == 200


def test_still_serving_after_the_fuzz(url: str) -> None:
    answer = request(
        f"{url}/v2/models/translator/generate",
        {"text": "doce", "target_language": "de", "max_new_tokens": 3},
    )
    assert answer.status == 200 and isinstance(answer.json()["translation"], str)
