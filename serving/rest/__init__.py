"""KServe v2 over HTTP/REST, as Triton's HTTP endpoint (``attnserve serve --http-port``).

``server`` (the aiohttp server: route table, errors as ``{"error": ...}``, bearer tokens, TLS),
``routes`` (each route answered by the KServe servicer's RPC of the same job), ``infer``
(``/infer`` bodies with Triton's binary tensor data extension), ``generate`` (Triton's generate
extension), ``json_values`` (parameters and tensor data as JSON), ``proto_json`` (protobuf answers
as Triton's JSON). README: HTTP/REST.
"""
