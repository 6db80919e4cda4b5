"""The real server on a loopback port, real clients: every RPC, batching, cancellation, errors."""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from contract.images import encode_png
from models.data import digits, shapes
from serving.client import AttnServeClient, ClientError
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from tests.serving.server_thread import ServerThread

EXPECTED = {  # held-in facts of the number grammar, checked by the data tests too
    "de": "dreihundertzwölf",
    "fr": "trois cent douze",
    "es": "trescientos doce",
}


@pytest.fixture(scope="module")
def shipped(shipped_repository: Path):
    with ServerThread(shipped_repository) as server:
        yield server


@pytest.fixture(scope="module")
def tiny(tiny_repository: Path):
    with ServerThread(tiny_repository) as server:
        yield server


def metrics(server: ServerThread) -> dict[str, list]:
    """Scrape /metrics over HTTP and parse it: family name -> samples."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample(families: dict, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    family = name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
    for suffix in ("_sum", "_created"):
        family = family.removesuffix(suffix)
    return sum(
        s.value
        for s in families.get(family, [])
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


# --- answers from the shipped models --------------------------------------------------------------
@pytest.mark.parametrize("lang", sorted(EXPECTED))
def test_translate_gives_the_right_answer(shipped: ServerThread, lang: str) -> None:
    with AttnServeClient(shipped.address) as client:
        result = client.translate(["three hundred and twelve"], to=lang)[0]
    assert result.text == EXPECTED[lang]
    assert result.finish_reason == "stop"


def test_translate_stream_matches_unary(shipped: ServerThread) -> None:
    text = "seven hundred and forty-one thousand, two hundred and six"
    stub = pb_grpc.AttnServeStub(grpc.insecure_channel(shipped.address))
    messages = list(
        stub.TranslateStream(pb.TranslateStreamRequest(text=text, target_language="fr"))
    )
    with AttnServeClient(shipped.address) as client:
        unary = client.translate([text], to="fr")[0]
    tokens = [m for m in messages if m.token_ids]
    # Each message's index is the number of tokens sent before it (several may share a message).
    sent_before = [sum(len(m.token_ids) for m in tokens[:i]) for i in range(len(tokens))]
    assert [m.index for m in tokens] == sent_before
    assert [t for m in tokens for t in m.token_ids] == unary.token_ids
    assert "".join(m.delta for m in messages) == unary.text
    assert messages[-1].finish_reason == pb.FINISH_REASON_STOP
    assert messages[-1].usage.output_tokens == len(unary.token_ids)


def test_caption_and_caption_stream(shipped: ServerThread) -> None:
    data = shapes.generate(6, seed=99, split="test")
    with AttnServeClient(shipped.address) as client:
        captions = [client.caption(encode_png(image)).text for image, _ in data]
        streamed = "".join(client.caption_stream(encode_png(data[0][0])))
    correct = sum(c == truth for c, (_, truth) in zip(captions, data, strict=True))
    assert correct >= 5, list(zip(captions, [t for _, t in data], strict=True))
    assert streamed == captions[0]


def test_caption_usage_counts_the_image_encoder_positions(shipped: ServerThread) -> None:
    """A caption's input tokens are what its decoder attends to: the image's patches and the
    encoder's class token (not 1, as before the encoder pass), unary and streamed alike."""
    from models.captioner import PRESETS

    (image, _), *_ = shapes.generate(1, seed=3, split="test")
    request = pb.CaptionRequest(image=encode_png(image))
    with grpc.insecure_channel(shipped.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        unary = stub.Caption(request, timeout=30)
        last = list(stub.CaptionStream(request, timeout=30))[-1]
    positions = PRESETS["shapes"].num_patches + 1
    assert unary.usage.input_tokens == last.usage.input_tokens == positions


def test_target_prefixes_of_the_shipped_models(shipped: ServerThread) -> None:
    """A prefix of the model's own first word gives its output again; another prefix steers
    it (the README's examples); a caption's first words as its prefix give the caption."""
    text = "three hundred and twelve"
    with AttnServeClient(shipped.address) as client:
        own, steered, plain = client.translate([text] * 3, to="de", prefix=["drei", "vier", ""])
        (image, _), *_ = shapes.generate(1, seed=7, split="test")
        caption = client.caption(encode_png(image))
        first = " ".join(caption.text.split()[:2])
        again = client.caption(encode_png(image), prefix=first)
    assert own.token_ids == plain.token_ids and own.text == "dreihundertzwölf"
    assert steered.text == "vierhundertzwölf"
    assert again.token_ids == caption.token_ids and again.text == caption.text


def test_bad_words_and_stop_strings_of_the_shipped_models(shipped: ServerThread) -> None:
    """The README's examples: a banned word leaves the caption (another shape takes its place),
    a stop string ends it just before, and the translator writes no banned word."""
    (image, _), *_ = shapes.generate(1, seed=0, split="test")
    png = encode_png(image)
    with AttnServeClient(shipped.address) as client:
        caption = client.caption(png)
        banned = client.caption(png, bad_words=["triangle"])
        stopped = client.caption(png, stop=[" above"])
        (plain,) = client.translate(["forty-two"], to="de")
        (without,) = client.translate(["forty-two"], to="de", bad_words=["zwei"])
    assert "triangle" in caption.text and " above" in caption.text
    assert "triangle" not in banned.text and banned.text != caption.text
    assert stopped.text == caption.text[: caption.text.index(" above")]
    assert stopped.finish_reason == "stop_sequence"
    assert len(stopped.token_ids) < len(caption.token_ids)
    assert plain.text == "zweiundvierzig" and "zwei" not in without.text


def test_classify_digits(shipped: ServerThread) -> None:
    images, labels = digits.load_digits_split("test")
    with AttnServeClient(shipped.address) as client:
        results = [client.classify(encode_png(image), top_k=3) for image in images[:30]]
    assert all(len(r) == 3 and r[0].score >= r[1].score >= r[2].score for r in results)
    accuracy = np.mean([int(r[0].label) == y for r, y in zip(results, labels[:30], strict=True)])
    assert accuracy >= 0.9


def test_beam_search_and_seeded_sampling(shipped: ServerThread) -> None:
    with AttnServeClient(shipped.address) as client:
        beam = client.translate(["sixty-four"], to="de", beam_size=4, num_alternatives=2)[0]
        assert beam.text == "vierundsechzig" and len(beam.alternatives) == 2
        first = client.translate(["ninety"], to="es", temperature=1.5, seed=7)[0].token_ids
        again = client.translate(["ninety"], to="es", temperature=1.5, seed=7)[0].token_ids
        assert first == again


def test_alone_equals_batched(shipped: ServerThread) -> None:
    texts = [
        f"{n} thousand, {m} hundred and twelve"
        for n in ("three", "forty", "nine")
        for m in ("two", "seven", "five")
    ]
    languages = ["de", "fr", "es"] * 3
    with AttnServeClient(shipped.address) as client:
        alone = [
            client.translate([t], to=lang)[0].token_ids
            for t, lang in zip(texts, languages, strict=True)
        ]

        def one(index: int) -> list[int]:
            return client.translate([texts[index]], to=languages[index])[0].token_ids

        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            together = list(pool.map(one, range(len(texts))))
    assert together == alone


def test_list_and_get_models(shipped: ServerThread) -> None:
    with AttnServeClient(shipped.address) as client:
        models = {m.name: m for m in client.list_models()}
        assert set(models) == {"captioner", "translator", "vit"}
        info = client.get_model("translator")
        assert info.kind == "seq2seq" and info.batching.in_flight
        assert sorted(info.languages) == ["de", "es", "fr"]
        assert len(client.get_model("vit").labels) == 10
        assert client.health() == "SERVING"


def test_reflection_lists_the_services(shipped: ServerThread) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(shipped.address))
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {
        "attnserve.v1.AttnServe",
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
    } <= names


