"""Each position's most likely tokens (``DecodingOptions.top_log_probs``) checked against
PyTorch.

The tiny random MarianMTModel of ``hf_repository`` served for real: at every output position the
k most likely tokens and their log-probabilities are ``torch.topk`` of the log-softmax that
``generate``'s scores hold (greedy; the Marian generation config renormalises after its token
rules) or of the teacher-forced logits (sampling: the values before temperature); the chosen
token's own value is ``token_log_probs``'. Unary, streamed, further samples, a target prefix,
a stop string, KServe's outputs and two frontend processes carry the same values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the export extra")
torch = pytest.importorskip("torch", reason="needs the export extra")

import grpc  # noqa: E402

from serving.kserve.tensors import decode_outputs  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402
from serving.proto_gen.inference import grpc_service_pb2_grpc as kserve_grpc  # noqa: E402
from tests.serving.frontends import two_frontends  # noqa: E402
from tests.serving.hf_marian import generate_beams, generate_greedy, load_marian  # noqa: E402
from tests.serving.kserve.infer_requests import infer_request  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_hub")

TEXTS = 12
K = 5
TOLERANCE = 2e-4  # ONNX Runtime against PyTorch logits, through a log-softmax


@pytest.fixture(scope="module")
def marian(hf_sources: dict[str, Path]) -> dict[str, Any]:
    return load_marian(hf_sources["marian"], TEXTS, seed=31)


@pytest.fixture(scope="module")
def stub(hf_server: ServerThread) -> Any:
    with grpc.insecure_channel(hf_server.address) as channel:
        yield pb_grpc.AttnServeStub(channel)


def options(top: int = K, **fields: Any) -> pb.DecodingOptions:
    return pb.DecodingOptions(return_log_probs=True, top_log_probs=top, **fields)


def translate(stub: Any, texts: list[str], opts: pb.DecodingOptions, **request: Any) -> list:
    call = pb.TranslateRequest(
        texts=texts, target_language="de", model="marian", options=opts, **request
    )
    return list(stub.Translate(call, timeout=30).translations)


def tops(output: Any) -> list[tuple[list[int], list[float]]]:
    """An output's ``top_log_probs`` as (ids, values) per token."""
    return [(list(t.token_ids), list(t.log_probs)) for t in output.top_log_probs]


def expected_tops(log_probs: Any, k: int) -> list[tuple[list[int], list[float]]]:
    """torch.topk of each row of log-probabilities (positions x vocabulary)."""
    values, ids = torch.topk(log_probs, k, dim=-1)
    return [(i.tolist(), v.tolist()) for i, v in zip(ids, values, strict=True)]


def assert_tops_equal(served: list, expected: list) -> None:
    assert len(served) == len(expected)
    for (ids, values), (want_ids, want_values) in zip(served, expected, strict=True):
        np.testing.assert_allclose(values, want_values, atol=TOLERANCE)
        near_tie = np.abs(np.diff(want_values)) < 2 * TOLERANCE  # order of near-equal values
        if not near_tie.any():
            assert ids == want_ids


def generate_log_probs(marian: dict[str, Any], text: str, **controls: Any) -> Any:
    """``generate``'s greedy output's per-step log-probabilities (steps x vocabulary)."""
    out = generate_greedy(marian, text, **controls)
    return torch.log_softmax(torch.cat(out.scores), -1)


def teacher_forced(marian: dict[str, Any], text: str, ids: list[int]) -> Any:
    """The model's log-softmax at each position of the output ``ids`` (Marian's pad never
    chosen: the entry's token rule)."""
    tokenizer, model = marian["tokenizer"], marian["model"]
    decoder = torch.tensor([[model.config.decoder_start_token_id, *ids]])
    with torch.no_grad():
        logits = model(**tokenizer([text], return_tensors="pt"), decoder_input_ids=decoder).logits
    logits[0, :, tokenizer.pad_token_id] = -np.inf
    return torch.log_softmax(logits[0, : len(ids)], -1)


@pytest.mark.parametrize("controls", [{}, {"repetition_penalty": 1.6}], ids=["plain", "penalty"])
def test_greedy_tops_are_generates_most_likely_tokens(
    stub: Any, marian: dict[str, Any], controls: dict[str, Any]
) -> None:
    texts = marian["texts"]
    served = translate(stub, texts, options(**controls))
    for text, output in zip(texts, served, strict=True):
        log_probs = generate_log_probs(marian, text, **controls)
        ids = list(output.token_ids)
        assert_tops_equal(tops(output), expected_tops(log_probs[: len(ids)], K))
        for position, (top_ids, top_values) in enumerate(tops(output)):
            assert top_ids[0] == ids[position]  # greedy: the most likely is the chosen one
            assert top_values[0] == pytest.approx(output.token_log_probs[position], abs=1e-6)
            assert top_values == sorted(top_values, reverse=True)


