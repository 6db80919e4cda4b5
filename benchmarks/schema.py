"""JSON schemas of the benchmark results, and a validator.

``validate(document)`` picks the schema named by ``document["schema"]``. It uses ``jsonschema``
when that package is installed, otherwise a small structural checker that understands the subset
of JSON Schema written here (type, required, properties, items, enum, minimum, minItems).
"""

from __future__ import annotations

import importlib.util
from typing import Any

ENGINE_SCHEMA_ID = "attnserve.bench.engine/1"
SERVE_SCHEMA_ID = "attnserve.bench.serve/1"


class BenchError(RuntimeError):
    """A benchmark cannot run or its output is unusable; the message says why."""


class ResultSchemaError(BenchError):
    """A result document does not match its schema; the message names the field."""


NUMBER = {"type": "number"}
OPT_NUMBER = {"type": ["number", "null"]}
OPT_STRING = {"type": ["string", "null"]}
OPT_NUMBERS = {"type": ["array", "null"], "items": NUMBER}
STRING = {"type": "string"}
INTEGER = {"type": "integer"}

MACHINE = {
    "type": "object",
    "required": ["cpu_model", "logical_cpus", "versions", "device", "date"],
    "properties": {
        "cpu_model": STRING,
        "logical_cpus": INTEGER,
        "versions": {"type": "object"},
        "device": {"type": "string", "enum": ["cpu", "cuda"]},
        "date": STRING,
    },
}

GOAL = {
    "type": "object",
    "required": ["name", "goal", "measured", "passed"],
    "properties": {
        "name": STRING,
        "goal": STRING,
        "measured": OPT_NUMBER,
        "target": OPT_NUMBER,
        "passed": {"type": ["boolean", "null"]},
        "gap": OPT_NUMBER,
    },
}

ENGINE_ROW = {
    "type": "object",
    "required": [
        "engine",
        "family",
        "precision",
        "batch",
        "runs_s",
        "median_s",
        "tokens_per_s",
        "ms_per_step",
        "gflops",
        "fraction_of_peak",
        "ratio_to_ctranslate2",
        "ratio_to_hf",
    ],
    "properties": {
        "engine": STRING,
        "family": {"type": "string", "enum": ["attnserve", "ctranslate2", "hf"]},
        "precision": {"type": "string", "enum": ["fp32", "fp16", "int8"]},
        "batch": {"type": "integer", "minimum": 1},
        "runs_s": {"type": "array", "items": NUMBER},
        "median_s": OPT_NUMBER,
        "tokens_per_s": OPT_NUMBER,
        "ms_per_step": OPT_NUMBER,
        "gflops": OPT_NUMBER,
        "fraction_of_peak": OPT_NUMBER,
        "ratio_to_ctranslate2": OPT_NUMBER,
        "ratio_to_hf": OPT_NUMBER,
        "ratio_to_ctranslate2_rounds": OPT_NUMBERS,
        "ratio_to_ctranslate2_range": OPT_NUMBERS,
        "ratio_to_hf_rounds": OPT_NUMBERS,
        "ratio_to_hf_range": OPT_NUMBERS,
        "agreement_with_hf": NUMBER,
        "error": OPT_STRING,
    },
}

ENGINE_SCHEMA: dict[str, Any] = {
    "$id": ENGINE_SCHEMA_ID,
    "type": "object",
    "required": [
        "schema",
        "kind",
        "run_id",
        "machine",
        "settings",
        "model",
        "roofline",
        "engines",
        "skipped",
        "results",
        "summary",
    ],
    "properties": {
        "schema": {"type": "string", "enum": [ENGINE_SCHEMA_ID]},
        "kind": {"type": "string", "enum": ["engine"]},
        "run_id": STRING,
        "machine": MACHINE,
        "settings": {
            "type": "object",
            "required": ["source_length", "new_tokens", "batches", "repetitions", "threads"],
            "properties": {
                "source_length": INTEGER,
                "new_tokens": INTEGER,
                "batches": {"type": "array", "items": INTEGER, "minItems": 1},
                "repetitions": {"type": "integer", "minimum": 1},
                "threads": {"type": "integer", "minimum": 1},
                "tiny": {"type": "boolean"},
            },
        },
        "model": {
            "type": "object",
            "required": ["shape", "flops_per_sequence"],
            "properties": {"shape": {"type": "object"}, "flops_per_sequence": NUMBER},
        },
        "roofline": {
            "type": "object",
            "required": ["matmul_peak_gflops"],
            "properties": {"matmul_peak_gflops": NUMBER},
        },
        "engines": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "family", "precision", "label", "config"],
                "properties": {"name": STRING, "label": STRING, "config": {"type": "object"}},
            },
        },
        "skipped": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["engine", "reason"],
                "properties": {"engine": STRING, "reason": STRING},
            },
        },
        "results": {"type": "array", "minItems": 1, "items": ENGINE_ROW},
        "summary": {"type": "object", "required": ["by_batch"]},
        "goals": {"type": "array", "items": GOAL},
    },
}

LATENCY = {
    "type": "object",
    "required": ["p50", "p90", "p99", "mean"],
    "properties": {"p50": OPT_NUMBER, "p90": OPT_NUMBER, "p99": OPT_NUMBER, "mean": OPT_NUMBER},
}