# --- scheduling, cancellation, metrics (tiny random models) -----------------------------------
def test_concurrent_streams_are_batched(tiny: ServerThread) -> None:
    def stream(i: int) -> int:
        """Tokens of one stream (random weights: the text may be empty)."""
        stub = pb_grpc.AttnServeStub(grpc.insecure_channel(tiny.address))
        request = pb.TranslateStreamRequest(
            text=f"{i} three",
            target_language="de",
            options=pb.DecodingOptions(max_new_tokens=12, min_new_tokens=12),
        )
        return sum(len(m.token_ids) for m in stub.TranslateStream(request, timeout=60))

    before = sample(metrics(tiny), "attnserve_batch_size_count", stage="decoder_step")
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        assert list(pool.map(stream, range(32))) == [12] * 32
    families = metrics(tiny)
    steps = sample(families, "attnserve_batch_size_count", stage="decoder_step") - before
    rows = sample(families, "attnserve_batch_size_sum", stage="decoder_step")
    single = sample(families, "attnserve_batch_size_bucket", stage="decoder_step", le="1.0")
    assert steps > 0 and single < sample(
        families, "attnserve_batch_size_count", stage="decoder_step"
    )
    assert rows / sample(families, "attnserve_batch_size_count", stage="decoder_step") > 1
    assert sample(families, "attnserve_time_to_first_token_seconds_count") >= 32
    assert sample(families, "attnserve_requests_total", method="TranslateStream", code="OK") >= 32


