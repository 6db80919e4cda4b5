"""The client calls the fault tests make (in-process server and multi-process server alike):
each returns its status, what came back and the error's details instead of raising."""

from __future__ import annotations

import threading
from typing import Any

import grpc

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.reliability.harness import sample, scrape

TOKENS = 30
LONG = pb.DecodingOptions(max_new_tokens=TOKENS, min_new_tokens=TOKENS)


def stream(
    stub: pb_grpc.AttnServeStub, text: str, started: threading.Event | None = None
) -> tuple[str, list[int], str]:
    """A TranslateStream to its end (``started`` set at its first tokens): status, tokens,
    details."""
    request = pb.TranslateStreamRequest(text=text, target_language="de", options=LONG)
    tokens: list[int] = []
    try:
        for message in stub.TranslateStream(request, timeout=60):
            tokens += message.token_ids
            if started is not None and tokens:
                started.set()
        return "OK", tokens, ""
    except grpc.RpcError as err:
        return err.code().name, tokens, err.details() or ""


def translate(stub: pb_grpc.AttnServeStub, text: str) -> list[int]:
    request = pb.TranslateRequest(texts=[text], target_language="de", options=LONG)
    return list(stub.Translate(request, timeout=60).translations[0].token_ids)


def classify(stub: pb_grpc.AttnServeStub, image: bytes) -> tuple[str, list[Any], str]:
    try:
        reply = stub.Classify(pb.ClassifyRequest(image=image, top_k=3), timeout=60)
        return "OK", [(s.label, round(s.score, 5)) for s in reply.labels], ""
    except grpc.RpcError as err:
        return err.code().name, [], err.details() or ""


def internal_count(metrics_url: str, model_name: str) -> float:
    """The server's ``attnserve_requests_total`` for ``model_name`` with code INTERNAL."""
    return sample(
        scrape(metrics_url), "attnserve_requests_total", model=model_name, code="INTERNAL"
    )
