"""Several gRPC frontend processes in front of one engine process (``frontend_workers`` > 1).

- ``supervisor``: the ``attnserve serve`` process: starts, watches and stops the others, serves
  the aggregated /metrics;
- ``processes``: what the engine process and each frontend process run;
- ``engine_server`` / ``remote``: the two ends of the socket between them;
- ``protocol``: the messages on it (msgpack headers, raw array frames; nothing pickled).
"""
