"""Decoupled streaming (``ModelStreamInfer``): one response per generated token, then a final one.

Requests that cannot stream (classification, N > 1, beam search) get one final response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from serving.kserve.execute import TEXT_OUTPUT, build_response, generation_jobs, infer, parameter
from serving.kserve.parameters import decoding_options
from serving.kserve.request import Call
from serving.kserve.tensors import BYTES
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedGenerator, StreamDelta


def _final(final: bool) -> dict[str, bool | int | str]:
    return {"final": final, "triton_final_response": final}


def _beam_search(call: Call) -> bool:
    """Beam search settles its text only at the end: such requests are not streamed."""
    return decoding_options(call.request.parameters).beam_size > 1


async def stream_responses(call: Call) -> AsyncIterator[pb.ModelInferResponse]:
    """The decoupled responses of one streamed request (see the module docstring)."""
    model = call.model
    if not isinstance(model, ServedGenerator) or call.batch > 1 or _beam_search(call):
        response = await infer(call)
        for key, value in _final(True).items():
            response.parameters[key].CopyFrom(parameter(value))
        yield response
        return
    (job,) = generation_jobs(call, model)
    text_output = TEXT_OUTPUT[model.config.task]
    async for item in model.stream(job):
        if isinstance(item, StreamDelta):
            outputs = {
                text_output: (BYTES, [item.delta.encode()]),
                "token_ids": ("INT32", np.asarray([item.token_ids], dtype=np.int32)),
            }
            yield build_response(call, outputs, {"index": item.index, **_final(False)})
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