def test_cancelling_a_stream_frees_its_cache(tiny: ServerThread) -> None:
    channel = grpc.insecure_channel(tiny.address)
    stub = pb_grpc.AttnServeStub(channel)
    call = stub.TranslateStream(
        pb.TranslateStreamRequest(
            text="one two three",
            target_language="de",
            options=pb.DecodingOptions(max_new_tokens=30, min_new_tokens=30),
        )
    )
    next(call)
    next(call)
    call.cancel()
    engine = tiny.running.repository.get("translator").engine
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and engine.active_rows:
        time.sleep(0.02)
    assert engine.active_rows == 0 and engine.cache.tokens == 0
    families = metrics(tiny)
    assert sample(families, "attnserve_kv_cache_tokens", model="translator") == 0
    assert sample(families, "attnserve_active_sequences", model="translator") == 0


def test_metrics_histograms_fill(tiny: ServerThread) -> None:
    with AttnServeClient(tiny.address) as client:
        client.translate(["five"], to="fr", max_new_tokens=4)
        client.classify(encode_png(digits.load_digits_split("test")[0][0]))
    families = metrics(tiny)
    for name in (
        "attnserve_request_duration_seconds_count",
        "attnserve_compute_duration_seconds_count",
        "attnserve_queue_duration_seconds_count",
        "attnserve_time_per_output_token_seconds_count",
    ):
        assert sample(families, name) > 0, name
    assert sample(families, "attnserve_batch_size_count", stage="classifier") > 0
    assert sample(families, "attnserve_generated_tokens_total", model="translator") > 0


# --- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        (lambda c: c.translate(["five"], to="de", model="nope"), "NOT_FOUND", "this server has"),
        (lambda c: c.translate(["five"], to="../../etc"), "INVALID_ARGUMENT", "choose one of"),
        (lambda c: c.translate([""], to="de"), "INVALID_ARGUMENT", "text is empty"),
        (lambda c: c.translate([], to="de"), "INVALID_ARGUMENT", "texts is empty"),
        (lambda c: c.translate(["five " * 200], to="de"), "RESOURCE_EXHAUSTED", "at most"),
        (lambda c: c.translate(["five"], to="de", beam_size=99), "INVALID_ARGUMENT", "beam_size"),
        (
            lambda c: c.translate(["five"], to="de", max_new_tokens=10_000),
            "INVALID_ARGUMENT",
            "limit",
        ),
        (lambda c: c.translate(["five"], to="de", top_p=1.5), "INVALID_ARGUMENT", "top_p"),
        (lambda c: c.caption(b"not an image"), "INVALID_ARGUMENT", "image"),
        (lambda c: c.classify(b""), "INVALID_ARGUMENT", "image is empty"),
        (lambda c: c.classify(b"\x89PNG\r\n\x1a\n" + b"0" * 50), "INVALID_ARGUMENT", "image"),
        (
            lambda c: c.translate(["five"], to="de", model="vit"),
            "INVALID_ARGUMENT",
            "classification",
        ),
    ],
)
def test_bad_requests_get_clear_errors(tiny: ServerThread, call, code: str, message: str) -> None:
    with AttnServeClient(tiny.address) as client:
        with pytest.raises(ClientError) as error:
            call(client)
        assert error.value.code.name == code
        assert message in error.value.details
        assert client.translate(["five"], to="de", max_new_tokens=3)[0].token_ids  # still serving


