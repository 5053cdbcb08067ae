"""`minitransformer bench serve`: a load generator that speaks only the OpenAI streaming API.

Because it knows nothing about the server but its HTTP API, the same command measures ours, llama-cpp-python's,
llama.cpp's own `llama-server` or a vLLM deployment, with the same prompts at the same arrival times. Reading order:

    ServeSettings, make_prompts, arrival_times   what is asked and when (serve_workload.py): mixed-length slices of
                      a real text, sent at Poisson arrival times (exponential gaps at rate R; all at once for R = inf)
    SSEParser         server-sent events -> the `data:` payloads, whatever the network's read boundaries
    send_request      one streamed request -> a RequestRecord (timings, tokens, or the error that ended it)
    run_rate          every prompt at its arrival time -> the records and the wall time of the run
    run_sweeps        several servers: each one's model name and a warm-up burst, then run_rate for each
                      request rate, the servers in turns (run_sweep: one server)

Each rate sends prompts of the same lengths but of text no other rate of the run sends, and the warm-up has text
of its own too: every server here has a prefix cache, and a rate that re-sent an earlier rate's prompts skipped
most of its prefill and looked about twice as fast as the first rate (serve_workload.make_prompts). The warm-up,
one request of each prompt length at once, takes the server's first-of-each-size work out of the first rate.

The metrics follow vLLM's benchmark (vllm/benchmarks/serve.py and lib/endpoint_request_func.py in
github.com/vllm-project/vllm): TTFT from sending to the first content, ITL the gaps between content chunks, E2EL
from sending to the last content chunk, TPOT = (E2EL - TTFT) / (output tokens - 1). serve_report.py summarizes.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
from dataclasses import asdict, dataclass, field

from ..core.errors import MiniTransformerError
from ..core.metrics import now
from .serve_workload import ServeSettings, arrival_times, make_prompts


class BenchServeError(MiniTransformerError):
    """The server cannot be benchmarked at all (unreachable, no model, the warm-up request refused)."""


class SSEParser:
    """Incremental server-sent-events parser: feed it bytes as they arrive, get whole events' `data` back.

    A network read can end anywhere: inside a JSON object, between `\\r` and `\\n`, even inside a UTF-8 character,
    so bytes are decoded incrementally and only complete lines are interpreted. An event ends at a blank line; its
    data lines are joined with newlines (the SSE specification); comment lines (`:` first) are keep-alives.
    """

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._buffer = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += self._decoder.decode(chunk)
        events: list[str] = []
        while True:
            cut = self._buffer.find("\n")
            if cut < 0:
                return events
            line, self._buffer = self._buffer[:cut].rstrip("\r"), self._buffer[cut + 1:]
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
            # other fields (event:, id:, retry:) and comments carry nothing a completion needs

    def close(self) -> list[str]:
        """The last event when the stream ends without its blank line."""
        events = self.feed(b"\n\n" if self._buffer or self._data else b"")
        return events


@dataclass
class RequestRecord:
    """One request as the client saw it. Times in seconds from sending it; `error` set means it failed."""

    prompt_words: int
    sent_s: float = 0.0                      # when it was sent, from the start of the run
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    content_chunks: int = 0
    usage_reported: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; undefined for one token (goodput then counts it as 0, as vLLM)."""
        if not self.ok or self.output_tokens < 2 or self.e2el_s is None or self.ttft_s is None:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        return {**asdict(self), "tpot_s": self.tpot_s}


def build_payload(prompt: str, model: str, s: ServeSettings) -> dict:
    """The request body; `stream_options.include_usage` asks for the exact token count in a last chunk."""
    body = {"model": model, "max_tokens": s.max_tokens, "temperature": s.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if s.ignore_eos:
        body["ignore_eos"] = True            # a vLLM extension; servers that do not know it may ignore it
    if s.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _content(event: dict, endpoint: str) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    if endpoint == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def _error_message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace").strip()


async def send_request(client, url: str, payload: dict, endpoint: str, record: RequestRecord) -> RequestRecord:
    """POST one streaming request and fill `record`; every way it can fail ends in record.error, never raises."""
    import httpx

    start = last = now()
    parser, done = SSEParser(), False

    def handle(data: str):
        nonlocal last, done
        if data == "[DONE]":
            done = True
            return
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"server error in stream: {event['error']}")
        text, arrived = _content(event, endpoint), now()
        if text:
            if record.ttft_s is None:
                record.ttft_s = arrived - start
            else:
                record.itl_s.append(arrived - last)
            last = arrived
            record.content_chunks += 1
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            record.output_tokens, record.usage_reported = usage["completion_tokens"], True
            record.prompt_tokens = usage.get("prompt_tokens")

    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {_error_message(await response.aread())}"
                return record
            async for chunk in response.aiter_raw():
                for data in parser.feed(chunk):
                    handle(data)
            for data in parser.close():
                handle(data)
    except httpx.TimeoutException as exc:
        record.error = f"timed out ({type(exc).__name__})"
    except httpx.HTTPError as exc:
        record.error = f"disconnected: {type(exc).__name__}: {exc}"
    except (ValueError, RuntimeError) as exc:
        record.error = f"bad stream: {exc}"
    if record.error is None and not done:
        record.error = "the stream ended before data: [DONE]"
    if record.error is None and record.ttft_s is None:
        record.error = "no content in the stream"
    if record.error is None:
        record.e2el_s = last - start
        if not record.usage_reported:
            record.output_tokens = record.content_chunks       # one chunk per token: the usual streaming shape
    return record


