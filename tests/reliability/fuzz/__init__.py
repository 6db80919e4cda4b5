"""Property-based fuzzing of every RPC of a real server (grpc.aio on loopback, ONNX Runtime).

One server for the whole package (the package-scoped ``fuzz`` fixture of conftest.py, the
checker in checker.py, the shared strategies in strategies.py); one file per surface:
test_fuzz_raw_bytes.py (raw protobuf bytes to every method), test_fuzz_attnserve.py
(attnserve.v1 translation and images), test_fuzz_kserve.py (KServe ModelInfer /
ModelStreamInfer), test_fuzz_metadata.py (metadata, readiness and health), test_fuzz_budget.py
(the budget was spent; it runs after the others).

Every case sends one request (or one stream) that hypothesis built: random or mutated protobuf
bytes, wrong KServe datatypes / shapes / byte lengths, broken BYTES length prefixes, corrupt,
truncated or huge images, empty and over-long texts, unknown or path-like model names, absurd
decoding options. Each case asserts:

- the call ends within ``CALL_TIMEOUT`` (no hang);
- its status is in the set allowed for that kind of input (OK when the input happens to be
  valid), never UNKNOWN or INTERNAL;
- an error's details are a human message that says what to fix;
- every ``CHECK_EVERY`` cases, and at the end of each test, good requests still get the answers
  computed once at the start (same tokens, same labels).

Case counts: ``ATTNSERVE_FUZZ_EXAMPLES`` (default 2,400 in CI) is shared among the tests by weight;
``make fuzz`` runs 12,000 with the ``attnserve-fuzz`` profile (random seeds, hypothesis database).
``HYPOTHESIS_PROFILE=attnserve-fuzz`` picks the profile alone. A JSON summary (cases per test,
status codes seen) is written to ``fuzz_summary.json`` in pytest's base temp directory (and to
``$ATTNSERVE_FUZZ_SUMMARY`` when set) and printed (``-s`` shows it).
"""
