"""Every Prometheus metric of the server, declared once, here.

Each ``ServingMetrics`` owns its own ``CollectorRegistry`` so several servers in one process (tests)
do not collide, and serves it on its own HTTP port. Base units (seconds), prefix ``attnserve_``,
histograms for latencies.

=======================================  =========  ===================  ==========================
Metric                                   Type       Labels               Meaning
=======================================  =========  ===================  ==========================
attnserve_requests_total                 counter    model, method, code  finished RPCs; code is the
                                                                         gRPC status name ("OK")
attnserve_request_duration_seconds       histogram  model, method        RPC latency, end to end
attnserve_request_seconds_total          counter    model, method, code  RPC latency summed by
                                                                         status code
attnserve_last_request_timestamp_seconds gauge      model                when the last inference
                                                                         RPC ended (Unix time)
attnserve_queue_duration_seconds         histogram  model                wait in a batcher's queue
attnserve_compute_duration_seconds       histogram  model, stage         one batched call; stage:
                                                                         encoder, decoder_step,
                                                                         classifier
attnserve_batch_size                     histogram  model, stage         requests / sequences per
                                                                         batched call
attnserve_request_compute_seconds_total  counter    model, stage        compute per request: a
                                                                         batched call once per item
                                                                         in it (classifier), or
                                                                         admission to end
                                                                         (generation)
attnserve_time_to_first_token_seconds    histogram  model                arrival to first token
attnserve_time_per_output_token_seconds  histogram  model                mean gap between later
                                                                         tokens of a sequence
attnserve_generated_tokens_total         counter    model                tokens generated
attnserve_active_sequences               gauge      model                sequences decoding now
attnserve_kv_cache_usage_ratio           gauge      model                KV-cache in use, 0..1
attnserve_kv_cache_tokens                gauge      model                tokens in the KV-cache
attnserve_queue_depth                    gauge      model                requests queued now
attnserve_response_cache_total           counter    model, result        KServe ModelInfer lookups
                                                                         in the response cache;
                                                                         result: hit, miss
attnserve_response_cache_seconds_total   counter    model, result        their time summed (a
                                                                         hit's answer, a miss's
                                                                         insertion)
attnserve_response_cache_bytes           gauge                           bytes the cache holds
attnserve_response_cache_entries         gauge                           responses it holds
=======================================  =========  ===================  ==========================

The KServe ``ModelStatistics`` RPC (Triton's statistics) is computed from these same series
(``serving.kserve.statistics``), so it adds up over the processes as /metrics does.

Histograms are exposed as ``<name>_bucket`` / ``_sum`` / ``_count``; counters as ``<name>``
(ending in ``_total``) plus prometheus-client's ``<name without _total>_created``.

Every series with a ``model`` label has a ``version`` label too (Triton's ``model`` /
``version``): the served version that answered or ran it, one series per version where an
entry serves several (``version_policy``); "" for RPCs of no model (``model="unknown"``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)

# Sub-millisecond (a cached classifier call) to 30 s (a long generation) in ~1-2.5-5 steps.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
_STOP_POLL_S = 0.05  # how often the HTTP thread checks for stop(); the default 0.5 s slows tests

REQUESTS = "attnserve_requests_total"
REQUEST_DURATION = "attnserve_request_duration_seconds"
REQUEST_SECONDS = "attnserve_request_seconds_total"
LAST_REQUEST = "attnserve_last_request_timestamp_seconds"
REQUEST_COMPUTE = "attnserve_request_compute_seconds_total"
QUEUE_DURATION = "attnserve_queue_duration_seconds"
COMPUTE_DURATION = "attnserve_compute_duration_seconds"
BATCH_SIZE = "attnserve_batch_size"
TIME_TO_FIRST_TOKEN = "attnserve_time_to_first_token_seconds"
TIME_PER_OUTPUT_TOKEN = "attnserve_time_per_output_token_seconds"
GENERATED_TOKENS = "attnserve_generated_tokens_total"
ACTIVE_SEQUENCES = "attnserve_active_sequences"
KV_CACHE_USAGE = "attnserve_kv_cache_usage_ratio"
KV_CACHE_TOKENS = "attnserve_kv_cache_tokens"
QUEUE_DEPTH = "attnserve_queue_depth"
FRONTEND_LARGE_ARRAYS = "attnserve_frontend_large_arrays_total"
RESPONSE_CACHE = "attnserve_response_cache_total"
RESPONSE_CACHE_SECONDS = "attnserve_response_cache_seconds_total"
RESPONSE_CACHE_BYTES = "attnserve_response_cache_bytes"
RESPONSE_CACHE_ENTRIES = "attnserve_response_cache_entries"

# The RPC methods (the ``method`` label) that are inference requests: what Triton's statistics
# count as requests, and what sets ``attnserve_last_request_timestamp_seconds``.
INFERENCE_METHODS = frozenset(
    {
        "Translate",
        "TranslateStream",
        "Caption",
        "CaptionStream",
        "Classify",
        "Score",
        "ModelInfer",
        "ModelStreamInfer",
    }
)

# Every metric name as declared (and as dashboards query it, before any _bucket/_sum/_count).
METRIC_NAMES: tuple[str, ...] = (
    REQUESTS,
    REQUEST_DURATION,
    REQUEST_SECONDS,
    LAST_REQUEST,
    QUEUE_DURATION,
    COMPUTE_DURATION,
    BATCH_SIZE,
    REQUEST_COMPUTE,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    GENERATED_TOKENS,
    ACTIVE_SEQUENCES,
    KV_CACHE_USAGE,
    KV_CACHE_TOKENS,
    QUEUE_DEPTH,
    RESPONSE_CACHE,
    RESPONSE_CACHE_SECONDS,
    RESPONSE_CACHE_BYTES,
    RESPONSE_CACHE_ENTRIES,
)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape, so a slow scraper never blocks another."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class MetricsServer:
    """A running /metrics HTTP endpoint; ``stop()`` closes it and frees the port."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        """Stop serving, close the socket and wait for the serving thread."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class ServingMetrics:
    """The server's metrics in one registry of their own.

    Attributes (all labelled; call ``.labels(...)`` first):
        requests, request_latency, request_seconds, last_request, queue_time, compute_time,
        batch_size, request_compute, time_to_first_token, time_per_output_token,
        generated_tokens, active_sequences, kv_cache_usage, kv_cache_tokens, queue_depth: see
        the module docstring for names and labels.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, aggregate_from: str | None = None
    ) -> None:
        """Declare every metric in ``registry``.

        Args:
            registry: where to register; a fresh ``CollectorRegistry`` by default. Passing
                prometheus_client's global ``REGISTRY`` works once per process only.
            aggregate_from: in a process of a multi-process server, the folder every process
                writes its values to (``PROMETHEUS_MULTIPROC_DIR``): ``aggregated`` then adds
                them up, as the server's /metrics does.
        """
        self.registry = registry if registry is not None else CollectorRegistry()
        self._aggregate_from = aggregate_from
        self._aggregated: CollectorRegistry | None = None
        self._declare_request_metrics(self.registry)
        self._declare_generation_metrics(self.registry)

    def _declare_request_metrics(self, reg: CollectorRegistry) -> None:
        """RPCs, queues, batched calls: what every model kind reports."""
        latency = LATENCY_BUCKETS
        self.requests = Counter(
            REQUESTS,
            "Finished RPCs by gRPC status code.",
            ["model", "version", "method", "code"],
            registry=reg,
        )
        self.request_latency = Histogram(
            REQUEST_DURATION,
            "RPC latency, end to end.",
            ["model", "version", "method"],
            buckets=latency,
            registry=reg,
        )
        self.request_seconds = Counter(
            REQUEST_SECONDS,
            "RPC latency summed by gRPC status code (over attnserve_requests_total: the mean).",
            ["model", "version", "method", "code"],
            registry=reg,
        )
        self.last_request = Gauge(
            LAST_REQUEST,
            "When the model's last inference RPC ended, Unix time.",
            ["model", "version"],
            registry=reg,
            multiprocess_mode="max",
        )
        self.queue_time = Histogram(
            QUEUE_DURATION,
            "Time requests waited in a queue.",
            ["model", "version"],
            buckets=latency,
            registry=reg,
        )
        self.compute_time = Histogram(
            COMPUTE_DURATION,
            "Duration of one batched call of a stage.",
            ["model", "version", "stage"],
            buckets=latency,
            registry=reg,
        )
        self.batch_size = Histogram(
            BATCH_SIZE,
            "Requests or sequences per batched call.",
            ["model", "version", "stage"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        self.request_compute = Counter(
            REQUEST_COMPUTE,
            "Compute per request: a batched call once per item in it, or a generated request "
            "from admission to end.",
            ["model", "version", "stage"],
            registry=reg,
        )
        self.queue_depth = Gauge(
            QUEUE_DEPTH,
            "Requests queued now.",
            ["model", "version"],
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.response_cache = Counter(
            RESPONSE_CACHE,
            "Response cache lookups by result: hit, miss.",
            ["model", "version", "result"],
            registry=reg,
        )
        self.response_cache_seconds = Counter(
            RESPONSE_CACHE_SECONDS,
            "Response cache lookups' time summed: a hit's answer, a miss's insertion.",
            ["model", "version", "result"],
            registry=reg,
        )
        self.response_cache_bytes = Gauge(
            RESPONSE_CACHE_BYTES,
            "Bytes the response cache holds.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.response_cache_entries = Gauge(
            RESPONSE_CACHE_ENTRIES,
            "Responses the response cache holds.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.frontend_large_arrays = Counter(
            FRONTEND_LARGE_ARRAYS,
            "Arrays of 16 KB and more (images) frontend processes handed the engine process, by "
            "path: shared_memory, or socket (the frontend's arena full, or off).",
            ["path"],
            registry=reg,
        )

    def _declare_generation_metrics(self, reg: CollectorRegistry) -> None:
        """Tokens, sequences and the KV cache of the generating models."""
        latency = LATENCY_BUCKETS
        self.time_to_first_token = Histogram(
            TIME_TO_FIRST_TOKEN,
            "Arrival to first generated token.",
            ["model", "version"],
            buckets=latency,
            registry=reg,
        )
        self.time_per_output_token = Histogram(
            TIME_PER_OUTPUT_TOKEN,
            "Mean time between generated tokens after the first.",
            ["model", "version"],
            buckets=latency,
            registry=reg,
        )
        self.generated_tokens = Counter(
            GENERATED_TOKENS, "Generated tokens.", ["model", "version"], registry=reg
        )
        self.active_sequences = Gauge(
            ACTIVE_SEQUENCES,
            "Sequences decoding now.",
            ["model", "version"],
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.kv_cache_usage = Gauge(
            KV_CACHE_USAGE,
            "Fraction of the KV-cache in use (0..1).",
            ["model", "version"],
            registry=reg,
            multiprocess_mode="livemax",
        )
        self.kv_cache_tokens = Gauge(
            KV_CACHE_TOKENS,
            "Tokens held in the KV-cache.",
            ["model", "version"],
            registry=reg,
            multiprocess_mode="livesum",
        )

    def aggregated(self) -> CollectorRegistry:
        """The server's metrics as its /metrics serves them: this registry, or every process's
        values added up (``aggregate_from``)."""
        if self._aggregate_from is None:
            return self.registry
        if self._aggregated is None:
            self._aggregated = multiprocess_registry(self._aggregate_from)
        return self._aggregated

    def render(self) -> bytes:
        """The registry in Prometheus text format (what /metrics returns)."""
        return generate_latest(self.registry)

    def start_http_server(self, port: int, addr: str = "127.0.0.1") -> tuple[MetricsServer, int]:
        """Serve this registry at ``http://addr:port/metrics`` from a daemon thread.

        Args:
            port: TCP port; 0 picks a free one.
            addr: interface to bind; loopback by default, "0.0.0.0" for scrapers elsewhere.

        Returns:
            The running server (call ``.stop()`` to close it) and the port actually bound.

        Raises:
            OSError: when the port is taken or the address cannot be bound.
        """
        return start_metrics_http_server(self.registry, port, addr)


def start_metrics_http_server(
    registry: CollectorRegistry, port: int, addr: str = "127.0.0.1"
) -> tuple[MetricsServer, int]:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread.

    Returns:
        The running server (call ``.stop()`` to close it) and the port actually bound.

    Raises:
        OSError: when the port is taken or the address cannot be bound.
    """
    httpd = make_server(
        addr,
        port,
        make_wsgi_app(registry),
        server_class=_ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(
        target=httpd.serve_forever,
        kwargs={"poll_interval": _STOP_POLL_S},
        name=f"metrics-http-{port}",
        daemon=True,
    )
    thread.start()
    server = MetricsServer(httpd, thread)
    return server, server.port


def multiprocess_registry(directory: str) -> CollectorRegistry:
    """A registry that adds up the metrics every process wrote under ``directory``
    (prometheus-client's multiprocess mode: each process sets ``PROMETHEUS_MULTIPROC_DIR`` to it
    before importing prometheus_client). A file that cannot be read is left out of a scrape
    rather than failing it (``TolerantCollector``)."""
    from serving.multiprocess.metric_files import TolerantCollector

    registry = CollectorRegistry()
    TolerantCollector(registry, path=directory)
    return registry


def observe_many(child: Any, amount: float, count: int) -> None:
    """``count`` observations of ``amount`` in a histogram child, at the cost of one.

    The decode loop observes the time per output token for every row of every step, and the
    rows that also had a token in the previous step all observe the same value; prometheus_client
    has no call for n equal observations, so this adds ``count`` to the bucket and ``amount *
    count`` to the sum as ``Histogram.observe`` adds 1 and ``amount`` (through the same value
    objects, so multiprocess mode and the exposition are unchanged). A histogram without those
    attributes (another prometheus_client) gets ``count`` plain observations.
    """
    try:
        total, buckets, bounds = child._sum, child._buckets, child._upper_bounds
    except AttributeError:
        for _ in range(count):
            child.observe(amount)
        return
    total.inc(amount * count)
    for bucket, bound in zip(buckets, bounds, strict=True):
        if amount <= bound:
            bucket.inc(count)
            return
