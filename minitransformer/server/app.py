"""The HTTP routes: OpenAI's endpoints (and vLLM's extras) on Starlette, in front of the engine thread.

    POST /v1/completions, /v1/chat/completions   generate (stream or whole); see protocol.py and responses.py
    GET  /v1/models                              the one model served
    POST /tokenize, /detokenize                  text <-> token ids with the model's tokenizer (vLLM's extras)
    GET  /health                                 200 while the engine thread is healthy, 503 after it failed
    GET  /metrics                                Prometheus text (prometheus.py)
    GET  /v1/loads, /server_info, /version       what a router reads from a replica (router_info.py)
    GET  /, /v1/engine/events                    the live page and the engine's state as events (live.py)

One request's path: the Guard (guard.py: a Host this server answers to, else 403; 503 while shutting down) -> check
the key (401) -> read the body, only `application/json` (415) and at most --max-body-bytes (413) -> parse and check
every field, the per-request caps included (400) -> check the model name (404) -> tokenize and check the context and
the tenant's quota, on a worker thread so the event loop stays free (400 when it can never fit) -> submit to the
engine thread under a random request id (429 when the queue is full or the tenant's quota is held by its other
requests) -> stream its items as server-sent events, or gather them into one response. If the client goes away
before the end, the request is aborted and its KV blocks are freed at the engine's next step.

Every refusal, an unknown route (404) or method (405) included, is OpenAI's error object (errors.py). Shutting down
(`drain`, called by runner.py on SIGTERM or Ctrl-C) is graceful: new requests get 503, running ones may finish for
--shutdown-timeout seconds, the rest end with their partial text and finish_reason "abort".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..core.errors import InputError, MiniTransformerError, QuotaError
from ..core.metrics import now
from ..core.request import Delta, encode_prompt, make_request, prompt_token_ids
from ..structured import DEFAULT_LIMITS, ConstraintLimits, StructuredOutputsParams
from .connections import quiet_accept_errors
from .engine_loop import EngineLoop
from .errors import APIError, EngineFailed, QueueFull, bad_request, http_error, internal_error, too_many_requests
from .guard import AllowedHosts, Guard
from .live import LiveFeed
from .protocol import ApiRequest, PromptLimits, parse_generation, parse_json, parse_token_ids, with_max_tokens
from .responses import SSE_DONE, ResponseBuilder, sse
from .router_info import RouterInfo
from .tenants import Access, Tenant

log = logging.getLogger("minitransformer.server")

DISCONNECT_POLL_S = 0.25        # how often a non-streaming request checks that its client is still there
DRAIN_POLL_S = 0.05             # how often a shutdown looks whether the running requests have ended
ABORT_WAIT_S = 5.0              # after the aborts, how long a shutdown waits for their final items
SHUTDOWN = "shutdown"           # the stop_reason of a request ended by a shutdown (finish_reason "abort")


@dataclass
class ServerConfig:
    model_name: str
    api_keys: dict[str, Tenant] | None = None        # None: no authentication
    max_body_bytes: int = 1 << 20
    started: int = field(default_factory=lambda: int(time.time()))
    allowed_hosts: AllowedHosts = field(default_factory=lambda: AllowedHosts.for_binding("127.0.0.1"))
    allowed_origins: frozenset[str] = frozenset()    # web origins whose pages may read the API (CORS)
    metrics_key: str | None = None                   # the operator's key: /metrics and every tenant's events
    constraint_limits: ConstraintLimits = DEFAULT_LIMITS   # what a structured-output constraint may cost


class Server:
    """The routes' shared state: the model (for its tokenizer), the engine thread, the settings."""

    def __init__(self, model, loop: EngineLoop, config: ServerConfig):
        self.model, self.loop, self.config = model, loop, config
        self.access = Access(config.api_keys, config.metrics_key)       # who may read what (tenants.py)
        sizes = loop.engine.config
        # the longest request the engine can take: its max_model_len, and never more than the whole KV pool
        self.max_request_tokens = min(sizes.max_model_len, sizes.pool_tokens + 1)
        self.prompt_limits = PromptLimits.for_context(self.max_request_tokens)
        self.draining = False                # set by drain(): new requests get 503, endless streams end
        self.in_flight: set[str] = set()     # ids of the requests the engine has not finished with

    def stopping(self) -> bool:
        """True once a shutdown began: the live page's endless event streams end then."""
        return self.draining

    def app(self) -> Starlette:
        routes = [Route("/v1/completions", self._endpoint(self.completions), methods=["POST"]),
                  Route("/v1/chat/completions", self._endpoint(self.chat_completions), methods=["POST"]),
                  Route("/v1/models", self._endpoint(self.models), methods=["GET"]),
                  Route("/tokenize", self._endpoint(self.tokenize), methods=["POST"]),
                  Route("/detokenize", self._endpoint(self.detokenize), methods=["POST"]),
                  Route("/health", self._endpoint(self.health), methods=["GET"]),
                  Route("/metrics", self._endpoint(self.metrics), methods=["GET"])]
        routes += LiveFeed(self).routes(self._endpoint)
        routes += RouterInfo(self).routes(self._endpoint)
        guard = Middleware(Guard, server=self, hosts=self.config.allowed_hosts, origins=self.config.allowed_origins)
        return Starlette(routes=routes, lifespan=self._lifespan, middleware=[guard],
                         # ignore: Starlette types every handler as taking Exception; http_error takes its key's type
                         exception_handlers={HTTPException: http_error,  # type: ignore[dict-item]
                                             Exception: internal_error})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        """The engine thread runs exactly as long as the server: started before the first request, and stopped
        after drain() ended every request; the last line says whether every KV block came back."""
        self.loop.start()
        quiet_accept_errors(asyncio.get_running_loop())
        try:
            yield
        finally:
            await run_in_threadpool(self.loop.stop)
            stats = self.loop.engine.stats
            log.info("shutting down: the engine stopped; %d of %d KV blocks free", stats.num_free_blocks,
                     stats.num_blocks)

    async def drain(self, timeout_s: float, forced=lambda: False) -> None:
        """A graceful end, in three logged phases: take no new requests (503); give the running ones up to
        timeout_s to finish; end the rest with their partial text (finish_reason "abort", stop_reason "shutdown":
        a streamed client gets its final chunk and [DONE], a whole one a 503 error object). forced(): stop waiting
        (a second Ctrl-C)."""
        self.draining = True
        log.info("shutting down: new requests get 503; %d running may take up to %gs to finish "
                 "(--shutdown-timeout)", len(self.in_flight), timeout_s)
        if await self._wait_idle(timeout_s, forced):
            log.info("shutting down: no request is running")
            return
        log.info("shutting down: ending the %d requests still running, with their partial text "
                 "(finish_reason abort)", len(self.in_flight))
        self.loop.abort_all(SHUTDOWN)
        if not await self._wait_idle(ABORT_WAIT_S, lambda: False):     # the aborts' final items: not to be hurried
            log.warning("shutting down: %d requests did not end within %gs of their abort", len(self.in_flight),
                        ABORT_WAIT_S)

    async def _wait_idle(self, timeout_s: float, forced) -> bool:
        deadline = now() + timeout_s
        while self.in_flight and now() < deadline and not forced():
            await asyncio.sleep(DRAIN_POLL_S)
        return not self.in_flight

    def _endpoint(self, handler):
        """Every refusal becomes an OpenAI error object; anything else is our bug: logged once, a 500 to the client."""
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                return exc.response()
            except MiniTransformerError as exc:
                return bad_request(str(exc), param=getattr(exc, "param", None)).response()
            except ClientDisconnect:                     # the client left mid-body (or was closed by --body-timeout)
                return Response(status_code=499)         # nobody reads it
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
        tenant = self.access.tenant(request)
        api = await run_in_threadpool(parse_generation, await self._json(request), chat, self.prompt_limits,
                                      self.config.constraint_limits)        # compiling a constraint takes a while
        self._check_model(api.model)
        prompt_ids, params = await run_in_threadpool(self._tokenize_request, api, tenant)
        priority = api.priority if api.priority is not None else (tenant.priority if tenant else 0)
        if self.draining:                                # the shutdown began while this one was tokenized
            raise APIError(503, "the server is shutting down and takes no new requests", type="server_error",
                           code="server_shutting_down")
        request_id = secrets.token_hex(16)               # unguessable, as vLLM's: ids were a global counter
        items: asyncio.Queue = asyncio.Queue()
        event_loop = asyncio.get_running_loop()

        def deliver(item: Delta) -> None:           # on the event loop
            items.put_nowait(item)
            if item.result is not None or item.error is not None:
                self.in_flight.discard(request_id)       # the engine is done with it

        self.in_flight.add(request_id)
        future = self.loop.submit(prompt_ids, params, priority, tenant.name if tenant else None, arrival,
                                  lambda item: event_loop.call_soon_threadsafe(deliver, item),
                                  request_id=request_id, cache_salt=tenant.salt if tenant else None)
        try:
            await asyncio.wrap_future(future)
        except BaseException as exc:
            self.in_flight.discard(request_id)
            if isinstance(exc, QueueFull):
                raise too_many_requests(str(exc), code="queue_full") from None
            if isinstance(exc, QuotaError):              # its other requests hold the quota: later it fits
                raise too_many_requests(f"{exc}; retry when they finish", code="quota_exceeded") from None
            if isinstance(exc, EngineFailed):            # a step failed earlier: no new work
                raise APIError(503, str(exc), type="server_error") from None
            if isinstance(exc, asyncio.CancelledError):  # our client left while the request was being queued
                def abort_once_queued(done) -> None:     # the submission went through after all: take it back
                    if not done.cancelled() and done.exception() is None:
                        self.loop.abort(done.result())

                future.add_done_callback(abort_once_queued)
            raise
        builder = ResponseBuilder(request_id, self.config.model_name, chat, self.model.tokenizer,
                                  params.logprobs, api.return_token_ids)
        if api.stream:
            return EventStream(self._events(items, builder, api.include_usage, api.structured_param),
                               on_close=lambda: self.loop.abort(request_id))
        return await self._whole(request, request_id, items, builder, api.structured_param)

    def _tokenize_request(self, api: ApiRequest, tenant: Tenant | None):
        """Tokenize (chat template for chat) and check against the context and the tenant's quota, off the event
        loop. A chat request without max_tokens may use the rest of the context, as vLLM allows, and no more than
        its tenant's quota leaves. A request larger than the whole quota can never run: a 400 that says so, not a
        429 that invites retries (the openai client retries a 429 by itself)."""
        ids, params = self._prompt_ids(api), api.params
        if isinstance(params.structured, StructuredOutputsParams):   # its matcher over this model's vocabulary,
            try:                                                     # built here so the engine thread only copies it
                params.structured.prepare(self.model.tokenizer)
            except MiniTransformerError as exc:
                raise bad_request(f"{api.structured_param}: {exc}", param=api.structured_param) from None
        quota = tenant.quota_tokens if tenant is not None else None
        budget = self.max_request_tokens if quota is None else min(self.max_request_tokens, quota)
        if not api.max_tokens_given:
            room = budget - len(ids)
            if room < 1:
                within = f"tenant {tenant.name!r}'s quota of {quota}" if tenant is not None and budget == quota \
                    else f"{budget} tokens"
                raise bad_request(f"the prompt ({len(ids)} tokens) leaves no room for a reply in {within}",
                                  param="messages")
            params = with_max_tokens(params, max(room, params.min_tokens))
        total = len(ids) + params.max_tokens
        if tenant is not None and quota is not None and total > quota:     # a quota is always a tenant's
            raise bad_request(f"this request needs {total} tokens (prompt {len(ids)} + max_tokens "
                              f"{params.max_tokens}), more than tenant {tenant.name!r}'s whole quota of {quota}: "
                              "it can never run; lower max_tokens or shorten the prompt", param="max_tokens",
                              code="quota_exceeded")
        return ids, params

    def _prompt_ids(self, api: ApiRequest) -> list[int]:
        """The prompt's ids, checked against the context and the vocabulary (core's make_request); its refusal
        names the field: a chat request's prompt is its `messages`."""
        try:
            return make_request(self.model, api.prompt, api.params, api.chat).prompt_token_ids
        except InputError as exc:
            param = "messages" if exc.param == "prompt" and api.chat else exc.param
            raise bad_request(str(exc), param=param) from None

    async def _events(self, items: asyncio.Queue, builder: ResponseBuilder, include_usage: bool,
                      structured_param: str | None = None):
        """The server-sent events of one streamed request, to its final chunk and [DONE]. Leaving early (a
        disconnect cancels it) aborts the request: EventStream's on_close. A request whose constraint failed ends
        with its final chunk (finish_reason "abort"), then an error event naming the constraint."""
        first = builder.first_chunk()
        if first is not None:
            yield sse(first)
        while True:
            item: Delta = await items.get()
            if item.error is not None:
                yield sse({"error": {"message": item.error, "type": "server_error", "param": None, "code": None}})
                break
            finished = item.result is not None
            if item.text or item.logprobs or finished or (builder.return_token_ids and item.token_ids):
                yield sse(builder.chunk(item.text, item.logprobs or [], item.result, item.token_ids))
            if item.result is not None:                 # finished
                if include_usage:
                    yield sse(builder.usage_chunk(item.result))
                if (failed := constraint_failure(item.result, structured_param)) is not None:
                    yield sse(failed.body())
                break
        yield SSE_DONE

    async def _whole(self, request: Request, request_id: str, items: asyncio.Queue,
                     builder: ResponseBuilder, structured_param: str | None = None) -> Response:
        """Gather one request's items into one response, watching that the client is still there."""
        entries, finished = [], False
        try:
            while True:
                try:
                    item: Delta = await asyncio.wait_for(items.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)          # nobody reads it; the abort frees the blocks
                    continue
                if item.error is not None:
                    finished = True
                    raise APIError(500, item.error, type="server_error")
                entries += item.logprobs or []
                if item.result is not None:
                    finished = True
                    if item.result.stop_reason == SHUTDOWN:
                        raise APIError(503, f"the server shut down before this request finished (after "
                                            f"{len(item.result.token_ids)} tokens); send it again once the server "
                                            "is back", type="server_error", code="server_shutting_down")
                    if (failed := constraint_failure(item.result, structured_param)) is not None:
                        raise failed
                    return JSONResponse(builder.response(item.result, entries))
        finally:
            if not finished:
                self.loop.abort(request_id)

    # ------------------------------------------------------------------ the other endpoints

    async def models(self, request: Request) -> Response:
        self.access.tenant(request)
        card = {"id": self.config.model_name, "object": "model", "created": self.config.started,
                "owned_by": "minitransformer", "max_model_len": self.loop.engine.config.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}."""
        self.access.tenant(request)
        data = await self._json(request)
        self._check_model(data.get("model"))
        chat = "messages" in data
        api = await run_in_threadpool(parse_generation, {"max_tokens": 1, **data}, chat, self.prompt_limits,
                                      self.config.constraint_limits)
        tokenizer = self.model.tokenizer
        if chat:
            ids = await run_in_threadpool(self._prompt_ids, api)
        elif isinstance(api.prompt, str):               # counted whole, BOS included, as a completion reads it
            ids = await run_in_threadpool(encode_prompt, tokenizer, api.prompt)
        else:
            try:
                ids = prompt_token_ids(api.prompt, tokenizer.vocab_size)
            except InputError as exc:
                raise bad_request(str(exc), param="prompt") from None
        body = {"count": len(ids), "max_model_len": self.loop.engine.config.max_model_len, "tokens": ids}
        if data.get("return_token_strs"):
            body["token_strs"] = tokenizer.pieces(ids)
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        self.access.tenant(request)
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
        """Prometheus text. With --metrics-key only that key reads it; else with --api-keys any key does."""
        self.access.operator_only(request)
        return PlainTextResponse(self.loop.metrics.render(self.loop.stats),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ checks shared by the routes

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise APIError(404, f"the model {name!r} does not exist here; this server serves "
                                f"{self.config.model_name!r} (GET /v1/models)", param="model", code="model_not_found")

    async def _json(self, request: Request) -> dict:
        """The body, read up to --max-body-bytes (413 past it, even without a Content-Length), as a JSON object.
        Only a body declared `application/json` is read: a page on another site can send a form or a `text/plain`
        body without asking the browser's permission first (no CORS preflight), but not a JSON one (415)."""
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            raise APIError(415, f"the request body must be sent as 'Content-Type: application/json', not "
                                f"{media_type or 'without a Content-Type'}", code="unsupported_media_type")
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


class EventStream(StreamingResponse):
    """A server-sent-event response that calls on_close() however it ends: finished, or cut short by a client that
    left (which may happen before the body's generator even started, so its own `finally` would never run)."""

    media_type = "text/event-stream"

    def __init__(self, content, on_close):
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def constraint_failure(result, structured_param: str | None) -> APIError | None:
    """The 400 that names a structured-output constraint which failed while its request ran (a limit of its parser,
    a mask over its time budget: Result.structured["error"]), or None. The request ended there (finish_reason
    "abort", stop_reason "constraint") and its blocks are freed; the server and the rest of the batch go on."""
    if result.stop_reason != "constraint":
        return None
    reason = (result.structured or {}).get("error") or "the constraint failed"
    return APIError(400, f"{structured_param}: {reason} (after {len(result.token_ids)} tokens)",
                    param=structured_param, code="constraint_failed")
