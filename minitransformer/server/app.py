"""The HTTP routes: OpenAI's endpoints (and vLLM's extras) on Starlette, in front of the engine thread.

    POST /v1/completions, /v1/chat/completions   generate (stream or whole); see protocol.py and responses.py
    GET  /v1/models                              the one model served
    POST /tokenize, /detokenize                  text <-> token ids with the model's tokenizer (vLLM's extras)
    GET  /health                                 200 while the engine thread is healthy, 503 after it failed
    GET  /metrics                                Prometheus text (prometheus.py)
    GET  /, /v1/engine/events                    the live page and the engine's state as events (live.py)

One request's path: read the body (at most --max-body-bytes: 413) -> check the key (401) -> parse and check every field
(400) -> check the model name (404) -> tokenize and check the context, on a worker thread so the event loop stays free
(400) -> submit to the engine thread (429 when the queue is full or the tenant is over quota) -> stream its items as
server-sent events, or gather them into one response. If the client goes away before the end, the request is aborted
and its KV blocks are freed at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import MiniTransformerError, QuotaError
from ..request import make_request
from ..metrics import now
from .engine_loop import EngineLoop, StreamItem
from .errors import APIError, EngineFailed, QueueFull, bad_request, too_many_requests
from .live import LiveFeed
from .protocol import ApiRequest, parse_generation, parse_json, parse_token_ids, with_max_tokens
from .responses import SSE_DONE, ResponseBuilder, sse
from .tenants import Tenant

log = logging.getLogger("minitransformer.server")

DISCONNECT_POLL_S = 0.25        # how often a non-streaming request checks that its client is still there


@dataclass
class ServerConfig:
    model_name: str
    api_keys: dict[str, Tenant] | None = None        # None: no authentication
    max_body_bytes: int = 1 << 20
    started: int = field(default_factory=lambda: int(time.time()))


class Server:
    """The routes' shared state: the model (for its tokenizer), the engine thread, the settings."""

    def __init__(self, model, loop: EngineLoop, config: ServerConfig):
        self.model, self.loop, self.config = model, loop, config
        self.stopping = lambda: False        # cli/serve.py: True once uvicorn shuts down; endless streams then end
        bm = loop.engine.block_manager
        # the longest request the engine can take: its max_model_len, and never more than the whole KV pool
        self.max_request_tokens = min(loop.engine.max_model_len, bm.num_blocks * bm.block_size + 1)

    def app(self) -> Starlette:
        routes = [Route("/v1/completions", self._endpoint(self.completions), methods=["POST"]),
                  Route("/v1/chat/completions", self._endpoint(self.chat_completions), methods=["POST"]),
                  Route("/v1/models", self._endpoint(self.models), methods=["GET"]),
                  Route("/tokenize", self._endpoint(self.tokenize), methods=["POST"]),
                  Route("/detokenize", self._endpoint(self.detokenize), methods=["POST"]),
                  Route("/health", self._endpoint(self.health), methods=["GET"]),
                  Route("/metrics", self._endpoint(self.metrics), methods=["GET"])]
        routes += LiveFeed(self).routes(self._endpoint)
        return Starlette(routes=routes, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        """The engine thread runs exactly as long as the server: started before the first request, and on shutdown
        it aborts what is still running (those clients get their partial text) and ends."""
        self.loop.start()
        try:
            yield
        finally:
            await run_in_threadpool(self.loop.stop)

    def _endpoint(self, handler):
        """Every refusal becomes an OpenAI error object; anything else is our bug: logged once, a 500 to the client."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                return exc.response()
            except MiniTransformerError as exc:
                return bad_request(str(exc)).response()
            except Exception:
                log.exception("internal error while serving %s %s", request.method, request.url.path)
                return APIError(500, "internal server error; the server log has the details",
                                type="server_error").response()
        return endpoint

    # ------------------------------------------------------------------ generation

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        arrival = now()
        tenant = self._authorize(request)
        api = parse_generation(await self._json(request), chat)
        self._check_model(api.model)
        prompt_ids, params = await run_in_threadpool(self._tokenize_request, api)
        priority = api.priority if api.priority is not None else (tenant.priority if tenant else 0)
        items: asyncio.Queue = asyncio.Queue()
        event_loop = asyncio.get_running_loop()
        future = self.loop.submit(prompt_ids, params, priority, tenant.name if tenant else None, arrival,
                                  lambda item: event_loop.call_soon_threadsafe(items.put_nowait, item))
        try:
            request_id = await asyncio.wrap_future(future)
        except QueueFull as exc:
            raise too_many_requests(str(exc), code="queue_full") from None
        except QuotaError as exc:
            raise too_many_requests(str(exc), code="quota_exceeded") from None
        except EngineFailed as exc:                      # a step failed earlier: no new work
            raise APIError(503, str(exc), type="server_error") from None
        except asyncio.CancelledError:                   # our client left while the request was being queued
            future.add_done_callback(lambda f: not f.cancelled() and f.exception() is None
                                     and self.loop.abort(f.result()))
            raise
        builder = ResponseBuilder(request_id, self.config.model_name, chat, self.model.tokenizer,
                                  params.logprobs, api.return_token_ids)
        if api.stream:
            return StreamingResponse(self._events(request_id, items, builder, api.include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._whole(request, request_id, items, builder)

    def _tokenize_request(self, api: ApiRequest):
        """Tokenize (chat template for chat) and check against the context, off the event loop. A chat request
        without max_tokens may use the rest of the context, as vLLM allows."""
        request = make_request(self.model, api.prompt, api.params, api.chat)
        ids, params = request.prompt_token_ids, api.params
        if not api.max_tokens_given:
            room = self.max_request_tokens - len(ids)
            if room < 1:
                raise bad_request(f"the prompt ({len(ids)} tokens) leaves no room for a reply in "
                                  f"{self.max_request_tokens} tokens", param="messages")
            params = with_max_tokens(params, max(room, params.min_tokens))
        return ids, params

    async def _events(self, request_id: str, items: asyncio.Queue, builder: ResponseBuilder, include_usage: bool):
        """The server-sent events of one streamed request. Leaving early (a disconnect cancels this generator)
        aborts the request."""
        finished = False
        try:
            first = builder.first_chunk()
            if first is not None:
                yield sse(first)
            while not finished:
                item: StreamItem = await items.get()
                if item.error is not None:
                    finished = True
                    yield sse({"error": {"message": item.error, "type": "server_error", "param": None,
                                         "code": None}})
                    break
                finished = item.result is not None
                if item.text or item.logprobs or finished or (builder.return_token_ids and item.token_ids):
                    yield sse(builder.chunk(item.text, item.logprobs, item.result, item.token_ids))
                if finished and include_usage:
                    yield sse(builder.usage_chunk(item.result))
            yield SSE_DONE
        finally:
            if not finished:
                self.loop.abort(request_id)

    async def _whole(self, request: Request, request_id: str, items: asyncio.Queue,
                     builder: ResponseBuilder) -> Response:
        """Gather one request's items into one response, watching that the client is still there."""
        entries, finished = [], False
        try:
            while True:
                try:
                    item: StreamItem = await asyncio.wait_for(items.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)          # nobody reads it; the abort frees the blocks
                    continue
                if item.error is not None:
                    finished = True
                    raise APIError(500, item.error, type="server_error")
                entries += item.logprobs
                if item.result is not None:
                    finished = True
                    return JSONResponse(builder.response(item.result, entries))
        finally:
            if not finished:
                self.loop.abort(request_id)

    # ------------------------------------------------------------------ the other endpoints

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        card = {"id": self.config.model_name, "object": "model", "created": self.config.started,
                "owned_by": "minitransformer", "max_model_len": self.loop.engine.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}."""
        self._authorize(request)
        data = await self._json(request)
        self._check_model(data.get("model"))
        chat = "messages" in data
        api = parse_generation({"max_tokens": 1, **data}, chat=chat)
        tokenizer = self.model.tokenizer
        if chat:
            ids = await run_in_threadpool(lambda: make_request(self.model, api.prompt, api.params, True)
                                          .prompt_token_ids)
        elif isinstance(api.prompt, str):
            ids = await run_in_threadpool(tokenizer.encode, api.prompt)
        else:
            ids = api.prompt
        body = {"count": len(ids), "max_model_len": self.loop.engine.max_model_len, "tokens": ids}
        if data.get("return_token_strs"):
            body["token_strs"] = tokenizer.pieces(ids)
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        self._authorize(request)
        data = await self._json(request)
        self._check_model(data.get("model"))
        ids = parse_token_ids(data, "tokens")
        vocab = self.model.tokenizer.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": self.model.tokenizer.decode(ids)})

    async def health(self, request: Request) -> Response:
        if self.loop.error is not None:
            return APIError(503, self.loop.error, type="server_error").response()
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.loop.metrics.render(self.loop.stats),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ checks shared by the routes

    def _authorize(self, request: Request) -> Tenant | None:
        keys = self.config.api_keys
        if keys is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise APIError(401, "missing API key: send the header 'Authorization: Bearer YOUR_KEY'",
                           code="invalid_api_key")
        tenant = keys.get(key.strip())
        if tenant is None:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        return tenant

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise APIError(404, f"the model {name!r} does not exist here; this server serves "
                                f"{self.config.model_name!r} (GET /v1/models)", param="model", code="model_not_found")

    async def _json(self, request: Request) -> dict:
        """The body, read up to --max-body-bytes (413 past it, even without a Content-Length), as a JSON object."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise self._too_large(int(declared))
        body, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise self._too_large(size)
            body.append(chunk)
        return parse_json(b"".join(body))

    def _too_large(self, size: int) -> APIError:
        return APIError(413, f"the request body ({size} bytes or more) is over the limit of "
                             f"{self.config.max_body_bytes} bytes (--max-body-bytes)", code="request_too_large")