def api_base(url: str) -> str:
    """`http://host:port`, `.../` and `.../v1` all mean the same server."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


async def first_model(client, base: str) -> str:
    """The first model GET /v1/models lists: what `--model` defaults to, as in vLLM's benchmark."""
    import httpx

    try:
        response = await client.get(f"{base}/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise BenchServeError(f"cannot list the models at {base}/v1/models ({type(exc).__name__}: {exc})") from None


async def run_rate(client, url: str, model: str, prompts: list[str], rate: float, s: ServeSettings,
                   on_done=None) -> tuple[list[RequestRecord], float]:
    """Send every prompt at its Poisson arrival time (at most max_concurrency in flight) -> (records, wall s).

    A request's clock starts when it is sent, after waiting for a concurrency slot, as vLLM's does; the wall time
    runs from the first send to the last answer, the denominator of every throughput.
    """
    times = arrival_times(rate, len(prompts), s.seed)
    slots = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency else None
    start = now()

    async def one(prompt: str, at: float) -> RequestRecord:
        await asyncio.sleep(max(0.0, start + at - now()))
        record = RequestRecord(prompt_words=len(prompt.split()))
        if slots:
            await slots.acquire()
        try:
            record.sent_s = now() - start
            await send_request(client, url, build_payload(prompt, model, s), s.endpoint, record)
        finally:
            if slots:
                slots.release()
        if on_done:
            on_done(record)
        return record

    records = await asyncio.gather(*(one(p, t) for p, t in zip(prompts, times)))
    return list(records), now() - start


def http_client(base: str, s: ServeSettings):
    """An httpx client for one server: up to the concurrency cap of connections, no proxy for a loopback address.

    Every request gets a connection of its own, closed after its response (as vLLM's benchmark client does: a new
    aiohttp session per request). llama-server drops kept-alive connections: of 400 streamed requests sent one
    after another on one connection, 50 failed as "Server disconnected without sending a response" (the server never
    saw them); with a fresh connection each, 0 of 400. A connect on loopback costs ~0.1 ms, the same for every
    server."""
    import httpx

    limits = httpx.Limits(max_connections=s.max_concurrency, max_keepalive_connections=0)
    timeout = httpx.Timeout(s.timeout_s, connect=10.0)
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # A proxy from the environment must not sit between us and a server on this machine.
    loopback = httpx.URL(base).host in ("127.0.0.1", "localhost", "::1")
    return httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers, trust_env=not loopback)


def warmup_prompts(s: ServeSettings) -> list[str]:
    """One prompt of each length the workload draws, from a round of prompts no measured rate sends."""
    by_length: dict[int, str] = {}
    for prompt in make_prompts(s.num_prompts, s.seed, s.prompt_words, round=len(s.rates)):
        by_length.setdefault(len(prompt.split()), prompt)
    return list(by_length.values())


async def _prepare(client, url: str, s: ServeSettings) -> dict:
    """A server's sweep before its first rate: base URL, model, endpoint, after an uncounted warm-up burst.

    The warm-up sends one request of each prompt length at once, each run to max_tokens: the server's first
    prefills of each size, its first batched decode steps and its first connections happen here, not in
    the first rate. (Measured on ours: once the prefix cache is out of the picture, little first-time work is left
    to take out; an Engine's first round page-faults ~1500 times, later ones ~0, and its wall time is no longer
    than theirs. A few requests are cheap insurance for servers that do more lazily.) Its prompts are a round of
    their own, so they leave nothing in the server's prefix cache that a measured rate would hit
    (serve_workload.make_prompts says why that matters)."""
    base = api_base(url)
    endpoint_url = f"{base}/v1/chat/completions" if s.endpoint == "chat" else f"{base}/v1/completions"
    model = s.model or await first_model(client, base)
    prompts = warmup_prompts(s)
    warm = await asyncio.gather(*(send_request(client, endpoint_url, build_payload(p, model, s), s.endpoint,
                                               RequestRecord(prompt_words=len(p.split()))) for p in prompts))
    failed = [r for r in warm if not r.ok]
    if failed:
        raise BenchServeError(f"the warm-up request to {endpoint_url} failed: {failed[0].error}")
    return {"url": base, "model": model, "endpoint": endpoint_url, "runs": []}


async def run_sweeps(urls: dict[str, str], s: ServeSettings, on_done=None, on_rate=None,
                     settle_s: float = 1.0) -> dict[str, dict]:
    """Several servers through every rate, in turns: at each rate every server runs once, and the order flips from
    one rate to the next (A B, B A, ...), so a slow spell of the machine falls on both rather than on one server's
    whole sweep. settle_s of idle before each run when there are several: a server's thread pools spin for a while
    after its burst ends. -> {name: {"url", "model", "endpoint", "runs": [{"rate", "wall_s", "records"}]}}."""
    import contextlib

    async with contextlib.AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(http_client(api_base(url), s)) for name, url in urls.items()}
        sweeps = {name: await _prepare(clients[name], url, s) for name, url in urls.items()}
        names = list(urls)
        for i, rate in enumerate(s.rates):
            for name in (names if i % 2 == 0 else names[::-1]):
                if len(names) > 1:
                    await asyncio.sleep(settle_s)
                if on_rate:
                    on_rate(rate, name)
                prompts = make_prompts(s.num_prompts, s.seed, s.prompt_words, round=i)   # fresh text each rate
                records, wall = await run_rate(clients[name], sweeps[name]["endpoint"], sweeps[name]["model"],
                                               prompts, rate, s, on_done)
                sweeps[name]["runs"].append({"rate": rate, "wall_s": wall, "records": records})
    return sweeps


async def run_sweep(url: str, s: ServeSettings, on_done=None, on_rate=None) -> dict:
    """One server through every rate: {"url", "model", "endpoint", "runs": [{"rate", "wall_s", records}]}."""
    sweeps = await run_sweeps({"server": url}, s, on_done, on_rate and (lambda rate, name: on_rate(rate)))
    return sweeps["server"]
