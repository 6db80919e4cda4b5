"""The OpenAI-compatible routes on the HTTP port: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, answered by the attnserve API's servicer (``Translate``,
``TranslateStream``, ``Caption``, ``CaptionStream``), so every check, limit, metric and trace is
that API's.

- ``requests``: request bodies into a plan of native requests (strict: an unknown or unserved
  field is a 400 that names it).
- ``responses``: native answers into OpenAI's response objects and stream chunks.
- ``routes``: the aiohttp handlers.
"""
