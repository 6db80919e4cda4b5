"""A small synchronous client for the attnserve.v1 API.

with AttnServeClient("127.0.0.1:50051") as client:
    client.translate(["three hundred and twelve"], to="de")[0].text   # 'dreihundertzwölf'
    for delta in client.translate_stream("forty-two", to="fr"): print(delta, end="")
    client.caption(Path("scene.png").read_bytes()).text
    client.classify(Path("digit.png").read_bytes())[0].label
    client.score(["ninety"], ["neunzig"], to="de")[0].score             # -0.0013

Against a server with TLS and tokens:
    AttnServeClient("attnserve.example:50051", tls_ca="ca.pem", token=os.environ["ATTNSERVE_TOKEN"])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.proto_gen.attnserve.v1 import attnserve_pb2 as pb
from serving.proto_gen.attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from serving.proto_gen.inference import grpc_service_pb2 as kpb
from serving.proto_gen.inference import grpc_service_pb2_grpc as kpb_grpc
from serving.security import SecurityConfigError, check_token, read_secret_file

FINISH_NAMES = {
    pb.FINISH_REASON_UNSPECIFIED: "",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_STOP_SEQUENCE: "stop_sequence",
}


class ClientError(RuntimeError):
    """A call failed; ``code`` is the gRPC status, the message the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.details = message


@dataclass
class TextResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    score: float = 0.0
    alternatives: tuple[str, ...] = ()
    token_log_probs: tuple[float, ...] = ()  # with return_log_probs=True
    # with top_log_probs=k: per token, its position's k most likely (token id, log-prob)
    top_log_probs: tuple[tuple[tuple[int, float], ...], ...] = ()


@dataclass
class TargetScore:
    """A scored target (``score``): its tokens' log-probabilities after the source, EOS's, and
    their sum."""

    token_ids: list[int]
    token_log_probs: tuple[float, ...]
    eos_log_prob: float
    score: float


@dataclass
class Label:
    label: str
    index: int
    score: float


def _top_log_probs(tops: Any) -> tuple[tuple[tuple[int, float], ...], ...]:
    """``TopLogProbs`` messages as (token id, log-prob) pairs per position."""
    return tuple(tuple(zip(t.token_ids, t.log_probs, strict=True)) for t in tops)


def decoding_options(**options: Any) -> pb.DecodingOptions:
    """DecodingOptions from keyword arguments (max_new_tokens, beam_size, temperature, ...)."""
    return pb.DecodingOptions(**{k: v for k, v in options.items() if v is not None})


def channel_credentials(
    tls_ca: str | Path | None = None,
    tls_client_cert: str | Path | None = None,
    tls_client_key: str | Path | None = None,
) -> grpc.ChannelCredentials:
    """TLS credentials trusting ``tls_ca`` (None: the system roots), with a client certificate
    for mutual TLS when ``tls_client_cert`` and ``tls_client_key`` are given.

    Raises:
        SecurityConfigError: a missing or unreadable file, or only one of cert / key.
    """
    if bool(tls_client_cert) != bool(tls_client_key):
        raise SecurityConfigError(
            "a client certificate needs both tls_client_cert and tls_client_key"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=read_secret_file(tls_ca, "CA certificate (--tls-ca)") if tls_ca else None,
        private_key=read_secret_file(tls_client_key, "client key") if tls_client_key else None,
        certificate_chain=(
            read_secret_file(tls_client_cert, "client certificate") if tls_client_cert else None
        ),
    )