SERVE_POINT = {
    "type": "object",
    "required": [
        "model",
        "variant",
        "method",
        "loop",
        "concurrency",
        "rate",
        "requests",
        "errors",
        "duration_s",
        "throughput_rps",
        "latency_ms",
    ],
    "properties": {
        "model": STRING,
        "variant": STRING,
        "method": {
            "type": "string",
            "enum": ["translate", "translate_stream", "classify", "kserve_infer"],
        },
        "server": {"type": "string", "enum": ["attnserve", "triton"]},
        "loop": {"type": "string", "enum": ["closed", "open"]},
        "concurrency": {"type": ["integer", "null"]},
        "rate": OPT_NUMBER,
        "requests": {"type": "integer", "minimum": 0},
        "errors": {"type": "integer", "minimum": 0},
        "error_codes": {"type": "object"},
        "duration_s": NUMBER,
        "throughput_rps": NUMBER,
        "tokens_per_s": OPT_NUMBER,
        "latency_ms": LATENCY,
        "ttft_ms": LATENCY,
        "tpot_ms": LATENCY,
        "client_processes": {"type": "integer", "minimum": 1},
        "server_side": {
            "type": ["object", "null"],
            "required": ["requests", "latency_ms", "queue_ms", "compute_ms"],
            "properties": {
                "requests": {"type": "integer", "minimum": 1},
                "latency_ms": OPT_NUMBER,
                "queue_ms": OPT_NUMBER,
                "compute_ms": OPT_NUMBER,
                "inferences_per_execution": OPT_NUMBER,
            },
        },
    },
}

PERF_RUN = {
    "type": "object",
    "required": ["server", "model", "concurrency", "flags", "errors"],
    "properties": {
        "server": {"type": "string", "enum": ["attnserve", "triton"]},
        "model": STRING,
        "concurrency": {"type": "integer", "minimum": 1},
        "flags": {"type": "array", "items": STRING},
        "errors": {"type": "integer", "minimum": 0},
        "error": OPT_STRING,
        "throughput_rps": NUMBER,
        "latency_ms": LATENCY,
        "loadgen_rps_around": {"type": "array", "items": NUMBER},
    },
}

# Optional sections (results written before they existed lack them): a peer or tool that could
# not run is recorded with its status and the reason.
PERF_ANALYZER_SECTION = {
    "type": "object",
    "required": ["status", "version", "runs"],
    "properties": {
        "status": {"type": "string", "enum": ["measured", "skipped", "not requested"]},
        "reason": OPT_STRING,
        "version": STRING,
        "runs": {"type": "array", "items": PERF_RUN},
    },
}

TRITON_SECTION = {
    "type": "object",
    "required": ["status", "server"],
    "properties": {
        "status": {"type": "string", "enum": ["measured", "skipped", "not run"]},
        "reason": OPT_STRING,
        "server": {"type": "object"},
    },
}

SERVE_SCHEMA: dict[str, Any] = {
    "$id": SERVE_SCHEMA_ID,
    "type": "object",
    "required": [
        "schema",
        "kind",
        "run_id",
        "machine",
        "settings",
        "variants",
        "offline",
        "points",
        "goals",
    ],
    "properties": {
        "schema": {"type": "string", "enum": [SERVE_SCHEMA_ID]},
        "kind": {"type": "string", "enum": ["serve"]},
        "run_id": STRING,
        "machine": MACHINE,
        "settings": {
            "type": "object",
            "required": ["concurrency", "duration_s", "new_tokens"],
            "properties": {
                "concurrency": {"type": "array", "items": INTEGER, "minItems": 1},
                "duration_s": NUMBER,
                "new_tokens": INTEGER,
                "tiny": {"type": "boolean"},
            },
        },
        "variants": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "model", "batching"],
                "properties": {"name": STRING, "model": STRING, "batching": {"type": "object"}},
            },
        },
        "offline": {"type": "object"},
        "points": {"type": "array", "minItems": 1, "items": SERVE_POINT},
        "perf_analyzer": PERF_ANALYZER_SECTION,
        "triton": TRITON_SECTION,
        "goals": {"type": "array", "items": GOAL},
    },
}

SCHEMAS = {ENGINE_SCHEMA_ID: ENGINE_SCHEMA, SERVE_SCHEMA_ID: SERVE_SCHEMA}


def schema_for(document: Any) -> dict[str, Any]:
    """The schema named by ``document["schema"]``.

    Raises:
        ResultSchemaError: no or an unknown schema id.
    """
    if not isinstance(document, dict):
        raise ResultSchemaError("a benchmark result must be a JSON object")
    name = document.get("schema")
    if name not in SCHEMAS:
        raise ResultSchemaError(
            f"unknown or missing 'schema' field {name!r}; expected one of {sorted(SCHEMAS)}"
        )
    return SCHEMAS[name]


def validate(document: Any) -> None:
    """Check a result document against its schema.

    Raises:
        ResultSchemaError: naming the first offending field (its JSON path).
    """
    schema = schema_for(document)
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        try:
            jsonschema.validate(document, schema)
        except jsonschema.ValidationError as err:
            where = "/".join(str(p) for p in err.absolute_path) or "(root)"
            raise ResultSchemaError(f"{schema['$id']}: {where}: {err.message}") from None
        return
    _check(document, schema, "$", schema["$id"])


_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, name: str) -> bool:
    if name in ("number", "integer") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: dict[str, Any], path: str, schema_id: str) -> None:
    def fail(message: str) -> None:
        raise ResultSchemaError(f"{schema_id}: {path}: {message}")

    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_is(value, n) for n in names):
            fail(f"{value!r:.60} is not of type {' or '.join(names)}")
    if "enum" in schema and value not in schema["enum"]:
        fail(f"{value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        fail(f"{value} is less than the minimum {schema['minimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                fail(f"'{key}' is a required property")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                _check(value[key], sub, f"{path}.{key}", schema_id)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            fail(f"expected at least {schema['minItems']} items, got {len(value)}")
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                _check(item, items, f"{path}[{i}]", schema_id)
