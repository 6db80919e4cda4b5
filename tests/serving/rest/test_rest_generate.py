"""Triton's generate extension on a real server: ``/generate`` answers what ModelInfer answers for
the same element, ``/generate_stream`` sends it as server-sent events that add up to it, word
lists and pixels as generate values, errors before and during a stream, and a client that hangs
up mid-stream has its sequences freed."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import numpy as np
import pytest

from serving.kserve.tensors import decode_outputs
from serving.proto_gen.inference import grpc_service_pb2_grpc as pb_grpc
from tests.serving.kserve.infer_requests import infer_request, translate
from tests.serving.rest.conftest import request
from tests.serving.server_thread import ServerThread

IMAGE = np.random.default_rng(1).integers(0, 255, (48, 48, 3), dtype=np.uint8)
OPTIONS: list[dict[str, Any]] = [
    {"target_language": "de", "max_new_tokens": 6},
    {"target_language": "fr", "beam_size": 3, "max_new_tokens": 5},
    {"target_language": "es", "temperature": 0.9, "top_k": 20, "seed": 7, "max_new_tokens": 6},
]


def _events(body: bytes) -> list[dict[str, Any]]:
    """The JSON of each ``data:`` event of a server-sent events body."""
    chunks = body.decode().split("\n\n")
    assert chunks[-1] == ""  # every event ends with a blank line
    assert all(chunk.startswith("data: ") for chunk in chunks[:-1])
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks[:-1]]


@pytest.mark.parametrize("options", OPTIONS, ids=["greedy", "beams", "sampled"])
def test_generate_is_model_infer(
    options: dict[str, Any], url: str, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    answer = request(
        f"{url}/v2/models/translator/generate", {"text": "three hundred", "id": "g", **options}
    )
    assert answer.status == 200, answer.body
    want = decode_outputs(stub.ModelInfer(translate([b"three hundred"], **options), timeout=30))
    assert answer.json() == {
        "model_name": "translator",
        "model_version": "1",
        "id": "g",
        "translation": want["translation"][0].decode(),
        "token_ids": want["token_ids"][0].tolist(),
    }


def test_parameters_object_and_version_route(url: str) -> None:
    flat = request(
        f"{url}/v2/models/translator/generate",
        {"text": "doce", "target_language": "de", "max_new_tokens": 4},
    )
    nested = request(
        f"{url}/v2/models/translator/versions/1/generate",
        {"text": "doce", "parameters": {"target_language": "de", "max_new_tokens": 4}},
    )
    assert flat.status == nested.status == 200
    assert flat.json() == nested.json()


def test_stream_adds_up_to_generate(url: str) -> None:
    body = {"text": "three hundred and twelve", "target_language": "fr", "max_new_tokens": 8}
    whole = request(f"{url}/v2/models/translator/generate", body).json()
    answer = request(f"{url}/v2/models/translator/generate_stream", body)
    assert answer.status == 200
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = _events(answer.body)
    assert len(events) >= 2  # tokens (one or more an event), then the final one
    assert "".join(e["translation"] for e in events) == whole["translation"]
    ids = [i for e in events for i in e["token_ids"]]  # token_ids [1, k]: always a list
    assert ids == whole["token_ids"]
    assert [e["parameters"]["final"] for e in events] == [False] * (len(events) - 1) + [True]
    final = events[-1]["parameters"]
    assert final["output_tokens"] == len(whole["token_ids"])
    assert final["finish_reason"] in ("stop", "length")


def test_word_lists_and_stop_strings(url: str, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    plain = request(
        f"{url}/v2/models/translator/generate",
        {"text": "three hundred and twelve", "target_language": "de", "max_new_tokens": 8},
    ).json()
    word = plain["translation"].split()[0] if plain["translation"].strip() else "x"
    body = {
        "text": "three hundred and twelve",
        "target_language": "de",
        "max_new_tokens": 8,
        "bad_words": [word],
        "stop": ["zzz"],
    }
    answer = request(f"{url}/v2/models/translator/generate", body)
    assert answer.status == 200, answer.body
    want = infer_request(
        "translator",
        ("text", "BYTES", [b"three hundred and twelve"]),
        ("bad_words", "BYTES", [word.encode()]),
        ("stop", "BYTES", [b"zzz"]),
        target_language="de",
        max_new_tokens=8,
    )
    got = decode_outputs(stub.ModelInfer(want, timeout=30))
    assert answer.json()["translation"] == got["translation"][0].decode()
    single = request(f"{url}/v2/models/translator/generate", {**body, "bad_words": word})
    assert single.json() == answer.json()  # one word may be a plain string


def test_captioner_with_pixels(url: str, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    answer = request(
        f"{url}/v2/models/captioner/generate", {"image": IMAGE.tolist(), "max_new_tokens": 5}
    )
    assert answer.status == 200, answer.body
    want = stub.ModelInfer(
        infer_request("captioner", ("image", "UINT8", IMAGE[None]), max_new_tokens=5), timeout=30
    )
    assert answer.json()["caption"] == decode_outputs(want)["caption"][0].decode()


@pytest.mark.parametrize(
    ("route", "body", "status", "words"),
    [
        ("generate", {"text": 3, "target_language": "de"}, 400, "must be a string"),
        ("generate", {"txt": "three"}, 400, "names none of model 'translator'"),
        ("generate", {"text": "three"}, 400, "target_language is missing"),
        ("generate", ["three"], 400, "one JSON object"),
        ("generate", {"text": "a", "target_language": "de", "temperature": None}, 400, "null"),
        ("generate_stream", {"text": "a", "target_language": "xx"}, 400, "target_language"),
        ("generate_stream", {"text": "a", "target_language": "de", "beam_size": 0}, 400, "beam"),
        ("generate", {"text": "a", "target_language": "de", "id": 5}, 400, '"id"'),
    ],
    ids=["number", "no input", "missing", "array", "null", "language", "beams", "id"],
)
def test_bad_generate_requests(route: str, body: Any, status: int, words: str, url: str) -> None:
    answer = request(f"{url}/v2/models/translator/{route}", body)
    assert answer.status == status, answer.body
    assert answer.headers["content-type"].startswith("application/json")
    assert words in answer.json()["error"]


def test_unknown_model(url: str) -> None:
    answer = request(f"{url}/v2/models/nope/generate_stream", {"text": "a"})
    assert answer.status == 404 and "no model named 'nope'" in answer.json()["error"]


def test_hanging_up_mid_stream_frees_the_sequences(url: str, server: ServerThread) -> None:
    assert server.running is not None
    model: Any = server.running.repository.get("translator")
    limit = model.config.limits.max_new_tokens
    body = json.dumps(
        {"text": "three", "target_language": "de", "min_new_tokens": limit, "max_new_tokens": limit}
    ).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/translator/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    while model.engine.active_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.engine.active_rows == 0
    after = request(
        f"{url}/v2/models/translator/generate",
        {"text": "three", "target_language": "de", "max_new_tokens": 2},
    )
    assert after.status == 200
