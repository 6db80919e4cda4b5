"""TranslateStream calls on the tiny HF Marian entry, read message by message (the client's
``translate_stream`` yields text only)."""

from __future__ import annotations

from typing import Any

import grpc

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc


def stream_log_probs(address: str, text: str, **options: Any) -> tuple[list, list, float]:
    """A TranslateStream's token ids, their log-probabilities and its last message's score."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        request = pb.TranslateStreamRequest(
            text=text,
            target_language="de",
            model="marian",
            options=pb.DecodingOptions(return_log_probs=True, **options),
        )
        messages = list(stub.TranslateStream(request, timeout=30))
    ids = [t for m in messages for t in m.token_ids]
    log_probs = [p for m in messages for p in m.token_log_probs]
    assert all(len(m.token_log_probs) == len(m.token_ids) for m in messages)
    return ids, log_probs, messages[-1].score
