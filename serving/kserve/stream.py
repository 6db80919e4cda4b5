"""Decoupled streaming (``ModelStreamInfer``): one response per generated token, then a final one.

Requests that cannot stream (classification, N > 1, beam search) get one final response.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from serving.errors import InvalidArgument
from serving.kserve.execute import TEXT_OUTPUT, build_response, generation_jobs, infer, parameter
from serving.kserve.parameters import decoding_options
from serving.kserve.request import Call
from serving.kserve.signature import SCORE_INPUT
from serving.kserve.tensors import BYTES, encode_bytes
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedGenerator, StreamDelta

_Tensor = pb.ModelInferResponse.InferOutputTensor


def _final(final: bool) -> dict[str, bool | int | str]:
    return {"final": final, "triton_final_response": final}


def _whole(call: Call) -> bool:
    """Beam search settles its text only at the end, and token log-probabilities and
    alternatives come with the whole output: such requests are not streamed; nor is a scored
    one (nothing is decoded)."""
    options = decoding_options(call.request.parameters)
    whole = options.beam_size > 1 or options.return_log_probs or bool(options.num_alternatives)
    return whole or SCORE_INPUT in call.inputs  # a scored request: one response


async def stream_responses(call: Call) -> AsyncGenerator[pb.ModelInferResponse, None]:
    """The decoupled responses of one streamed request (see the module docstring)."""
    model = call.model
    if not isinstance(model, ServedGenerator) or call.batch > 1 or _whole(call):
        response = await infer(call)
        for key, value in _final(True).items():
            response.parameters[key].CopyFrom(parameter(value))
        yield response
        return
    if any(wanted.shared for wanted in call.wanted):
        raise InvalidArgument(
            "a streamed generation sends a response per piece of text: request its outputs "
            "without shared memory here, or use ModelInfer for outputs in shared memory"
        )
    (job,) = generation_jobs(call, model)
    text_output = TEXT_OUTPUT[model.config.task]
    deltas = DeltaResponses(call, text_output)
    async for item in model.stream(job):
        if isinstance(item, StreamDelta):
            yield deltas.response(item)
        else:
            outputs = {
                text_output: (BYTES, [b""]),
                "token_ids": ("INT32", np.zeros((1, 0), dtype=np.int32)),
            }
            yield build_response(
                call,
                outputs,
                {
                    **_final(True),
                    "finish_reason": item.finish_reason,
                    "input_tokens": item.input_tokens,
                    "output_tokens": len(item.token_ids),
                },
            )


class DeltaResponses:
    """The responses of one call's streamed pieces of text.

    The event loop builds one per token and stream, and the generic ``build_response`` (array
    conversions, a parameter message copied per key) took 23% of its time under 32 KServe
    streams; these are built directly from the call's fixed fields. Same messages as
    ``build_response``; a request for Triton's ``classification`` of an output takes that path.
    """

    def __init__(self, call: Call, text_output: str) -> None:
        self.call, self.text_output = call, text_output
        self.direct = not any(wanted.classification for wanted in call.wanted)
        model = call.model
        self.fields: dict[str, Any] = {
            "model_name": model.name,
            "model_version": str(model.version),
            "id": call.request.id,
        }

    def response(self, item: StreamDelta) -> pb.ModelInferResponse:
        """The response carrying ``item``: its text and its token ids, ``final`` false."""
        text, ids = item.delta.encode(), np.asarray(item.token_ids, dtype=np.int32)
        if not self.direct:
            outputs = {self.text_output: (BYTES, [text]), "token_ids": ("INT32", ids[None])}
            return build_response(self.call, outputs, {"index": item.index, **_final(False)})
        tensors: dict[str, tuple[_Tensor, Any]] = {
            self.text_output: (_Tensor(name=self.text_output, datatype=BYTES, shape=[1]), text),
            "token_ids": (_Tensor(name="token_ids", datatype="INT32", shape=[1, len(ids)]), ids),
        }
        response = pb.ModelInferResponse(**self.fields)
        for wanted in self.call.wanted:
            header, value = tensors[wanted.name]
            response.outputs.append(header)
            raw = encode_bytes([value]) if header.datatype == BYTES else value.tobytes()
            response.raw_output_contents.append(raw)
        parameters = response.parameters
        parameters["index"].int64_param = item.index
        for key, flag in _final(False).items():
            parameters[key].bool_param = bool(flag)
        return response
