"""The KServe v2 / Triton inference protocol (``inference.GRPCInferenceService``), by job.

``tensors`` (wire format of tensors), ``signature`` (a model's inputs and outputs),
``triton_config`` (Triton's ModelConfig of a served model), ``parameters`` (request parameters),
``request`` (checking a request against the signature), ``execute`` (running it per task),
``stream`` (decoupled streaming responses); ``serving.services.kserve`` is the servicer, and
``serving.rest`` serves it over HTTP/REST as well.

Unmodified Triton and KServe clients (``tritonclient.grpc``, perf_analyzer) talk to the served
models through this servicer, and perf_analyzer runs against them with no model-specific flags
beyond Triton's own (``--streaming`` for the decoupled generators, ``--input-data`` for text).
Tensor contract per model task (N = batch, the first dimension; *declared*: what ModelMetadata
and ModelConfig list, the other rows are accepted as well):

=============== ========================= ======= =============== ==============================
task            tensor                    type    shape           notes
=============== ========================= ======= =============== ==============================
classification  in  ``image`` (declared)  UINT8   [N,S,S,3]       RGB pixels 0-255 (HWC), the
                                                                  server normalises them
                in  ``image``             BYTES   [N,1] or [N]    PNG / JPEG, instead
                in  ``pixel_values``      FP32    [N,3,S,S]       normalised pixels, instead;
                                                                  FP16 too (fp16 models)
                out ``probabilities``     FP32    [N,C]           softmax over the C labels
                out ``label``             BYTES   [N]             top-1 label
translation     in  ``text`` (declared)   BYTES   [N,1] or [N]    UTF-8 source texts
                in  ``target_language``   BYTES   [N,1], [N] or   optional (declared): or
                                                  [1]             request parameter
                                                                  ``target_language`` (string)
                in  ``target_prefix``     BYTES   [N,1] or [N]    optional: the text each
                                                                  translation starts with
                in  ``bad_words``         BYTES   [K]             optional: texts no output
                                                                  holds (every element)
                in  ``stop``              BYTES   [K]             optional: stop strings
                                                                  (every element)
                out ``translation``       BYTES   [N]             UTF-8
                out ``token_ids``         INT32   [N,T]           padded with -1
captioning      in  ``image`` (declared)  UINT8   [N,S,S,3]       RGB pixels 0-255 (HWC)
                in  ``image``             BYTES   [N,1] or [N]    PNG / JPEG, instead
                in  ``prefix``            BYTES   [N,1] or [N]    optional: the text each
                                                                  caption starts with
                in  ``bad_words``         BYTES   [K]             optional, as for translation
                in  ``stop``              BYTES   [K]             optional, as for translation
                out ``caption``           BYTES   [N]             UTF-8
                out ``token_ids``         INT32   [N,T]           padded with -1
=============== ========================= ======= =============== ==============================

Only inputs whose generated data is valid are declared (perf_analyzer fills every declared
input with random data; random bytes are valid pixels, random floats hold NaN). Request
parameters of the generating models: ``max_new_tokens``, ``min_new_tokens``, ``beam_size``,
``length_penalty``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``repetition_penalty``,
``no_repeat_ngram_size``, ``num_alternatives``, ``top_log_probs`` (int64 / double; numeric
strings too), ``return_log_probs`` (bool). ``return_log_probs`` adds the output
``token_log_probs`` FP32 [N,T], ``num_alternatives`` the outputs ``alternatives`` BYTES [N,A]
and ``alternative_scores`` FP32 [N,A], ``top_log_probs`` k the outputs ``top_token_ids`` INT32
[N,T,k] (-1 where padded) and ``top_log_probs`` FP32 [N,T,k] (NaN where padded)
(``serving.kserve.execute``).
Every model honours Triton's ``timeout`` parameter (microseconds) besides the gRPC deadline. A
requested output with the ``classification`` parameter k (tritonclient's ``class_count``) comes
back as BYTES [N,k] of "score:index:label", as Triton does.

``ModelStreamInfer`` is decoupled-style: a translation or captioning request of one element gets one
response per generated token (the text delta in the text output, its ids in ``token_ids``,
parameters ``index`` and ``final`` false), then a last response with an empty delta and ``final``
true (also ``triton_final_response`` true, plus ``finish_reason``, ``input_tokens``,
``output_tokens``). Any other request on the stream (classification, N > 1, beam search, token
log-probabilities, alternatives) gets one
response with ``final`` true. A failed request gets ``error_message`` ("CODE: message") and the
stream stays open; requests on one stream run concurrently and their responses carry the request
``id``.
"""
