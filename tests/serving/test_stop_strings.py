"""Stop strings (``stop``, finish reason ``stop_sequence``): the matcher against a plain
reference (hypothesis, the served Marian tokenizer); the engine ending a request where a stop
string appeared (``finish_at``); the tiny random MarianMTModel of ``hf_repository`` served for
real: its token ids are exactly ``generate(stop_strings=...)``'s and its text ends before the
stop string, on the attnserve API, a stream (which never sends part of a stop string), KServe's
``stop`` input and stream, with sampled alternatives and target prefixes, across two frontend
processes and from the CLI; bad values say what to change.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402

import attnserve_cli  # noqa: E402
from contract.repository import read_model_config, resolve_version  # noqa: E402
from contract.text import load_text_tokenizer  # noqa: E402
from serving.client import AttnServeClient, ClientError  # noqa: E402
from serving.engine.inflight import InFlightEngine  # noqa: E402
from serving.engine.requests import FinishEvent, GenerationRequest, TokenEvent  # noqa: E402
from serving.generation.options import DecodingOptions  # noqa: E402
from serving.generation.stop import StopMatcher  # noqa: E402
from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from serving.services.attnserve import FINISH  # noqa: E402
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.hf_marian import generate, load_marian, translate  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402
from tests.serving.test_inplace_cache import load  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")


# --- the matcher against a reference ------------------------------------------------------------


@pytest.fixture(scope="module")
def served_tokenizer(hf_repository: Path) -> Any:
    entry = hf_repository / "marian"
    return load_text_tokenizer(resolve_version(entry), read_model_config(entry).tokenizer)


def _reference(tokenizer: Any, ids: list[int], stops: list[str], prefix: int) -> tuple[int, str]:
    """The tokens kept and the text: the first k whose text holds a stop string ending after
    the prefix's text, cut where the earliest such one starts (all of them and the whole text
    where none appears)."""
    guard = len(tokenizer.decode(ids[:prefix]))
    for k in range(prefix + 1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        starts = [
            i
            for stop in stops
            for i in range(len(text) - len(stop) + 1)
            if text.startswith(stop, i) and i + len(stop) > guard
        ]
        if starts:
            return k, text[: min(starts)]
    return len(ids), tokenizer.decode(ids)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_matcher_is_the_reference(served_tokenizer: Any, data: st.DataObject) -> None:
    tokenizer = served_tokenizer
    ordinary = [t for t in range(tokenizer.vocab_size) if t not in tokenizer.special_ids]
    ids = data.draw(st.lists(st.sampled_from(ordinary), min_size=1, max_size=14))
    text = tokenizer.decode(ids)
    substrings = st.integers(0, max(0, len(text) - 1)).flatmap(
        lambda i: st.integers(i + 1, len(text) + 1).map(lambda j: text[i:j] or "x")
    )
    stops = data.draw(st.lists(substrings | st.text("ab nx", min_size=1, max_size=3), max_size=3))
    stops = list(dict.fromkeys(stops)) or ["\n"]
    prefix = data.draw(st.integers(0, len(ids) - 1))
    matcher = StopMatcher(tokenizer, stops, prefix)
    streamed, taken = "", 0
    for chunk in np.array_split(np.asarray(ids), data.draw(st.integers(1, len(ids)))):
        taken += matcher.add(chunk.tolist())
        streamed += matcher.release()
    kept, expected = _reference(tokenizer, ids, stops, prefix)
    if matcher.kept is None:
        assert kept == len(ids) and taken == len(ids)
    else:
        assert (matcher.kept, taken) == (kept, kept)
    final = matcher.final_text(tokenizer.decode(ids[:kept]))
    assert final == expected
    assert streamed + matcher.rest(final) == final  # nothing sent that turned out to be a stop


# --- the engine ends a request where it is told -------------------------------------------------


def test_the_engine_finishes_a_request_at_the_tokens_kept(tiny_repository: Path) -> None:
    """``finish_at`` after the third token: the finish holds the first two (reason stop, the
    score their log-probabilities' sum), the rows are free, and the engine goes on."""
    config, runner, cache = load(tiny_repository / "translator")
    batching = dataclasses.replace(config.batching, max_active_sequences=8)
    engine = InFlightEngine("m", runner, config.decoder, 20, batching, cache=cache)
    source = np.arange(8, 14, dtype=np.int64)
    options = DecodingOptions(max_new_tokens=18, min_new_tokens=18, return_log_probs=True)

    async def run() -> tuple[FinishEvent, list[TokenEvent], FinishEvent]:
        request = GenerationRequest(options=options, source_ids=source)
        tokens: list[TokenEvent] = []
        final = None
        async for event in engine.generate(request):
            if isinstance(event, TokenEvent):
                tokens.append(event)
                if len(tokens) == 3:
                    request.finish_at(2)
            elif isinstance(event, FinishEvent):
                final = event
        assert isinstance(final, FinishEvent)
        for _ in range(500):  # its rows are given back as it leaves the step
            if engine.active_rows == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.active_rows == 0 and cache.tokens == 0
        again = GenerationRequest(options=options, source_ids=source)
        events = [e async for e in engine.generate(again)]
        assert isinstance(events[-1], FinishEvent)
        return final, tokens, events[-1]

    engine.start()
    try:
        final, tokens, again = asyncio.run(run())
    finally:
        engine.stop()
    assert final.reason == "stop_sequence"
    assert final.tokens == [e.token_id for e in tokens[:2]] == again.tokens[:2]
    assert final.log_probs == pytest.approx([e.log_prob for e in tokens[:2]])
    assert final.score == pytest.approx(sum(final.log_probs or []))
    assert len(again.tokens) == 18 and again.reason == "length"


# --- served, against generate() -----------------------------------------------------------------


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    found = load_marian(hf_sources["marian"])
    tokenizer = found["tokenizer"]
    plain = generate(found, found["texts"], num_beams=1)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in plain]
    # two stop strings from the middle of two outputs: they end some outputs early
    stops = [t[len(t) // 2 : len(t) // 2 + 3] for t in texts if len(t) > 12][:2]
    return found | {"plain": plain, "stops": stops}


def _stopped(marian: dict[str, Any], texts: list[str], stops: list[str]) -> list[list[int]]:
    return generate(marian, texts, num_beams=1, stop_strings=stops, tokenizer=marian["tokenizer"])


def _cut(text: str, stops: list[str]) -> str:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(found)] if found else text


def test_greedy_with_stop_strings_is_generate(
    hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    texts, stops = marian["texts"], marian["stops"]
    expected = _stopped(marian, texts, stops)
    assert expected != marian["plain"]  # the stop strings end outputs early
    served = [
        r
        for half in (texts[:20], texts[20:])
        for r in hf_client.translate(half, to="de", model="marian", stop=stops)
    ]
    assert [r.token_ids for r in served] == expected
    plain = [
        r
        for half in (texts[:20], texts[20:])
        for r in hf_client.translate(half, to="de", model="marian")
    ]
    decode = marian["tokenizer"].decode
    for result, ids, without in zip(served, expected, plain, strict=True):
        full = decode(ids, skip_special_tokens=True)
        assert result.text == _cut(full, stops)
        stopped = result.text != full  # a stop string appeared (perhaps in its last token)
        assert result.finish_reason == ("stop_sequence" if stopped else without.finish_reason)


def test_a_stream_never_sends_a_stop_string(
    hf_server: ServerThread, hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    stops = marian["stops"]
    unary = hf_client.translate(marian["texts"][:10], to="de", model="marian", stop=stops)
    assert "stop_sequence" in {r.finish_reason for r in unary}
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        for text, result in zip(marian["texts"][:10], unary, strict=True):
            request = pb.TranslateStreamRequest(
                model="marian",
                text=text,
                target_language="de",
                options=pb.DecodingOptions(stop=stops),
            )
            messages = list(stub.TranslateStream(request, timeout=30))
            assert "".join(m.delta for m in messages) == result.text
            assert [t for m in messages for t in m.token_ids] == result.token_ids
            assert messages[-1].finish_reason == FINISH[result.finish_reason]
            sent = ""
            for message in messages:  # no prefix of what was sent runs into a stop string
                sent += message.delta
                assert not any(s in sent for s in stops)


def test_a_stop_inside_the_target_prefix_does_not_end_the_output(
    hf_client: AttnServeClient, marian: dict[str, Any]
) -> None:
    """A stop string must end after the prefix: one the prefix holds ends the output only
    where it appears again."""
    decode = marian["tokenizer"].decode
    index = next(i for i, ids in enumerate(marian["plain"]) if len(ids) > 8)
    text, ids = marian["texts"][index], marian["plain"][index]
    prefix = decode(ids[:4], skip_special_tokens=True)
    stop = prefix[-3:]
    plain = hf_client.translate([text], to="de", model="marian", prefix=prefix)[0]
    stopped = hf_client.translate([text], to="de", model="marian", prefix=prefix, stop=[stop])[0]
    after = plain.text.find(stop, len(prefix) - len(stop) + 1)
    assert stopped.text == (plain.text[:after] if after >= 0 else plain.text)
    assert stopped.text.startswith(prefix)
    assert stopped.token_ids == plain.token_ids[: len(stopped.token_ids)]


def test_sampled_alternatives_stop_each(hf_client: AttnServeClient, marian: dict[str, Any]) -> None:
    """Each further sample ends at a stop string as a request of its seed does."""
    stops, text = marian["stops"], marian["texts"][3]
    sampling = {"temperature": 0.8, "seed": 11, "stop": stops}
    (result,) = hf_client.translate([text], to="de", model="marian", num_alternatives=3, **sampling)
    for i, alternative in enumerate(result.alternatives, start=1):
        alone = hf_client.translate(
            [text], to="de", model="marian", **(sampling | {"seed": 11 + i})
        )
        assert alternative == alone[0].text


def _kserve(stub: Any, texts: list[str], stops: list[str]) -> tuple[list[list[int]], list[str]]:
    request = infer_request(
        "marian",
        ("text", "BYTES", [t.encode() for t in texts]),
        ("stop", "BYTES", [s.encode() for s in stops]),
    )
    outputs = decode_outputs(stub.ModelInfer(request, timeout=30))
    rows = [[t for t in row if t != -1] for row in outputs["token_ids"].tolist()]
    return rows, [t.decode() for t in outputs["translation"].tolist()]


def test_kserve_and_two_frontend_processes(
    hf_server: ServerThread, hf_repository: Path, marian: dict[str, Any]
) -> None:
    texts, stops = marian["texts"][:8], marian["stops"]
    expected = _stopped(marian, texts, stops)
    decode = marian["tokenizer"].decode
    cut = [_cut(decode(ids, skip_special_tokens=True), stops) for ids in expected]
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        assert _kserve(stub, texts, stops) == (expected, cut)
    with two_frontends(hf_repository, models=("marian",), connections=2) as (server, stubs):
        for stub in stubs:
            assert _kserve(stub, texts, stops) == (expected, cut)
        with AttnServeClient(server.address) as client:  # a stream across processes
            result = client.translate([texts[0]], to="de", model="marian", stop=stops)[0]
            streamed = client.translate_stream(texts[0], to="de", model="marian", stop=stops)
            assert "".join(streamed) == result.text == cut[0]


def test_a_kserve_stream_never_sends_a_stop_string(
    hf_server: ServerThread, marian: dict[str, Any]
) -> None:
    texts, stops = marian["texts"][:6], marian["stops"]
    expected = _stopped(marian, texts, stops)
    decode = marian["tokenizer"].decode
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        for text, ids in zip(texts, expected, strict=True):
            request = infer_request(
                "marian",
                ("text", "BYTES", [text.encode()]),
                ("stop", "BYTES", [s.encode() for s in stops]),
            )
            responses = [m.infer_response for m in stub.ModelStreamInfer(iter([request]))]
            outputs = [decode_outputs(r) for r in responses if "translation" in decode_outputs(r)]
            deltas = [o["translation"].reshape(-1)[0].decode() for o in outputs]
            streamed = [int(t) for o in outputs for t in o["token_ids"].reshape(-1) if t >= 0]
            full = decode(ids, skip_special_tokens=True)
            assert "".join(deltas) == _cut(full, stops)
            assert streamed == ids
            reason = responses[-1].parameters["finish_reason"].string_param
            assert reason == ("stop_sequence" if _cut(full, stops) != full else "stop")


def test_the_cli_passes_stop_strings(
    hf_server: ServerThread, marian: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text, stops = marian["texts"][0], marian["stops"]
    ids = _stopped(marian, [text], stops)[0]
    expected = _cut(marian["tokenizer"].decode(ids, skip_special_tokens=True), stops)
    flags = [flag for stop in stops for flag in ("--stop", stop)]
    args = ["translate", text, "--to", "de", "--model", "marian", "--server", hf_server.address]
    assert attnserve_cli.main([*args, *flags]) == 0
    assert capsys.readouterr().out.rstrip("\n") == expected


# --- bad values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stop": [""]}, "stop[0] must be a non-empty string"),
        ({"stop": ["y" * 300]}, "stop[0] is 300 characters long: send at most 256"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop holds 17 strings: send at most 16"),
        ({"stop": ["."], "beam_size": 3}, "use beam_size 1 with stop"),
    ],
    ids=["empty", "long", "many", "beams"],
)
def test_bad_stop_strings_say_what_to_change(
    hf_server: ServerThread, hf_client: AttnServeClient, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClientError, match="INVALID_ARGUMENT") as caught:
        translate(hf_client, ["one two"], **options)
    assert message in str(caught.value)
    params = {k: v for k, v in options.items() if k != "stop"}
    with grpc.insecure_channel(hf_server.address) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian",
            ("text", "BYTES", [b"one two"]),
            ("stop", "BYTES", [s.encode() for s in options["stop"]]),
            **params,
        )
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(request, timeout=30)
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in rpc.value.details()