def test_sampled_tops_are_the_distribution_before_temperature(
    stub: Any, marian: dict[str, Any]
) -> None:
    """Sampling with temperature and top-k: the tops are the model's own log-softmax at each
    position of the drawn output, which need not contain the drawn token."""
    text = marian["texts"][0]
    (output,) = translate(stub, [text], options(temperature=1.8, top_k=30, seed=5))
    ids = list(output.token_ids)
    log_probs = teacher_forced(marian, text, ids)
    assert_tops_equal(tops(output), expected_tops(log_probs, K))
    chosen = [float(log_probs[i, t]) for i, t in enumerate(ids)]
    np.testing.assert_allclose(output.token_log_probs, chosen, atol=TOLERANCE)


def test_further_samples_carry_their_own_tops(stub: Any, marian: dict[str, Any]) -> None:
    """num_alternatives with sampling: alternative i's tops are those of the request with seed
    s + i (as its tokens are)."""
    text = marian["texts"][1]
    (first,) = translate(stub, [text], options(temperature=1.2, seed=40, num_alternatives=2))
    for i, alternative in enumerate(first.alternatives, start=1):
        (alone,) = translate(stub, [text], options(temperature=1.2, seed=40 + i))
        assert list(alternative.token_ids) == list(alone.token_ids)
        assert len(alternative.top_log_probs) == len(alternative.token_ids)
        assert tops(alternative) == tops(alone)


@pytest.mark.parametrize("top", [1, 20])
def test_streams_carry_each_tokens_tops(stub: Any, marian: dict[str, Any], top: int) -> None:
    for text in marian["texts"][:3]:
        (unary,) = translate(stub, [text], options(top))
        request = pb.TranslateStreamRequest(
            text=text, target_language="de", model="marian", options=options(top)
        )
        messages = list(stub.TranslateStream(request, timeout=30))
        assert all(len(m.top_log_probs) == len(m.token_ids) for m in messages)
        streamed = [top for m in messages for top in tops(m)]
        assert streamed == tops(unary)
        assert all(len(ids) == top for ids, _ in streamed)


