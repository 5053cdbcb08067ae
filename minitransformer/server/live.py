"""The live page: `GET /` shows the engine working, from `GET /v1/engine/events`, a stream of its state.

    GET /                       static/index.html (+ /static/page.css, /static/page.js): no build step, nothing
                                fetched from elsewhere; a Content-Security-Policy allows only these files
    GET /v1/engine/events       server-sent events, one `data: {snapshot}` at most every EVENT_INTERVAL_S while the
                                engine changes, and a comment line every KEEPALIVE_S while it is idle

What a snapshot holds (`snapshot()` below): every running and waiting sequence (id, status, token counts, block
table), the KV pool as one letter per block (`.` free, `u` used by one sequence, `s` shared by several through a
cached prefix, `c` free but still holding a cached prefix that a new request can revive), the engine's counters
(EngineStats), the requests that finished lately with their TTFT and ITL, and the steps since the previous event.

Where it comes from: `Engine.snapshot()` (serving/outputs.py), the engine's read API; this file only turns it into
the page's JSON. Why it is built in the engine thread: the block tables and the queues change during a step, and
reading them from the event loop would race with it. So `LiveFeed.on_publish` runs as one of EngineLoop's publish
hooks, between two steps, and hands the event loop a finished dict (assigning a reference is atomic). It does that
only while at least one page is subscribed: a decode step runs thousands of times, and nobody should pay for a
snapshot nobody reads. Its cost is one pass over the blocks and the sequences.

With --api-keys the events need the key too. A browser's EventSource cannot send an Authorization header, so the page
reads this stream with fetch(), as it reads a streamed completion, and sends `Authorization: Bearer KEY`. A tenant's
key shows that tenant's requests in full and every other tenant's as anonymous occupancy (`view()`: status and
block count, no id, token counts or block table), the steps as occupancy too (how many requests ran, how long it took;
not how many prompt and decode tokens, which are the others' traffic), and of the engine's counters only the
occupancy (running, waiting, blocks in use): the engine-wide totals are what --metrics-key keeps off /metrics. The
metrics key, or no keys at all, shows everything. HEAD answers the headers and ends: the stream never would.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import asdict
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..core.metrics import now
from ..serving import BlockState
from .errors import APIError
from .responses import sse

log = logging.getLogger("minitransformer.server")

EVENT_INTERVAL_S = 0.05         # at most ~20 events a second: smooth to watch, cheap to send
KEEPALIVE_S = 15.0              # an idle stream still writes now and then, so a closed page is noticed
FINISHED_KEPT = 32              # recently finished requests shown with their TTFT and ITL
STEPS_ON_CONNECT = 120          # a new page starts with this much of the step timeline

# The page's files and their types. Only these names are served: no path from the URL reaches the file system.
ASSETS = {"index.html": "text/html; charset=utf-8", "page.css": "text/css; charset=utf-8",
          "page.js": "text/javascript; charset=utf-8"}
PAGE_HEADERS = {
    # Model text is rendered with textContent, never as HTML; this policy is the second lock: no inline script, no
    # script or style from anywhere but this server, so even a rendering bug could not run what a model wrote.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

BLOCK_FREE, BLOCK_USED, BLOCK_SHARED, BLOCK_CACHED = ".", "u", "s", "c"
BLOCK_LETTERS = {BlockState.FREE: BLOCK_FREE, BlockState.USED: BLOCK_USED, BlockState.SHARED: BLOCK_SHARED,
                 BlockState.CACHED: BLOCK_CACHED}


def snapshot(engine_snapshot, finished: collections.deque, model_name: str) -> dict:
    """An Engine.snapshot() as the page's plain data."""
    snap = engine_snapshot
    config = snap.config

    def sequence(seq) -> dict:
        return {"id": seq.request_id, "tenant": seq.tenant, "status": seq.status,
                "prompt_tokens": seq.num_prompt_tokens,
                "output_tokens": seq.num_output_tokens, "computed_tokens": seq.num_computed_tokens,
                "max_tokens": seq.max_tokens, "preemptions": seq.num_preemptions,
                "blocks": list(seq.block_table), "ttft_s": seq.ttft_s, "itl_s": seq.itl_s}

    return {"time": now(), "model": model_name, "step": snap.step,
            "config": {"num_blocks": config.num_blocks, "block_size": config.block_size,
                       "max_num_seqs": config.max_num_seqs,
                       "max_num_batched_tokens": config.max_num_batched_tokens, "policy": config.policy,
                       "max_model_len": config.max_model_len},
            "stats": asdict(snap.stats), "pool": "".join(BLOCK_LETTERS[state] for state in snap.blocks),
            "running": [sequence(s) for s in snap.running], "waiting": [sequence(s) for s in snap.waiting],
            "finished": list(finished)}


OCCUPANCY = ("num_running_reqs", "num_waiting_reqs", "kv_cache_usage", "num_free_blocks", "num_blocks")


