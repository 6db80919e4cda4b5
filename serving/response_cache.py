"""Triton's response cache for KServe ``ModelInfer``: a request the server has answered before is
answered again from memory, without running the model.

- On where the server has a cache (``response_cache_bytes`` in server.yaml, or Triton's flag
  ``--cache-config local,size=BYTES``) and the model asks for it (``response_cache: true`` in
  its config.yaml, Triton's ``response_cache { enable: true }``).
- The key is a BLAKE2b digest of the request as the model sees it: the model and its served
  version, the inputs (names, datatypes, shapes, contents), the requested outputs and the
  parameters, but not the request ``id`` nor how the request is scheduled (``priority``,
  ``timeout``); and the loaded model: a reload (model control, polling) starts afresh, as its
  files may differ under the same version. The value is the serialized response (its ``id``
  set again on every hit).
- Not cached: a request whose inputs or outputs are in shared memory (the region's contents
  can change under the same request), and a generation that samples without a ``seed`` (its
  answer is meant to differ). A request that fails is not cached.
- Least recently used entries go first once the entries' bytes would pass the capacity; a
  response larger than the whole cache is not kept. Each frontend process has its own cache of
  that size (``--frontend-workers``).
- ``ModelStatistics`` counts hits and misses with the time each took (``cache_hit``,
  ``cache_miss``: a hit's lookup and answer, a miss's lookup and insertion, as Triton's do); a
  hit also counts as a successful request, and not as an inference or an execution.
"""

from __future__ import annotations

import hashlib
import itertools
import time
import weakref
from collections import OrderedDict
from typing import Any

from serving.errors import InvalidArgument
from serving.kserve.execute import infer
from serving.kserve.parameters import decoding_options
from serving.kserve.request import Call
from serving.kserve.shared_memory import REGION
from serving.metrics import ServingMetrics
from serving.proto_gen.inference import grpc_service_pb2 as pb
from serving.served import ServedGenerator, ServedModel

# request parameters that change how a request is scheduled, not what it computes
SCHEDULING_PARAMETERS = ("priority", "timeout")
# what an entry costs besides its key's and response's bytes: the ordered dict's slot and links
# (75 bytes an entry under tracemalloc, 20,000 entries, CPython 3.11) and the two bytes
# objects' headers (33 each): about 140; rounded up
ENTRY_OVERHEAD = 256


class ResponseCache:
    """Serialized responses by key, least recently used evicted first, at most ``capacity``
    bytes (``ENTRY_OVERHEAD`` counted for each entry); one event loop uses it (no lock).
    ``metrics``: where its size and lookups are recorded (None: nowhere)."""

    def __init__(self, capacity: int, metrics: ServingMetrics | None = None) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._metrics = metrics
        # (model, result) -> the lookup counter's child and the seconds counter's child
        self._recorders: dict[tuple[str, int, str], tuple[Any, Any]] = {}
        # a number per loaded model, in its keys: a reload's model gets a new one, so no
        # answer of the model it replaced (same name and version, other files) is served
        self._loads: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next_load = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def load_number(self, model: Any) -> int:
        """The number of this loaded model (the same for the model's life)."""
        number = self._loads.get(model)
        if number is None:
            number = self._loads[model] = next(self._next_load)
        return number

    def get(self, key: bytes) -> bytes | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: bytes) -> bool:
        """Keep ``value`` under ``key`` (evicting the least recently used entries as needed);
        False where it is larger than the whole cache."""
        size = _cost(key, value)
        if size > self.capacity:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= _cost(key, old)
        self._entries[key] = value
        self.used += size
        while self.used > self.capacity:
            gone, evicted = self._entries.popitem(last=False)
            self.used -= _cost(gone, evicted)
        if self._metrics is not None:
            self._metrics.response_cache_bytes.set(self.used)
            self._metrics.response_cache_entries.set(len(self._entries))
        return True

    def record(self, model: ServedModel, result: str, seconds: float) -> None:
        """One lookup of ``model``'s that ended ``result`` ("hit" / "miss"), and its time."""
        if self._metrics is None:
            return
        key = (model.name, model.version, result)
        recorders = self._recorders.get(key)
        if recorders is None:
            m = self._metrics
            labels = {"model": model.name, "version": str(model.version), "result": result}
            recorders = self._recorders[key] = (
                m.response_cache.labels(**labels),
                m.response_cache_seconds.labels(**labels),
            )
        count, total = recorders
        count.inc()
        total.inc(seconds)


async def answer(cache: ResponseCache, call: Call) -> pb.ModelInferResponse:
    """``call``'s response: from ``cache`` where it holds it, else run (and kept where the
    request may be cached)."""
    started = time.perf_counter()
    key = cache_key(call, cache.load_number(call.model))
    if key is None:
        return await infer(call)
    held = cache.get(key)
    if held is not None:
        response = pb.ModelInferResponse.FromString(held)
        response.id = call.request.id
        cache.record(call.model, "hit", time.perf_counter() - started)
        return response
    looked = time.perf_counter() - started
    response = await infer(call)
    inserting = time.perf_counter()
    request_id, response.id = response.id, ""
    cache.put(key, response.SerializeToString())
    response.id = request_id
    cache.record(call.model, "miss", looked + time.perf_counter() - inserting)
    return response


def _cost(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD


def cache_key(call: Call, load: int = 0) -> bytes | None:
    """The key of a checked request to the loaded model numbered ``load``, or None where it
    must not be cached (shared memory, or a generation sampled without a seed)."""
    request = call.request
    if any(wanted.shared is not None for wanted in call.wanted):
        return None
    if any(REGION in tensor.parameters for tensor in request.inputs):
        return None
    if isinstance(call.model, ServedGenerator):
        options = decoding_options(request.parameters)
        if options.sampling and options.seed is None:
            return None
    canonical = pb.ModelInferRequest()
    canonical.CopyFrom(request)
    canonical.id = ""
    canonical.model_version = str(call.model.version)
    for name in SCHEDULING_PARAMETERS:
        if name in canonical.parameters:
            del canonical.parameters[name]
    digest = hashlib.blake2b(canonical.SerializeToString(deterministic=True))
    digest.update(load.to_bytes(8, "little"))
    return digest.digest()


def parse_cache_config(text: str) -> int:
    """Triton's ``--cache-config`` value ``local,size=BYTES``: the cache's size in bytes.

    Raises:
        InvalidArgument: another cache, another setting, or a size that is not a whole number
            of bytes >= 0; the message says what to write.
    """
    cache, _, settings = text.partition(",")
    if cache.strip() != "local":
        raise InvalidArgument(
            f"cache {cache.strip()[:40]!r} is not available: attnserve has the 'local' response "
            "cache; use --cache-config local,size=BYTES"
        )
    size = None
    for setting in filter(None, (part.strip() for part in settings.split(","))):
        key, equals, value = setting.partition("=")
        if key.strip() != "size" or not equals:
            raise InvalidArgument(
                f"cache setting {setting[:40]!r} is not known: the local cache takes size=BYTES "
                "only; use --cache-config local,size=BYTES"
            )
        try:
            size = int(value.strip())
        except ValueError:
            size = -1
        if size < 0:
            raise InvalidArgument(
                f"cache size {value.strip()[:40]!r} is not a number of bytes: use a whole "
                "number >= 0, e.g. --cache-config local,size=104857600"
            )
    if size is None:
        raise InvalidArgument("the local cache needs its size: use --cache-config local,size=BYTES")
    return size