class AttnServeClient:
    """Blocking client; every call takes an optional per-call ``timeout`` in seconds.

    ``tls``: speak TLS (implied by ``tls_ca`` or a client certificate); ``tls_ca``: the PEM root
    certificate(s) to trust (default: the system's); ``token``: sent as
    ``authorization: Bearer <token>`` on every call.
    """

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        timeout: float | None = 30.0,
        *,
        tls: bool = False,
        tls_ca: str | Path | None = None,
        tls_client_cert: str | Path | None = None,
        tls_client_key: str | Path | None = None,
        token: str | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.metadata: tuple[tuple[str, str], ...] = ()
        if token:
            self.metadata = (("authorization", f"Bearer {check_token(token, 'client token')}"),)
        if tls or tls_ca or tls_client_cert or tls_client_key:
            credentials = channel_credentials(tls_ca, tls_client_cert, tls_client_key)
            self.channel = grpc.secure_channel(address, credentials)
        else:
            self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AttnServeStub(self.channel)

    def __enter__(self) -> AttnServeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise ClientError(err.code(), err.details() or "") from err

    def _stream(self, method: Any, request: Any, timeout: float | None) -> Iterator[Any]:
        try:
            yield from method(request, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise ClientError(err.code(), err.details() or "") from err

    def translate(
        self,
        texts: str | list[str],
        to: str,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
        prefix: str | list[str] = "",
        **options: Any,
    ) -> list[TextResult]:
        """Translate one or more English texts into language ``to`` (de, fr, es); ``priority``:
        1 is the highest on a model with priority levels, 0 its default; ``model_version``: a
        served version (empty: the newest); ``prefix``: the text every translation starts with,
        or a list of one per text ("" for none)."""
        texts = [texts] if isinstance(texts, str) else texts
        prefixes = [prefix] * len(texts) if isinstance(prefix, str) else prefix
        request = pb.TranslateRequest(
            texts=texts,
            target_language=to,
            model=model,
            options=decoding_options(**options),
            priority=priority,
            model_version=model_version,
            target_prefixes=prefixes,
        )
        response = self._call(self.stub.Translate, request, timeout)
        return [
            TextResult(
                t.text,
                list(t.token_ids),
                FINISH_NAMES[t.finish_reason],
                t.score,
                tuple(a.text for a in t.alternatives),
                tuple(t.token_log_probs),
                _top_log_probs(t.top_log_probs),
            )
            for t in response.translations
        ]

    def translate_stream(
        self,
        text: str,
        to: str,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
        prefix: str = "",
        **options: Any,
    ) -> Iterator[str]:
        """Text deltas of one translation as the server produces them (the ``prefix``'s
        first)."""
        request = pb.TranslateStreamRequest(
            text=text,
            target_language=to,
            model=model,
            options=decoding_options(**options),
            priority=priority,
            model_version=model_version,
            target_prefix=prefix,
        )
        for message in self._stream(self.stub.TranslateStream, request, timeout):
            if message.delta:
                yield message.delta

    def caption(
        self,
        image: bytes,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
        prefix: str = "",
        **options: Any,
    ) -> TextResult:
        """Caption a PNG / JPEG image (starting with ``prefix``)."""
        request = _caption_request(image, model, priority, options, model_version, prefix)
        r = self._call(self.stub.Caption, request, timeout)
        return TextResult(
            r.text,
            list(r.token_ids),
            FINISH_NAMES[r.finish_reason],
            r.score,
            tuple(a.text for a in r.alternatives),
            tuple(r.token_log_probs),
            _top_log_probs(r.top_log_probs),
        )

    def caption_stream(
        self,
        image: bytes,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
        prefix: str = "",
        **options: Any,
    ) -> Iterator[str]:
        """Text deltas of a caption as the server produces them (the ``prefix``'s first)."""
        request = _caption_request(image, model, priority, options, model_version, prefix)
        for message in self._stream(self.stub.CaptionStream, request, timeout):
            if message.delta:
                yield message.delta

    def score(
        self,
        texts: str | list[str],
        targets: str | list[str],
        to: str,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
    ) -> list[TargetScore]:
        """How likely the translator finds each target as the translation into ``to`` of its
        text (one target per text): each target token's log-probability, EOS's and their sum
        (CTranslate2's ``score_batch``)."""
        request = pb.ScoreRequest(
            texts=[texts] if isinstance(texts, str) else texts,
            targets=[targets] if isinstance(targets, str) else targets,
            target_language=to,
            model=model,
            priority=priority,
            model_version=model_version,
        )
        return self._scores(request, timeout)

    def score_captions(
        self,
        images: list[bytes],
        targets: list[str],
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
    ) -> list[TargetScore]:
        """How likely the captioner finds each target as the caption of its PNG / JPEG image."""
        request = pb.ScoreRequest(
            images=images,
            targets=targets,
            model=model,
            priority=priority,
            model_version=model_version,
        )
        return self._scores(request, timeout)

    def _scores(self, request: pb.ScoreRequest, timeout: float | None) -> list[TargetScore]:
        response = self._call(self.stub.Score, request, timeout)
        return [
            TargetScore(list(s.token_ids), tuple(s.token_log_probs), s.eos_log_prob, s.score)
            for s in response.scores
        ]

    def classify(
        self,
        image: bytes,
        top_k: int = 5,
        model: str = "",
        timeout: float | None = None,
        priority: int = 0,
        model_version: str = "",
    ) -> list[Label]:
        """Top-k labels of a PNG / JPEG image, most likely first."""
        request = pb.ClassifyRequest(
            image=image, top_k=top_k, model=model, priority=priority, model_version=model_version
        )
        response = self._call(self.stub.Classify, request, timeout)
        return [Label(s.label, s.index, s.score) for s in response.labels]

    def list_models(self) -> list[pb.ModelInfo]:
        return list(self._call(self.stub.ListModels, pb.ListModelsRequest(), None).models)

    def get_model(self, name: str) -> pb.ModelInfo:
        return self._call(self.stub.GetModel, pb.GetModelRequest(name=name), None)

    def statistics(self, model: str = "") -> list[Any]:
        """KServe ModelStatistics of ``model``, or of every model (Triton's statistics)."""
        stub = kpb_grpc.GRPCInferenceServiceStub(self.channel)
        request = kpb.ModelStatisticsRequest(name=model)
        return list(self._call(stub.ModelStatistics, request, None).model_stats)

    def repository_index(self) -> list[Any]:
        """KServe RepositoryIndex: every entry of the server's repository and its state."""
        stub = kpb_grpc.GRPCInferenceServiceStub(self.channel)
        return list(self._call(stub.RepositoryIndex, kpb.RepositoryIndexRequest(), None).models)

    def trace_settings(
        self, model: str = "", changes: dict[str, list[str]] | None = None
    ) -> dict[str, list[str]]:
        """KServe TraceSetting: the server's request trace settings (``model``'s where given),
        after ``changes`` (a setting's values; [] clears a model's own)."""
        stub = kpb_grpc.GRPCInferenceServiceStub(self.channel)
        request = kpb.TraceSettingRequest(model_name=model)
        for name, values in (changes or {}).items():
            request.settings[name].value.extend(values)
        reply = self._call(stub.TraceSetting, request, None)
        return {name: list(value.value) for name, value in sorted(reply.settings.items())}

    def load_model(self, name: str) -> None:
        """KServe RepositoryModelLoad: load or reload ``name`` (model control on the server)."""
        stub = kpb_grpc.GRPCInferenceServiceStub(self.channel)
        self._call(stub.RepositoryModelLoad, kpb.RepositoryModelLoadRequest(model_name=name), None)

    def unload_model(self, name: str) -> None:
        """KServe RepositoryModelUnload: stop serving ``name`` (model control on the server)."""
        stub = kpb_grpc.GRPCInferenceServiceStub(self.channel)
        request = kpb.RepositoryModelUnloadRequest(model_name=name)
        self._call(stub.RepositoryModelUnload, request, None)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 status name: SERVING, NOT_SERVING, ..."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        response = self._call(stub.Check, health_pb2.HealthCheckRequest(service=service), None)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def _caption_request(
    image: bytes,
    model: str,
    priority: int,
    options: dict[str, Any],
    model_version: str,
    prefix: str,
) -> pb.CaptionRequest:
    return pb.CaptionRequest(
        image=image,
        model=model,
        options=decoding_options(**options),
        priority=priority,
        model_version=model_version,
        prefix=prefix,
    )
