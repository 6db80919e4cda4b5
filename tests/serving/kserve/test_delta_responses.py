"""The streamed pieces' responses built directly (``DeltaResponses``) are the messages the generic
``build_response`` makes, for any text, token ids, index and choice and order of outputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from serving.kserve.execute import build_response
from serving.kserve.request import Call, Wanted
from serving.kserve.stream import DeltaResponses
from serving.kserve.tensors import BYTES, decode_outputs
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import StreamDelta


@dataclass
class Named:
    """What a response takes from its model: the name and version (not a classifier)."""

    name: str
    version: int


OUTPUTS = ("translation", "token_ids")
orders = st.lists(st.sampled_from(OUTPUTS), min_size=1, max_size=2, unique=True)
deltas = st.builds(
    StreamDelta,
    delta=st.text(max_size=20),
    token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=4),
    index=st.integers(0, 2**40),
)


def call_for(order: list[str], request_id: str, version: int) -> Call:
    request = pb.ModelInferRequest(model_name="translator", id=request_id)
    wanted = tuple(Wanted(name) for name in order)
    return Call(Named("translator", version), request, {}, wanted, 1, None)  # type: ignore[arg-type]


@given(order=orders, item=deltas, request_id=st.text(max_size=8), version=st.integers(1, 99))
def test_direct_responses_equal_build_response(
    order: list[str], item: StreamDelta, request_id: str, version: int
) -> None:
    call = call_for(order, request_id, version)
    direct = DeltaResponses(call, "translation").response(item)
    outputs = {
        "translation": (BYTES, [item.delta.encode()]),
        "token_ids": ("INT32", np.asarray([item.token_ids], dtype=np.int32)),
    }
    parameters = {"index": item.index, "final": False, "triton_final_response": False}
    assert direct == build_response(call, outputs, parameters)
    assert direct.SerializeToString(deterministic=True) == build_response(
        call, outputs, parameters
    ).SerializeToString(deterministic=True)
    decoded = decode_outputs(direct)
    assert list(decoded) == order
    if "token_ids" in decoded:
        assert decoded["token_ids"].tolist() == [item.token_ids]
    if "translation" in decoded:
        assert decoded["translation"].tolist() == [item.delta.encode()]


def test_a_classification_of_the_token_ids_is_answered_as_triton_does() -> None:
    """Triton's ``classification`` of the numeric output (the path through build_response): the
    top-k token ids as "value:index" strings."""
    call = call_for(["token_ids"], "c", 1)
    call = Call(call.model, call.request, {}, (Wanted("token_ids", 2),), 1, None)
    response = DeltaResponses(call, "translation").response(StreamDelta("ab", [5, 9, 7], 3))
    assert decode_outputs(response)["token_ids"].tolist() == [[b"9.000000:1", b"7.000000:2"]]
    assert response.parameters["index"].int64_param == 3