def test_a_bad_request_does_not_disturb_its_batch_mates(tiny: ServerThread) -> None:
    def good(i: int) -> int:
        with AttnServeClient(tiny.address) as client:
            return len(client.translate([f"{i} four"], to="es", max_new_tokens=8)[0].token_ids)

    def bad(i: int) -> str:
        with AttnServeClient(tiny.address) as client:
            try:
                client.translate(["x"], to="de", top_k=-1)
            except ClientError as err:
                return err.code.name
        return "OK"

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        goods = [pool.submit(good, i) for i in range(8)]
        bads = [pool.submit(bad, i) for i in range(8)]
        assert all(f.result() > 0 for f in goods)
        assert {f.result() for f in bads} == {"INVALID_ARGUMENT"}


def test_drain_finishes_in_flight_and_refuses_new(tiny_repository: Path) -> None:
    with ServerThread(tiny_repository, metrics_port=-1) as server:
        channel = grpc.insecure_channel(server.address)
        stub = pb_grpc.AttnServeStub(channel)
        call = stub.TranslateStream(
            pb.TranslateStreamRequest(
                text="six",
                target_language="de",
                options=pb.DecodingOptions(max_new_tokens=25, min_new_tokens=25),
            )
        )
        next(call)
        future = concurrent.futures.ThreadPoolExecutor(1).submit(
            server.call, server.running.stop(5.0)
        )
        time.sleep(0.2)
        rest = list(call)  # the in-flight stream runs to its end
        assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
        future.result(30)
        with pytest.raises(grpc.RpcError) as error:
            stub.Translate(pb.TranslateRequest(texts=["six"], target_language="de"), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


# --- the command line ---------------------------------------------------------------------------
def test_cli_translate_and_classify(shipped: ServerThread, tmp_path: Path, capsys) -> None:
    from attnserve_cli import main

    assert (
        main(["translate", "three hundred and twelve", "--to", "es", "--server", shipped.address])
        == 0
    )
    assert capsys.readouterr().out.strip() == EXPECTED["es"]
    assert (
        main(["translate", "forty-two", "--to", "de", "--stream", "--server", shipped.address]) == 0
    )
    assert capsys.readouterr().out.strip() == "zweiundvierzig"
    # alternatives: each on a line of its own, indented by a tab
    beams = ["--beam-size", "4", "--num-alternatives", "2", "--server", shipped.address]
    assert main(["translate", "forty-two", "seventy", "--to", "de", *beams]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert [line.startswith("\t") for line in lines] == [False, True, True] * 2
    assert lines[0] == "zweiundvierzig" and lines[3] == "siebzig"
    assert len({lines[0], lines[1], lines[2]}) == 3  # runner-ups differ from the best
    image = tmp_path / "digit.png"
    images, labels = digits.load_digits_split("test")
    image.write_bytes(encode_png(images[0]))
    assert main(["classify", str(image), "--top-k", "2", "--server", shipped.address]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].split("\t")[0] == str(labels[0])
    assert main(["translate", "five", "--to", "xx", "--server", shipped.address]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    # a priority on models without levels: accepted and ignored; a negative one: usage error
    assert main(["classify", str(image), "--priority", "1", "--server", shipped.address]) == 0
    assert capsys.readouterr().out.split("\t")[0] == str(labels[0])
    with pytest.raises(SystemExit) as usage:
        main(["classify", str(image), "--priority", "-1", "--server", shipped.address])
    assert usage.value.code == 2 and "--priority" in capsys.readouterr().err


def test_serve_process_drains_on_sigterm(tiny_repository: Path) -> None:
    import re
    import signal
    import subprocess
    import sys

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnserve_cli",
            "serve",
            "--repository",
            str(tiny_repository),
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--grace-period",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        while not line.startswith("attnserve serving"):
            line = process.stdout.readline()
            assert line, "the server exited before serving"
        port = int(re.search(r":(\d+)\s*$", line.strip()).group(1))
        with AttnServeClient(f"127.0.0.1:{port}") as client:
            assert client.health() == "SERVING"
            assert client.translate(["five"], to="de", max_new_tokens=3)[0].token_ids
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "draining" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