def view(state: dict, steps: list[dict], tenant) -> tuple[dict, list[dict]]:
    """The snapshot and its steps as one viewer may see them: `tenant`'s own requests in full, the others as
    anonymous occupancy (their status and how many blocks they hold), each step without its token counts, and of
    the counters only OCCUPANCY. tenant=None: the viewer sees everything (the caller decides)."""
    if tenant is None:
        return state, steps

    def seen(seq: dict) -> dict:
        if seq["tenant"] == tenant:
            return seq
        return {"id": None, "tenant": None, "status": seq["status"], "num_blocks": len(seq["blocks"])}

    return ({**state, "running": [seen(s) for s in state["running"]], "waiting": [seen(s) for s in state["waiting"]],
             "finished": [f for f in state["finished"] if f["tenant"] == tenant],
             "stats": {key: value for key, value in state["stats"].items() if key in OCCUPANCY}},
            [{**step, "prefill_tokens": None, "decode_tokens": None} for step in steps])


def step_dict(record) -> dict:
    return {"step": record.step, "prefill_tokens": record.num_prefill_tokens,
            "decode_tokens": record.num_decode_tokens, "num_seqs": len(record.request_ids),
            "duration_s": record.duration_s, "preempted": len(record.preempted), "kv_cache_usage":
            record.kv_cache_usage, "num_running": record.num_running, "num_waiting": record.num_waiting}


class LiveFeed:
    """Publishes `snapshot()` from the engine thread while pages are subscribed; serves the page and the events."""

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.subscribers = 0                     # changed on the event loop only; read by the engine thread
        self.latest: tuple[int, dict, list] | None = None     # (version, snapshot, latest step records)
        self._version = 0
        self._watched: set[str] = set()          # ids of the unfinished requests, as of the last snapshot
        self._finished: collections.deque = collections.deque(maxlen=FINISHED_KEPT)
        self.loop.publish_hooks.append(self.on_publish)

    def routes(self, wrap) -> list[Route]:
        """The page, its files and the events; `wrap` turns errors into OpenAI error responses (app.py)."""
        return [Route("/", wrap(self.page), methods=["GET"]),
                Route("/static/{name}", wrap(self.asset), methods=["GET"]),
                Route("/v1/engine/events", wrap(self.events), methods=["GET"])]

    # ------------------------------------------------------------------ the engine thread

    def on_publish(self, loop) -> None:
        if not self.subscribers:
            self._watched.clear()
            return
        try:
            engine = loop.engine
            state = engine.snapshot()
            for seq in reversed(state.finished):                     # oldest first: the latest ends up first
                if seq.request_id in self._watched:                  # finished since the last snapshot
                    self._watched.discard(seq.request_id)
                    self._finished.appendleft(_finished_entry(seq))
            self._watched = {s.request_id for s in state.running + state.waiting}
            self._version += 1
            self.latest = (self._version, snapshot(state, self._finished, self.server.config.model_name),
                           engine.recent_steps(STEPS_ON_CONNECT))     # a copy: the engine thread trims its log
        except Exception:                        # a bug here must not stop the engine
            log.exception("could not build the live page's snapshot")

    # ------------------------------------------------------------------ routes (the event loop)

    async def page(self, request: Request) -> Response:
        return await self.asset(request, "index.html")

    async def asset(self, request: Request, name: str | None = None) -> Response:
        name = name or request.path_params["name"]
        if name not in ASSETS:
            raise APIError(404, f"there is no /static/{name} here", code="not_found")
        body = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
        return Response(body, media_type=ASSETS[name], headers=PAGE_HEADERS)

    async def events(self, request: Request) -> Response:
        tenant = self.server.access.viewer(request)          # None: every tenant's requests
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":                # the headers a GET would get, and an end
            return Response(media_type="text/event-stream", headers=headers)
        return StreamingResponse(self._stream(tenant), media_type="text/event-stream", headers=headers)

    async def _stream(self, tenant=None):
        """Subscribe, then send each new snapshot (with the steps since the last one) until the client leaves:
        the server cancels this generator, or a write to the closed connection fails. tenant: see view()."""
        self.subscribers += 1
        self.latest = None
        self.loop.call_soon(lambda: None)         # wake an idle engine thread: it publishes a first snapshot
        sent_version, last_step, quiet_since = None, None, now()
        try:
            while not self.server.stopping():       # uvicorn waits for open responses before it stops
                latest = self.latest
                if latest is not None and latest[0] != sent_version:
                    sent_version, state, steps = latest
                    if last_step is not None:
                        steps = [r for r in steps if r.step > last_step]
                    if steps:
                        last_step = steps[-1].step
                    seen, seen_steps = view(state, [step_dict(r) for r in steps], tenant)
                    yield sse({**seen, "steps": seen_steps})
                    quiet_since = now()
                elif now() - quiet_since > KEEPALIVE_S:
                    yield ": keepalive\n\n"
                    quiet_since = now()
                await asyncio.sleep(EVENT_INTERVAL_S)
        finally:
            self.subscribers -= 1


def _finished_entry(seq) -> dict:
    """A finished request's SequenceView as the page's row."""
    return {"id": seq.request_id, "tenant": seq.tenant, "prompt_tokens": seq.num_prompt_tokens,
            "output_tokens": seq.num_output_tokens, "ttft_s": seq.ttft_s, "itl_s": seq.itl_s,
            "finish_reason": seq.finish_reason, "preemptions": seq.num_preemptions}
