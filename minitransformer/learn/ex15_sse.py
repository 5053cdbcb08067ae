"""Exercise 15: the server's Server-Sent Events framing (server/responses.py's sse), plugged into a real server."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

from ..core.metrics import now
from ..server import app, responses
from .track import CheckFailed, Exercise, plugged, real_model

PROMPT, MAX_TOKENS = "The capital of France is", 8
CHUNKS = ({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " café\nau lait",
                                                                     "finish_reason": None}]},
          {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8}},
          "[DONE]")


def _one_newline(data):
    return "data: " + (data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)) + "\n"


def _pretty(data):
    return "data: " + (data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, indent=2)) + "\n\n"


def _no_prefix(data):
    return (data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)) + "\n\n"


MISTAKES = (
    ("the blank line is missing: an event ends with \"\\n\\n\" (its line, then an empty line); with one \"\\n\" the "
     "next event's data joins this one", _one_newline),
    ("the JSON is pretty-printed: its newlines split the event into lines the client reads as separate fields; "
     "json.dumps without indent keeps it on one line", _pretty),
    ("the \"data: \" prefix is missing: a client ignores a line whose field it does not know", _no_prefix),
)

# How each mistake shows in an event, whatever else it does (ensure_ascii or not, spaces after the colons):
SIGNS = (
    lambda event: event.startswith("data:") and "\n" not in event[:-1] and not event.endswith("\n\n"),
    lambda event: event.startswith("data:") and "\n" in event.rstrip("\n"),
    lambda event: not event.startswith("data:"),
)


def client_events(stream: str) -> list[str]:
    """What an SSE client (the HTML spec's parser, as EventSource and the openai package read it) gets from a stream:
    the data of each event, its `data:` lines joined with newlines, dispatched at each blank line."""
    events: list[str] = []
    data: list[str] = []
    for line in stream.split("\n"):
        if line == "":
            if data:
                events.append("\n".join(data))
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return events


def _parsed(events: list[str]) -> list:
    """Each event's JSON (or its text where it is not JSON: "[DONE]", or a broken event)."""
    out = []
    for event in events:
        try:
            out.append(json.loads(event))
        except json.JSONDecodeError:
            out.append(event)
    return out


def _stage1(sse) -> None:
    for data in CHUNKS:
        got = sse(data)
        if not isinstance(got, str):
            raise CheckFailed(f"sse({data!r}) must return a str (the server encodes it), got {type(got).__name__}")
        expected = responses.sse(data)
        ok = _parsed(client_events(got * 2)) == _parsed(client_events(expected * 2))   # two in a row, as sent
        if ok and got.endswith("\n\n") and "\n" not in got[:-2]:
            continue
        named = next((f". Likely mistake: {label}" for (label, _), shows in zip(MISTAKES, SIGNS) if shows(got)), "")
        raise CheckFailed(f"sse({data!r}) gave {got!r}; the engine's event is {expected!r}: a client reading two of "
                          f"yours in a row gets {client_events(got * 2)!r}{named}")


@contextlib.contextmanager
def _server():
    """The real server on the real model, in this process: uvicorn in a thread on a free loopback port."""
    import uvicorn

    from ..server import EngineLoop, Server, ServerConfig, ServerMetrics
    from ..serving.engine import Engine
    server = Server(real_model(), EngineLoop(Engine(real_model(), max_num_seqs=2), ServerMetrics("smollm2")),
                    ServerConfig("smollm2"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    web = uvicorn.Server(uvicorn.Config(server.app(), log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = now() + 60
    while not web.started and thread.is_alive() and now() < deadline:
        time.sleep(0.05)
    try:
        if not web.started:
            raise CheckFailed("the server for stage 2 did not start within 60 s (this is the engine's side, not your "
                              "function's)")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        web.should_exit = True
        thread.join(30)
        sock.close()


def _stream(url: str) -> tuple[str, list[str]]:
    import httpx
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        raw = "".join(response.iter_text())
    texts = []
    for event in client_events(raw):
        if event == "[DONE]":
            texts.append("[DONE]")
            continue
        try:
            chunk = json.loads(event)
        except json.JSONDecodeError:
            raise CheckFailed(f"the client could not parse an event of your stream as JSON: {event[:200]!r}") \
                from None
        texts += [choice.get("text", "") for choice in chunk.get("choices", [])]
    return raw, texts


def check(sse) -> list[str]:
    _stage1(sse)
    with _server() as url:
        _, expected = _stream(url)                                   # the server's own framing
        with plugged(app, "sse", sse), plugged(app, "SSE_DONE", sse("[DONE]")):
            raw, got = _stream(url)
    if got != expected:
        raise CheckFailed(f"streaming {PROMPT!r} ({MAX_TOKENS} tokens) from the real server with your sse, the client "
                          f"parsed the deltas {got!r}; with the server's own: {expected!r}")
    return [f"your sse framed every event of a real server's stream (uvicorn on 127.0.0.1, the real model): "
            f"{raw.count(chr(10) + chr(10))} events, {len(raw.encode())} bytes",
            f"the client parsed the same {len(got) - 1} text deltas and [DONE] as with the server's own framing: "
            f"{''.join(got[:-1])!r}"]


EXERCISE = Exercise(
    number=15, name="sse", title="Streaming: Server-Sent Events", function="sse",
    solution="minitransformer/server/responses.py: sse (and SSE_DONE; called by server/app.py's _events for every "
             "streamed chunk)",
    question="How does an OpenAI-compatible server stream tokens to the client, and what ends the stream?",
    lesson="lessons/06_stopping_and_streaming.py (streaming deltas); docs/ARCHITECTURE.md (the server)",
    hints=(
        "A dict becomes json.dumps(data, ensure_ascii=False); a str (\"[DONE]\") stays as it is.",
        "Prefix it with \"data: \" and end it with \"\\n\\n\": a line, then the blank line that ends the event.",
    ),
    check=check, reference=responses.sse, mistakes=MISTAKES,
)