def test_a_prefix_lists_its_own_tokens_and_a_stop_string_cuts_the_tops(
    stub: Any, marian: dict[str, Any]
) -> None:
    text = marian["texts"][2]
    (plain,) = translate(stub, [text], options())
    tokenizer = marian["tokenizer"]
    forced = tokenizer(text_target="three").input_ids[:-1]  # without its EOS
    (prefixed,) = translate(stub, [text], options(), target_prefixes=["three"])
    assert list(prefixed.token_ids[: len(forced)]) == forced
    assert tops(prefixed)[: len(forced)] == [([token], [0.0]) for token in forced]
    assert len(prefixed.top_log_probs) == len(prefixed.token_ids)
    assert all(len(ids) == K for ids, _ in tops(prefixed)[len(forced) :])
    stop = plain.text[len(plain.text) // 2 :][:3]
    (stopped,) = translate(stub, [text], options(stop=[stop]))
    assert stop and stopped.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert len(stopped.token_ids) < len(plain.token_ids)
    assert tops(stopped) == tops(plain)[: len(stopped.token_ids)]


def test_kserve_returns_the_tops_as_outputs(
    hf_server: ServerThread, stub: Any, marian: dict[str, Any]
) -> None:
    texts = marian["texts"][:4]
    served = translate(stub, texts, options(3))
    with grpc.insecure_channel(hf_server.address) as channel:
        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request(
            "marian",
            ("text", "BYTES", [t.encode() for t in texts]),
            return_log_probs=True,
            top_log_probs=3,
        )
        outputs = decode_outputs(kserve.ModelInfer(request, timeout=30))
    ids, values = outputs["top_token_ids"], outputs["top_log_probs"]
    assert ids.dtype == np.int32 and values.dtype == np.float32
    assert ids.shape == values.shape == (*outputs["token_ids"].shape, 3)
    for row, output in enumerate(served):
        count = len(output.token_ids)
        assert ids[row, :count].tolist() == [i for i, _ in tops(output)]
        np.testing.assert_allclose(values[row, :count], [v for _, v in tops(output)], atol=1e-6)
        assert (ids[row, count:] == -1).all() and np.isnan(values[row, count:]).all()


def test_two_frontend_processes_carry_the_tops(
    hf_repository: Path, stub: Any, marian: dict[str, Any]
) -> None:
    """Tops cross the engine process's socket in token events (streams) and in finishes (a
    beam search's runner-ups' too)."""
    text = marian["texts"][3]
    (unary,) = translate(stub, [text], options())
    request = pb.TranslateStreamRequest(
        text=text, target_language="de", model="marian", options=options()
    )
    with two_frontends(hf_repository, models=("marian",), connections=1) as (server, _):
        channel = grpc.insecure_channel(server.address)
        try:
            other = pb_grpc.AttnServeStub(channel)
            (remote,) = translate(other, [text], options())
            messages = list(other.TranslateStream(request, timeout=60))
            (beams,) = translate(other, [text], options(beam_size=4, num_alternatives=2))
        finally:
            channel.close()
    assert tops(remote) == tops(unary)
    (local,) = translate(stub, [text], options(beam_size=4, num_alternatives=2))
    assert [tops(h) for h in (beams, *beams.alternatives)] == [
        tops(h) for h in (local, *local.alternatives)
    ]
    assert all(tops(h) for h in beams.alternatives)
    assert [top for m in messages for top in tops(m)] == tops(unary)


def test_beam_hypotheses_carry_their_beams_tops(
    hf_server: ServerThread, stub: Any, marian: dict[str, Any]
) -> None:
    """4 beams, the best and 2 runner-ups: each token's tops are ``torch.topk`` of
    ``generate``'s scores of the beam the hypothesis came through at that step
    (``beam_indices``), as its log-probabilities are ``compute_transition_scores``'."""
    eos = marian["tokenizer"].eos_token_id
    for text in marian["texts"][:6]:
        out = generate_beams(marian, text)
        (best,) = translate(stub, [text], options(beam_size=4, num_alternatives=2))
        for row, hypothesis in enumerate([best, *best.alternatives]):
            chosen = out.sequences[row, 1:].tolist()
            ids = chosen[: chosen.index(eos)] if eos in chosen else chosen
            assert list(hypothesis.token_ids) == ids
            beams = out.beam_indices[row, : len(ids)].tolist()
            rows = torch.stack([out.scores[step][beam] for step, beam in enumerate(beams)])
            assert_tops_equal(tops(hypothesis), expected_tops(torch.log_softmax(rows, -1), K))
            for position, (top_ids, top_values) in enumerate(tops(hypothesis)):
                if ids[position] in top_ids:  # a beam's token need not be its row's likeliest
                    value = top_values[top_ids.index(ids[position])]
                    assert value == pytest.approx(hypothesis.token_log_probs[position], abs=1e-6)
    request = infer_request(
        "marian",
        ("text", "BYTES", [text.encode()]),
        beam_size=4,
        return_log_probs=True,
        top_log_probs=K,
    )
    with grpc.insecure_channel(hf_server.address) as channel:
        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        outputs = decode_outputs(kserve.ModelInfer(request, timeout=30))
    (plain,) = translate(stub, [text], options(beam_size=4))
    count = len(plain.token_ids)
    assert outputs["top_token_ids"][0, :count].tolist() == [i for i, _ in tops(plain)]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_log_probs": 3}, "top_log_probs 3 needs return_log_probs"),
        ({"top_log_probs": 21, "return_log_probs": True}, "top_log_probs 21 is out of range"),
        ({"top_log_probs": -1, "return_log_probs": True}, "top_log_probs -1 is out of range"),
    ],
)
def test_bad_values_are_refused(stub: Any, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        translate(stub, ["a text"], pb.DecodingOptions(**fields))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")


def test_without_the_option_the_answer_has_no_tops(stub: Any, marian: dict[str, Any]) -> None:
    texts = marian["texts"][:4]
    scored = translate(stub, texts, pb.DecodingOptions(return_log_probs=True))
    topped = translate(stub, texts, options())
    assert [list(o.token_ids) for o in scored] == [list(o.token_ids) for o in topped]
    assert all(not o.top_log_probs for o in scored)


def test_the_cli_prints_a_line_of_tops_per_token(
    hf_server: ServerThread,
    stub: Any,
    marian: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    import attnserve_cli

    text = marian["texts"][2]
    (output,) = translate(stub, [text], options(3))
    args = ["translate", text, "--to", "de", "--model", "marian", "--server", hf_server.address]
    assert attnserve_cli.main([*args, "--log-probs", "--top-log-probs", "3"]) == 0
    printed, _scores, *lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert printed == output.text and len(lines) == len(output.token_ids)
    for index, (line, (ids, values)) in enumerate(zip(lines, tops(output), strict=True)):
        head, pairs = line.split(": ", 1)
        assert head == f"top {index}"
        parsed = [pair.split("=") for pair in pairs.split(" ")]
        assert [int(token) for token, _ in parsed] == ids
        assert [float(v) for _, v in parsed] == pytest.approx(values, abs=1e-4)
    assert attnserve_cli.main([*args, "--top-log-probs", "3"]) == 2  # without --log-probs
    assert "return_log_probs" in capsys.readouterr().err
