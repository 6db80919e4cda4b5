"""The OpenAI-compatible handlers: each request becomes calls of the attnserve API's servicer.

``/v1/completions`` translates its prompts (one ``Translate`` call for all of them, or a
``TranslateStream`` per prompt and choice); ``/v1/chat/completions`` translates its one user
message or captions its one image (``Caption`` / ``CaptionStream``). ``n`` choices are the
unary call's alternatives (further samples, or the runner-up beams), or ``n`` streams (choice
i > 0 of a seeded request drawn with ``seed + i``, as the alternatives are).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

from aiohttp import web

from serving.errors import InvalidArgument, ServingError, status_code
from serving.openai.requests import Plan, chat_plan, completion_plan
from serving.openai.responses import (
    FINISH,
    Choice,
    Response,
    TokenTexts,
    error_document,
    model_card,
)
from serving.proto_gen.attnserve.v1 import attnserve_pb2 as apb
from serving.rest.infer import parse_json
from serving.rest.routes import (
    SSE_HEADERS,
    CallFailed,
    RestContext,
    http_status,
    json_response,
    send_event,
    sse_event,
)
from serving.served import ServedGenerator
from serving.services.attnserve import AttnServeServicer
from serving.services.common import UNKNOWN_MODEL

DONE = b"data: [DONE]\n\n"
TASKS = ("translation", "captioning")


class OpenAIRoutes:
    """The handlers, around the attnserve API's servicer."""

    def __init__(self, servicer: AttnServeServicer) -> None:
        self.servicer = servicer
        self.context = RestContext()

    # --- models ---------------------------------------------------------------------------------
    def _card(self, model: ServedGenerator) -> dict[str, Any]:
        try:
            created = int(model.version_dir.stat().st_mtime)
        except OSError:
            created = 0
        return model_card(model.name, created, model.config.task, str(model.version))

    def _generators(self) -> list[ServedGenerator]:
        repository = self.servicer.repository
        models = [repository.get(name) for name in repository.names()]
        return [m for m in models if isinstance(m, ServedGenerator) and m.config.task in TASKS]

    async def models(self, request: web.Request) -> web.Response:
        cards = [self._card(model) for model in self._generators()]
        return json_response({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        return json_response(self._card(self._generator(request.match_info["model"])))

    def _generator(self, name: str) -> ServedGenerator:
        model = self.servicer.repository.get(name)  # NotFound names the served models
        if not isinstance(model, ServedGenerator) or model.config.task not in TASKS:
            served = ", ".join(m.name for m in self._generators()) or "none"
            raise InvalidArgument(
                f"model {name!r} does {model.config.task}, which the OpenAI routes do not "
                f"serve (they serve {served}); use POST /v2/models/{name}/infer"
            )
        return model

    # --- completions ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, completion_plan, self._completion_model)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat_plan, self._chat_model)

    async def _serve(
        self,
        request: web.Request,
        parse: Callable[[Any], Plan],
        model_of: Callable[[Plan], ServedGenerator],
    ) -> web.StreamResponse:
        """A route's request: its body parsed (``parse``) and checked against its model
        (``model_of``), each refusal counted, then answered."""
        body: Any = None
        try:
            body = await _json(request)
            plan = parse(body)
            model = model_of(plan)
            self._check_language(plan, model)
        except ServingError as err:
            self._refused(body, err)
        return await self._answer(request, plan, model)

    def _completion_model(self, plan: Plan) -> ServedGenerator:
        model = self._generator(plan.model)
        if model.config.task != "translation":
            raise InvalidArgument(
                f"model {plan.model!r} captions images: send the image to "
                '/v1/chat/completions as an "image_url" part of the user message'
            )
        return model

    def _chat_model(self, plan: Plan) -> ServedGenerator:
        model = self._generator(plan.model)
        if model.config.task == "translation":
            if plan.images or not plan.texts:
                raise InvalidArgument(
                    f"model {plan.model!r} translates text: send the text as the user "
                    "message's content, without images"
                )
        elif len(plan.images) != 1 or any(t.strip() for t in plan.texts):
            raise InvalidArgument(
                f"model {plan.model!r} captions one image: send the user message's content as "
                'one "image_url" part and no text (the text a caption starts with goes in '
                '"prefix")'
            )
        return model

    def _refused(self, body: Any, err: ServingError) -> NoReturn:
        """A request refused before its call ran, counted in the metrics as that call (the
        attnserve API's method the route would have run)."""
        name = body.get("model") if isinstance(body, dict) else None
        name = name if isinstance(name, str) else ""
        model = self.servicer.model_label(name)
        task = ""
        if model[0] != UNKNOWN_MODEL:
            task = self.servicer.repository.get(name).config.task
        method = "Caption" if task == "captioning" else "Translate"
        if isinstance(body, dict) and body.get("stream") is True:
            method += "Stream"
        self.servicer.record(model, method, status_code(err).name, time.perf_counter())
        raise err

    @staticmethod
    def _check_language(plan: Plan, model: ServedGenerator) -> None:
        languages = model.config.languages
        if model.config.task == "translation" and len(languages) > 1 and not plan.target_language:
            raise InvalidArgument(
                f"model {plan.model!r} translates into {', '.join(languages)}: name one in "
                '"target_language" beside "model" (the openai client: extra_body='
                f'{{"target_language": "{languages[0]}"}})'
            )

    async def _answer(
        self, request: web.Request, plan: Plan, model: ServedGenerator
    ) -> web.StreamResponse:
        response = Response(plan, model.name, model.tokenizer)
        if plan.stream:
            return await self._stream(request, plan, response)
        if model.config.task == "translation":
            answer = await self.servicer.Translate(self._translate(plan), self.context)
            outputs: list[Any] = list(answer.translations)
        else:
            answer = await self.servicer.Caption(self._caption(plan), self.context)
            outputs = [answer]
        choices = [[Choice.of(o), *(Choice.of(a) for a in o.alternatives)] for o in outputs]
        return json_response(response.body(choices, answer.usage.input_tokens))

    def _translate(self, plan: Plan) -> apb.TranslateRequest:
        return apb.TranslateRequest(
            texts=plan.texts,
            target_language=plan.target_language,
            model=plan.model,
            options=plan.unary_options(),
            priority=plan.priority,
            target_prefixes=[plan.prefix] * len(plan.texts) if plan.prefix else [],
        )

    def _caption(
        self, plan: Plan, options: apb.DecodingOptions | None = None
    ) -> apb.CaptionRequest:
        return apb.CaptionRequest(
            image=plan.images[0],
            model=plan.model,
            options=options or plan.unary_options(),
            priority=plan.priority,
            prefix=plan.prefix,
        )

    # --- streams --------------------------------------------------------------------------------
    def _streams(self, plan: Plan) -> list[tuple[int, AsyncIterator[Any]]]:
        """(choice index, the attnserve API's stream) of every prompt and choice."""
        streams = []
        prompts = len(plan.texts) if not plan.images else 1
        for p in range(prompts):
            for j in range(plan.n):
                options = plan.stream_options(j)
                if plan.images:
                    call = self.servicer.CaptionStream(self._caption(plan, options), self.context)
                else:
                    message = apb.TranslateStreamRequest(
                        text=plan.texts[p],
                        target_language=plan.target_language,
                        model=plan.model,
                        options=options,
                        priority=plan.priority,
                        target_prefix=plan.prefix,
                    )
                    call = self.servicer.TranslateStream(message, self.context)
                streams.append((p * plan.n + j, call))
        return streams

    async def _stream(
        self, request: web.Request, plan: Plan, response: Response
    ) -> web.StreamResponse:
        """Server-sent events: chunks as the streams produce them, then ``[DONE]``. A failure
        before the first chunk is the HTTP answer, a later one an ``{"error": ...}`` event."""
        stream = web.StreamResponse(headers=SSE_HEADERS)
        states: dict[int, _ChoiceState] = {}
        prompt_tokens = completion_tokens = 0
        try:
            async for index, message in _merged(self._streams(plan)):
                state = states.get(index)
                if state is None:
                    state = states[index] = _ChoiceState(response, plan, index)
                    if plan.chat:
                        await send_event(stream, request, sse_event(response.chunk(index, None)))
                if message.finish_reason:
                    if index % plan.n == 0:
                        prompt_tokens += message.usage.input_tokens
                    completion_tokens += message.usage.output_tokens
                await send_event(stream, request, sse_event(state.chunk(message)))
        except CallFailed as err:
            if not stream.prepared:
                raise
            status = http_status(err.code)
            await stream.write(sse_event(error_document(status, err.message, err.code.name)))
        if plan.include_usage and stream.prepared:
            chunk = response.usage_chunk(prompt_tokens, completion_tokens)
            await stream.write(sse_event(chunk))
        if not stream.prepared:
            await stream.prepare(request)
        await stream.write(DONE)
        await stream.write_eof()
        return stream


class _ChoiceState:
    """One streamed choice: its echo, token texts and the text offset of its next token (the
    tokens' texts so far, not the text sent: a stream holds back text that may start a stop
    string)."""

    def __init__(self, response: Response, plan: Plan, index: int) -> None:
        self.response = response
        self.index = index
        self.echo = plan.texts[index // plan.n] if plan.echo else ""
        self.tokens = TokenTexts(response.tokenizer) if plan.logprobs else None
        self.offset = len(self.echo)

    def chunk(self, message: Any) -> dict[str, Any]:
        """The chunk of one message of the attnserve API's stream."""
        if message.finish_reason:
            return self.response.chunk(self.index, "", FINISH.get(message.finish_reason))
        text, self.echo = self.echo + message.delta, ""
        logprobs = None
        if self.tokens is not None:
            tokens, tops = self.tokens.add_scored(message.token_ids, message.top_log_probs)
            logprobs = self.response.logprobs(tokens, message.token_log_probs, self.offset, tops)
            self.offset += sum(len(token) for token in tokens)
        return self.response.chunk(self.index, text, None, logprobs)


async def _json(request: web.Request) -> Any:
    body = await request.read()
    if not body.strip():
        raise InvalidArgument("the request body is empty: send a JSON object")
    return parse_json(body)


async def _merged(streams: list[tuple[int, AsyncIterator[Any]]]) -> AsyncIterator[tuple[int, Any]]:
    """The messages of several streams as they come, each with its choice index; the first
    failure ends them all (and a stream left early is closed: its engine request cancelled)."""
    if len(streams) == 1:
        index, only = streams[0]
        async with contextlib.aclosing(only) as messages:  # type: ignore[type-var]
            async for message in messages:
                yield index, message
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, source: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(source) as messages:  # type: ignore[type-var]
                async for message in messages:
                    queue.put_nowait((index, message, None, False))
        except BaseException as err:  # any failure (a bug too) ends the merged stream
            # (a CancelledError too: this task's own, from the merge's end, finds no reader;
            # a source's, from a future something else cancelled, must not leave the merge
            # waiting for this source's end)
            queue.put_nowait((index, None, err, True))
            if not isinstance(err, Exception):
                raise
        else:
            queue.put_nowait((index, None, None, True))

    tasks = [asyncio.create_task(pump(index, source)) for index, source in streams]
    try:
        running = len(tasks)
        while running:
            index, message, error, ended = await queue.get()
            if error is not None:
                raise error
            if ended:
                running -= 1
            else:
                yield index, message
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
