"""`minitransformer serve` under attack, one section per defect found by probing it as an attacker and a careless
client would: each test sends what the attacker sent to a real server process and checks the answer.

 1. costs bounded per request    stop strings, stop_token_ids, logit_bias and the prompt are capped (400 naming it);
                                 a bystander's step CPU time with four neighbours at the caps (in-process)
 2. loopback stays loopback      a Host the server does not answer to is a 403 (DNS rebinding)
 3. graceful shutdown            SIGTERM / Ctrl-C: 503 for new requests, running ones end with their final chunk,
                                 exit 0; a second signal during the drain ends them at once, the same way, one line
 4. cross-site requests          JSON routes take only application/json (415); CORS only for --allowed-origins
 5. connection hygiene           a request head and its body must arrive in time (one line per closed connection);
                                 --limit-concurrency; out of file descriptors
 6. tenants apart                prefix cache salted per tenant, /metrics and the events need a key, random ids; the
                                 events show another tenant's requests and steps as occupancy, the totals to operators
 7. quotas that tell the truth   never-fitting requests are 400s; chat's default max_tokens fits the quota
 8. 400, not 500                 deep JSON, numbers no float can hold
 9. HEAD on the event stream     answers its headers and ends
10. CLI messages                 GGUF version, chat --system, serve checks its address before loading
11. error objects everywhere     404 and 405 as OpenAI's error object

Servers are started by fixtures on free loopback ports (server_process.py) and stopped afterwards; each fixture fails
its tests if the server logged a traceback. Nothing here asserts on wall-clock time: waits are bounded, and the one
cost comparison (section 1) is CPU time measured in-process, as a ratio within one run.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from minitransformer import SamplingParams
from minitransformer.core.errors import InputError
from minitransformer.core.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from minitransformer.serving import Engine
from server_process import (
    Stream,
    address,
    assert_error,
    metric,
    post,
    read_to_close,
    running_server,
    server_to_signal,
    sse_payloads,
    wait_for,
)

REAL = "SmolLM2-135M-Instruct.Q4_1"
MISSING = "/nonexistent/model.gguf"      # options checked before the model loads are tried with this path
JSON = {"Content-Type": "application/json"}


# ---------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def plain(tiny_model_path):
    """The tiny model with the defaults, but a 2 s request-head deadline so the connection tests are short."""
    with running_server("--model", str(tiny_model_path), "--header-timeout", "2", "--log-level", "warning") as server:
        yield server


@pytest.fixture(scope="module")
def configured(tiny_model_path):
    """The tiny model with more names, one allowed web origin and at most 4 connections."""
    with running_server("--model", str(tiny_model_path), "--allowed-hosts", "my.box,Other.Box",
                        "--allowed-origins", "http://app.example", "--limit-concurrency", "4",
                        "--header-timeout", "2", "--log-level", "warning") as server:
        yield server


KEYS = {"sk-alice": {"tenant": "alice", "quota_tokens": 300}, "sk-bob": {"tenant": "bob"},
        "sk-carol": {"tenant": "carol", "cache_salt": "team"}, "sk-dave": {"tenant": "dave", "cache_salt": "team"}}
ALICE, BOB, CAROL, DAVE = ({"Authorization": f"Bearer sk-{n}"} for n in ("alice", "bob", "carol", "dave"))
OPS = {"Authorization": "Bearer sk-ops"}


@pytest.fixture(scope="module")
def keyed(real_model_path, tmp_path_factory):
    """The real model with tenants (alice has a quota, carol and dave share a cache salt) and an operator key."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    with running_server("--model", str(real_model_path), "--api-keys", str(keys), "--metrics-key", "sk-ops",
                        "--max-num-seqs", "2", "--num-blocks", "256", "--log-level", "warning") as server:
        yield server


# ---------------------------------------------------------------------------------------------------- helpers

def raw(server, data: bytes, timeout_s: float = 30) -> bytes:
    """Send bytes on a fresh connection and read until the server closes it."""
    with socket.create_connection(address(server), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def read_head(sock: socket.socket) -> bytes:
    """A response's status line and headers (a HEAD response has nothing after them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def generated(server, headers=None) -> float:
    return metric(server, "vllm:generation_tokens_total", headers)


# ============================================================================ 1. costs bounded per request

def test_the_issues_stop_list_of_200000_strings_is_a_400_naming_the_cap(plain):
    body = {"prompt": "hi", "max_tokens": 100, "stream": True, "ignore_eos": True, "stop": ["~"] * 200_000}
    before = generated(plain)
    assert_error(post(plain, body), 400, "stop has 200000 strings", f"at most {MAX_STOP_STRINGS}", param="stop")
    assert generated(plain) == before                                       # refused before any work


CAPS = [
    ("stop count", {"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop", f"at most {MAX_STOP_STRINGS}"),
    ("stop length", {"stop": ["y" * (MAX_STOP_CHARS + 1)]}, "stop", f"at most {MAX_STOP_CHARS}"),
    ("stop_token_ids", {"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids",
     f"at most {MAX_STOP_TOKEN_IDS}"),
    ("logit_bias", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "at most 300"),
    ("prompt chars", {"prompt": "a" * (128 * 16 + 1)}, "prompt", "at most 2048"),
    ("prompt ids", {"prompt": [5] * 128}, "prompt", "at most 127 token ids"),
]


@pytest.mark.parametrize("name, fields, param, words", CAPS, ids=[c[0] for c in CAPS])
def test_a_request_over_a_cap_is_a_400_naming_the_field_and_the_cap(plain, name, fields, param, words):
    assert_error(post(plain, {"prompt": "hi", "max_tokens": 2, **fields}), 400, words, param=param)


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user", "content": "hi"}] * 65, "messages has 65 messages; at most 64"),
    ([{"role": "user", "content": "b" * 2100}], "at most 2048 are accepted"),
], ids=["count", "chars"])
def test_chat_messages_over_their_caps_are_400s(plain, messages, words):
    assert_error(post(plain, {"messages": messages, "max_tokens": 2}, "/v1/chat/completions"), 400, words,
                 param="messages")


def test_a_request_at_every_cap_is_served(plain):
    stops = [chr(0x4E00 + i) * (MAX_STOP_CHARS // MAX_STOP_STRINGS) for i in range(MAX_STOP_STRINGS)]
    body = {"prompt": "the cat", "max_tokens": 8, "ignore_eos": True, "stop": stops,
            "stop_token_ids": list(range(200, 200 + MAX_STOP_TOKEN_IDS)), "logit_bias": {}}
    response = post(plain, body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


def test_logit_bias_within_the_cap_is_refused_as_unsupported_not_ignored(plain):
    assert_error(post(plain, {"prompt": "hi", "logit_bias": {"5": -100}}), 400, "not supported", param="logit_bias")


@pytest.mark.parametrize("fields, words", [
    ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop has 65 strings"),
    ({"stop": ["z" * 3000, "w" * 1200]}, "stop strings have 4200 characters"),
    ({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids has 65 ids"),
], ids=["count", "chars", "ids"])
def test_the_caps_hold_in_the_python_api_too(fields, words):
    with pytest.raises(InputError, match=words):
        SamplingParams(**fields)


def decode_step_cpu(engine: Engine, prompt: str, neighbour: SamplingParams, max_tokens: int):
    """One bystander and four neighbours run to the end: the CPU seconds of each step where all five decode, and
    the neighbours' finished texts."""
    bystander = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("The history of the old city begins", bystander)
    neighbours = [engine.add_request(prompt, neighbour) for _ in range(4)]
    times, texts = [], {}
    while engine.has_unfinished_requests():
        start = time.process_time()
        outputs = engine.step()
        record = engine.step_log[-1]
        if record.num_decode_tokens == 5 and record.num_prefill_tokens == 0:
            times.append(time.process_time() - start)
        texts.update({o.request_id: o.result.text for o in outputs if o.finished and o.request_id in neighbours})
    return times, list(texts.values())


def test_hostile_neighbours_at_the_caps_barely_slow_a_bystanders_steps(real_model):
    """The issue's attack within the caps: four neighbours whose 64 stop strings (4096 characters) each nearly match
    their own output, so every token runs the longest stop check the caps allow (every string searched, a long tail
    held back). A step is one inter-token interval of the bystander; its CPU time with these neighbours stays close
    to its CPU time with four plain ones (the uncapped list took it from ~90 ms to ~1,400 ms)."""
    engine = Engine(real_model, max_num_seqs=8, num_blocks=64)
    prompt, tokens = "Write a short story about a lighthouse keeper.", 40
    plain_params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(prompt, plain_params)
    text = next(iter(engine.run().values())).text
    width = MAX_STOP_CHARS // MAX_STOP_STRINGS
    assert len(text) >= MAX_STOP_STRINGS + width, text
    # each a piece of the output plus a character it never contains: all match partially, none ever completes
    stops = [text[i:i + width - 1] + "\x07" for i in range(MAX_STOP_STRINGS)]
    hostile = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, stop=stops)
    calm, attacked = [], []
    for _ in range(3):                                            # interleaved, so drift hits both alike
        times, _ = decode_step_cpu(engine, prompt, plain_params, tokens)
        calm += times
        times, texts = decode_step_cpu(engine, prompt, hostile, tokens)
        attacked += times
        assert texts == [text] * 4                                # no stop ever completed: every check ran in full
    ratio = statistics.median(attacked) / statistics.median(calm)
    print(f"median decode step CPU: {statistics.median(calm) * 1e3:.1f} ms with plain neighbours, "
          f"{statistics.median(attacked) * 1e3:.1f} ms with hostile ones at the caps ({ratio:.2f}x)")
    assert ratio < 1.5, ratio


# ============================================================================ 2. loopback stays loopback

@pytest.mark.parametrize("method, path", [("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/"),
                                          ("GET", "/v1/engine/events"), ("GET", "/health"), ("GET", "/metrics")])
def test_a_forged_host_is_a_403_on_every_route(plain, method, path):
    with httpx.stream(method, plain.url + path, headers={"Host": "evil.example:80", **JSON},
                      json={"prompt": "hi"} if method == "POST" else None, timeout=30) as response:
        assert response.status_code == 403                  # checked first: the events would stream forever
        response.read()
    assert_error(response, 403, "'evil.example'", "--allowed-hosts", code="host_not_allowed")


def test_a_rebinding_page_cannot_make_the_server_generate(plain):
    """What a page on evil.example sends once its name resolves to 127.0.0.1: its own Host and Origin."""
    before = generated(plain)
    body = json.dumps({"prompt": "the cat", "max_tokens": 20}).encode()
    reply = raw(plain, b"POST /v1/completions HTTP/1.1\r\nHost: evil.example:%d\r\nOrigin: http://evil.example:%d\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (address(plain)[1], address(plain)[1], len(body), body))
    assert reply.startswith(b"HTTP/1.1 403") and b"host_not_allowed" in reply, reply
    assert generated(plain) == before


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST.",
                                  "127.0.0.1"])
def test_the_loopback_names_are_served(plain, host):
    host = host.format(port=address(plain)[1])
    assert httpx.get(plain.url + "/health", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host, status", [("my.box", 200), ("other.box:8080", 200), ("evil.example", 403),
                                          ("box", 403), ("10.1.2.3:8000", 200), ("[fe80::1]", 200)])
def test_allowed_hosts_adds_names_and_any_ip_address_passes(configured, host, status):
    assert httpx.get(configured.url + "/health", headers={"Host": host}).status_code == status


# ============================================================================ 3. graceful shutdown

LONG = {"prompt": "Write a very long story about a dragon and a lighthouse.", "max_tokens": 4000, "temperature": 0,
        "ignore_eos": True}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_running_requests_with_their_partial_text_and_exits_0(real_model_path, signum):
    with server_to_signal("--model", str(real_model_path), "--shutdown-timeout", "4", "--log-level", "info") as server:
        streams = [Stream(server, {**LONG, "stream": True, "stream_options": {"include_usage": True}})
                   for _ in range(2)]
        for stream in streams:
            stream.start()
        whole: dict = {}

        def post_whole():
            try:
                whole["response"] = post(server, LONG)
            except httpx.HTTPError as exc:                    # reported by the assertion below
                whole["response"] = exc

        waiter = threading.Thread(target=post_whole, daemon=True)
        waiter.start()
        assert all(s.running.wait(120) for s in streams)
        assert wait_for(lambda: metric(server, "vllm:num_requests_running") == 3, 60)
        server.process.send_signal(signum)
        assert server.wait_for_log("shutting down: new requests get 503")
        refused = post(server, {"prompt": "Hi", "max_tokens": 2})             # the socket still listens
        for thread in (*streams, waiter):
            thread.join(60)
        assert server.process.wait(60) == 0
    log = server.log
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert_error(refused, 503, "shutting down", code="server_shutting_down")
    for stream in streams:
        assert stream.error is None and stream.payloads[-1] == "[DONE]", stream.payloads[-3:]
        chunks = stream.chunks()
        last = [c for c in chunks if c["choices"]][-1]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == ("abort", "shutdown")
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text and 0 < chunks[-1]["usage"]["completion_tokens"] < 4000
    assert_error(whole["response"], 503, "shut down before this request finished", code="server_shutting_down")
    assert "shutting down: ending the 3 requests still running" in log, log
    free = re.search(r"the engine stopped; (\d+) of (\d+) KV blocks free", log)
    assert free and free.group(1) == free.group(2), log


def test_a_second_signal_during_the_drain_ends_every_stream_with_its_final_chunk_and_one_line(real_model_path):
    """The drain would wait 60 s for the running streams; a second Ctrl-C ends them now, each with its final chunk
    and [DONE] (not cut mid-write as uvicorn's forced exit cuts them), one log line, no traceback, exit 0."""
    with server_to_signal("--model", str(real_model_path), "--shutdown-timeout", "60", "--log-level", "info") as server:
        streams = [Stream(server, {**LONG, "stream": True}) for _ in range(2)]
        for stream in streams:
            stream.start()
        assert all(s.running.wait(120) for s in streams)
        server.process.send_signal(signal.SIGINT)
        assert server.wait_for_log("shutting down: new requests get 503")
        server.process.send_signal(signal.SIGINT)
        for stream in streams:
            stream.join(30)
        assert server.process.wait(30) == 0                   # well before the 60 s the drain would have waited
    log = server.log
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert log.count("a second signal") == 1, log
    for stream in streams:
        assert stream.error is None and stream.payloads[-1] == "[DONE]", stream.payloads[-3:]
        last = [c for c in stream.chunks() if c["choices"]][-1]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == ("abort", "shutdown")
    free = re.search(r"the engine stopped; (\d+) of (\d+) KV blocks free", log)
    assert free and free.group(1) == free.group(2), log


def test_a_request_that_finishes_within_the_shutdown_timeout_completes(real_model_path):
    with server_to_signal("--model", str(real_model_path), "--shutdown-timeout", "120",
                          "--log-level", "info") as server:
        stream = Stream(server, {**LONG, "max_tokens": 24, "stream": True})
        stream.start()
        assert stream.running.wait(120)
        server.process.send_signal(signal.SIGTERM)
        stream.join(120)
        assert server.process.wait(120) == 0
    assert stream.error is None and stream.payloads[-1] == "[DONE]"
    chunks = stream.chunks()
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "shutting down: no request is running" in server.log and "Traceback" not in server.log


# ============================================================================ 4. cross-site requests

@pytest.mark.parametrize("content_type", ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_a_page_can_send_without_a_preflight_is_a_415(plain, content_type):
    before = generated(plain)
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(plain.url + "/v1/completions", content=json.dumps({"prompt": "hi"}), headers=headers)
    assert_error(response, 415, "application/json", code="unsupported_media_type")
    assert generated(plain) == before


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/v1/chat/completions"])
def test_every_json_route_wants_json(plain, path):
    response = httpx.post(plain.url + path, content=b'{"tokens": [1]}', headers={"Content-Type": "text/plain"})
    assert_error(response, 415, "application/json", code="unsupported_media_type")


def test_json_with_a_charset_is_json(plain):
    response = httpx.post(plain.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}',
                          headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 200, response.text


def test_no_cors_headers_without_allowed_origins(plain):
    origin = {"Origin": "http://evil.example"}
    got = httpx.get(plain.url + "/v1/models", headers=origin)
    assert got.status_code == 200 and "access-control-allow-origin" not in got.headers
    preflight = httpx.options(plain.url + "/v1/completions", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert_error(preflight, 405, "OPTIONS is not allowed", code="method_not_allowed")
    assert "access-control-allow-origin" not in preflight.headers


def test_an_allowed_origin_gets_its_preflight_and_its_replies(configured):
    origin = {"Origin": "http://app.example"}
    preflight = httpx.options(configured.url + "/v1/completions", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "Content-Type" in preflight.headers["access-control-allow-headers"]
    reply = post(configured, {"prompt": "hi", "max_tokens": 2}, headers=origin)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "http://app.example"
    other = post(configured, {"prompt": "hi", "max_tokens": 2}, headers={"Origin": "http://evil.example"})
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


# ============================================================================ 5. connection hygiene

def test_a_connection_that_never_sends_a_request_is_closed(plain):
    with socket.create_connection(address(plain), timeout=30) as sock:
        assert sock.recv(1) == b""                          # closed by the server (a timeout would raise)


def test_a_request_head_that_stops_halfway_is_closed(plain):
    with socket.create_connection(address(plain), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert sock.recv(1) == b""


def test_after_a_response_a_half_sent_next_head_is_closed_too(plain):
    with socket.create_connection(address(plain), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")             # keep-alive's idle timer stops when bytes arrive
        rest = read_to_close(sock)
        assert b"HTTP/1.1" not in rest[len(b'{"status":"ok"}'):], rest


def test_a_head_sent_in_pieces_in_time_is_served(plain):
    with socket.create_connection(address(plain), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        sock.sendall(b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert read_to_close(sock).startswith(b"HTTP/1.1 200")


def test_connections_past_the_limit_get_a_503_error_object(configured):
    assert wait_for(lambda: httpx.get(configured.url + "/health").status_code == 200, 30)
    silent = [socket.create_connection(address(configured), timeout=30) for _ in range(4)]
    try:
        time.sleep(0.2)                                       # let the server accept them
        reply = raw(configured, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    finally:
        for sock in silent:
            sock.close()
    assert reply.startswith(b"HTTP/1.1 503"), reply
    error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "too_many_connections" and "--limit-concurrency" in error["message"]
    assert wait_for(lambda: httpx.get(configured.url + "/health").status_code == 200, 30)


SLOW_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{\"prompt\": \"h")         # a complete head, 13 bytes, then nothing


def test_bodies_that_stop_arriving_are_closed_after_the_body_timeout_with_one_line_each(tiny_model_path):
    with running_server("--model", str(tiny_model_path), "--header-timeout", "1", "--body-timeout", "1",
                        "--log-level", "warning") as server:
        slow = [socket.create_connection(address(server), timeout=30) for _ in range(30)]
        try:
            for sock in slow:
                sock.sendall(SLOW_BODY)
            assert [read_to_close(sock) for sock in slow] == [b""] * 30       # closed by the server, nothing owed
        finally:
            for sock in slow:
                sock.close()
        closed = "whose request body did not arrive within 1s (--body-timeout)"
        assert wait_for(lambda: server.log.count(closed) == 30, 10), server.log
        assert post(server, {"prompt": "the cat", "max_tokens": 2}).status_code == 200
    assert "ClientDisconnect" not in server.log


def test_a_body_sent_in_pieces_within_the_body_timeout_is_served(tiny_model_path):
    body = json.dumps({"prompt": "the cat", "max_tokens": 2}).encode()
    with running_server("--model", str(tiny_model_path), "--body-timeout", "3", "--log-level", "warning") as server:
        with socket.create_connection(address(server), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            for piece in (body[:10], body[10:20], body[20:]):
                time.sleep(0.5)
                sock.sendall(piece)
            reply = read_to_close(sock)
    assert reply.startswith(b"HTTP/1.1 200"), reply


def test_out_of_file_descriptors_is_one_line_and_the_server_recovers(tiny_model_path):
    """100 silent connections against a 48-descriptor limit: accepts fail, which is logged once (not a traceback per
    attempt), and the request-head deadline frees the descriptors, so /health is answered while they stay open."""
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    with running_server("--model", str(tiny_model_path), "--header-timeout", "1", "--log-level", "warning",
                        preexec_fn=low_limit) as server:
        silent = []
        try:
            for _ in range(100):
                silent.append(socket.create_connection(address(server), timeout=30))
            assert server.wait_for_log("out of file descriptors", 30), server.log
            assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        finally:
            for sock in silent:
                sock.close()
    assert server.log.count("out of file descriptors") <= 3, server.log


# ============================================================================ 9. HEAD on the event stream

def test_head_on_the_events_answers_and_keeps_the_connection_usable(plain):
    with socket.create_connection(address(plain), timeout=30) as sock:
        sock.sendall(b"HEAD /v1/engine/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        rest = read_to_close(sock)
    assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b'{"status":"ok"}'), rest


def test_head_on_the_events_with_connection_close_ends(plain):
    reply = raw(plain, b"HEAD /v1/engine/events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n")


# ============================================================================ 6. tenants apart (and 7. quotas)

SECRET = "The launch code for project Nightingale is seven four two, and the vault opens at dawn on Friday."
WRONG = "The launch code for project Nightingale is nine nine one, and the vault opens at noon on Monday."


def hits(server) -> float:
    return metric(server, "vllm:prefix_cache_hits_total", OPS)


def test_a_tenant_cannot_probe_anothers_prompt_through_the_prefix_cache(keyed):
    assert post(keyed, {"prompt": SECRET, "max_tokens": 1}, headers=ALICE).status_code == 200
    start = hits(keyed)
    assert post(keyed, {"prompt": SECRET, "max_tokens": 1}, headers=BOB).status_code == 200     # the right guess
    right = hits(keyed) - start
    assert post(keyed, {"prompt": WRONG, "max_tokens": 1}, headers=BOB).status_code == 200      # a wrong one
    wrong = hits(keyed) - start - right
    assert right == wrong == 0
    assert post(keyed, {"prompt": SECRET, "max_tokens": 1}, headers=ALICE).status_code == 200   # her own cache works
    assert hits(keyed) - start >= 16


def test_tenants_that_share_a_cache_salt_share_the_cache(keyed):
    prompt = "Team handbook, chapter one: every review starts with the tests, and every test starts with a claim."
    assert post(keyed, {"prompt": prompt, "max_tokens": 1}, headers=CAROL).status_code == 200
    start = hits(keyed)
    assert post(keyed, {"prompt": prompt, "max_tokens": 1}, headers=DAVE).status_code == 200
    assert hits(keyed) - start >= 16


@pytest.mark.parametrize("headers, status", [({}, 401), (ALICE, 401), ({"Authorization": "Bearer sk-eve"}, 401),
                                             (OPS, 200)], ids=["none", "tenant", "wrong", "metrics-key"])
def test_with_a_metrics_key_only_it_reads_metrics(keyed, headers, status):
    response = httpx.get(keyed.url + "/metrics", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert_error(response, 401, "--metrics-key", code="invalid_api_key")


def test_with_api_keys_alone_metrics_need_a_key(tiny_model_path, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-x": {"tenant": "x"}}))
    with running_server("--model", str(tiny_model_path), "--api-keys", str(keys), "--log-level", "warning") as server:
        assert_error(httpx.get(server.url + "/metrics"), 401, "missing API key", code="invalid_api_key")
        assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer sk-x"}).status_code == 200


def events_with_steps(server, headers) -> dict:
    """The first event of the engine's stream that carries steps (the first snapshot may have none yet)."""
    with httpx.stream("GET", server.url + "/v1/engine/events", headers=headers, timeout=60) as response:
        assert response.status_code == 200
        return next(event for event in map(json.loads, sse_payloads(response)) if event["steps"])


def test_the_events_show_a_tenant_only_its_own_requests(keyed):
    body = {**LONG, "stream": True}
    with httpx.Client(timeout=120, headers=BOB) as http, http.stream("POST", keyed.url + "/v1/completions",
                                                                     json=body) as running:
        lines = running.iter_lines()                  # kept: a dropped iterator closes the connection (an abort)
        bob_id = json.loads(next(line for line in lines if line.startswith("data: "))[6:])["id"]
        alice_sees, ops_sees = events_with_steps(keyed, ALICE), events_with_steps(keyed, OPS)
        assert_error(httpx.get(keyed.url + "/v1/engine/events"), 401, "missing API key", code="invalid_api_key")
    other = [s for s in alice_sees["running"] if s["id"] is None]
    assert other and set(other[0]) == {"id", "tenant", "status", "num_blocks"} and other[0]["num_blocks"] > 0
    assert bob_id.removeprefix("cmpl-") not in json.dumps(alice_sees)
    assert [s["tenant"] for s in ops_sees["running"]] == ["bob"]
    assert ops_sees["running"][0]["id"] == bob_id.removeprefix("cmpl-") and ops_sees["running"][0]["prompt_tokens"]
    # bob's steps are occupancy to alice (how many ran, how long), not his prompt and decode token counts
    assert all(step["prefill_tokens"] is None and step["decode_tokens"] is None for step in alice_sees["steps"])
    assert all(step["num_seqs"] >= 1 for step in alice_sees["steps"])
    assert any(step["decode_tokens"] for step in ops_sees["steps"])
    # and of the engine's counters, only its occupancy: the totals are what --metrics-key keeps off /metrics
    assert set(alice_sees["stats"]) == {"num_running_reqs", "num_waiting_reqs", "kv_cache_usage", "num_free_blocks",
                                        "num_blocks"}
    assert {"num_generation_tokens", "num_prompt_tokens", "prefix_cache_hits"} <= set(ops_sees["stats"])


def test_request_ids_are_random(keyed):
    ids = [post(keyed, {"prompt": "Hi", "max_tokens": 1}, headers=BOB).json()["id"] for _ in range(3)]
    assert len(set(ids)) == 3 and all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids), ids


def test_a_request_larger_than_the_whole_quota_is_a_400_without_retry_after(keyed):
    response = post(keyed, {"prompt": "Hi", "max_tokens": 400}, headers=ALICE)
    assert_error(response, 400, "quota of 300", "can never run", param="max_tokens", code="quota_exceeded")
    assert "retry-after" not in response.headers


def test_chats_default_max_tokens_fits_the_quota(keyed):
    response = post(keyed, {"messages": [{"role": "user", "content": "Say hello."}]}, "/v1/chat/completions",
                    headers=ALICE)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["total_tokens"] <= 300


def test_a_quota_held_by_running_requests_is_a_429_with_retry_after(keyed):
    with httpx.Client(timeout=120, headers=ALICE) as http, http.stream(
            "POST", keyed.url + "/v1/completions", json={**LONG, "max_tokens": 250, "stream": True}) as running:
        lines = running.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        refused = post(keyed, {"prompt": "Hi", "max_tokens": 60}, headers=ALICE)
    assert_error(refused, 429, "quota of 300", "retry when they finish", code="quota_exceeded")
    assert refused.headers["retry-after"] == "1"


def test_a_keys_file_with_a_bad_cache_salt_is_one_line(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-a": {"tenant": "a", "cache_salt": 5}}))
    one_line(cli("serve", "--api-keys", str(keys), "--model", MISSING), "cache_salt must be a non-empty string")


# ============================================================================ 8. 400, not 500

@pytest.mark.parametrize("body", [b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                  b'{"a": ' * 100_000 + b"1" + b"}" * 100_000], ids=["arrays", "objects"])
def test_json_nested_too_deeply_is_a_400(plain, body):
    response = httpx.post(plain.url + "/v1/completions", content=body, headers=JSON)
    assert_error(response, 400, "nested too deeply")


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty"])
def test_an_integer_no_float_can_hold_is_a_400(plain, field):
    assert_error(post(plain, {"prompt": "hi", field: 10**400}), 400, "a float can hold", "401 digits", param=field)


@pytest.mark.parametrize("field, status, param", [("top_k", 200, None), ("seed", 200, None), ("priority", 200, None),
                                                  ("min_tokens", 400, "min_tokens"), ("logprobs", 400, "logprobs"),
                                                  ("n", 400, "n"), ("max_tokens", 400, "max_tokens")])
def test_huge_integers_elsewhere_are_served_or_refused_never_a_500(plain, field, status, param):
    response = post(plain, {"prompt": "hi", "max_tokens": 2, field: 10**400})
    assert response.status_code == status, response.text
    if status == 400:
        assert_error(response, 400, param=param)


def test_a_number_too_long_to_parse_and_an_infinite_one_are_400s(plain):
    long = httpx.post(plain.url + "/v1/completions", content=b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}",
                      headers=JSON)
    assert_error(long, 400, "not valid JSON", "4300 digits")
    infinite = httpx.post(plain.url + "/v1/completions", content=b'{"prompt": "hi", "temperature": 1e400}',
                          headers=JSON)
    assert_error(infinite, 400, "temperature must be finite", param="temperature")


# ============================================================================ 11. error objects everywhere

@pytest.mark.parametrize("method, path, status", [
    ("GET", "/nope", 404), ("GET", "/v1/chat", 404), ("GET", "/static/missing.js", 404),
    ("GET", "/v1/completions", 405), ("DELETE", "/health", 405), ("PUT", "/v1/models", 405), ("POST", "/metrics", 405),
])
def test_unknown_routes_and_methods_are_error_objects(plain, method, path, status):
    response = httpx.request(method, plain.url + path)
    code = {404: "not_found", 405: "method_not_allowed"}[status]
    assert_error(response, status, path, code=code)
    if status == 405:
        assert response.headers["allow"]


# ============================================================================ 10. CLI messages

def cli(*args: str | bytes, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitransformer", *args], input=stdin.encode(),
                          capture_output=True, timeout=300)


def one_line(result: subprocess.CompletedProcess, message: str) -> str:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, (result.returncode, stderr)
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1 and message in stderr, stderr
    return stderr


def test_a_gguf_of_an_unknown_version_says_so(tiny_model_path, tmp_path):
    newer = tmp_path / "newer.gguf"
    shutil.copy(tiny_model_path, newer)
    with open(newer, "r+b") as f:
        f.seek(4)
        f.write((99).to_bytes(4, "little"))
    stderr = one_line(cli("generate", "hi", "--model", str(newer)), "is GGUF version 99")
    assert "truncated" not in stderr and "download it again" not in stderr


def test_chat_refuses_a_system_prompt_that_is_not_text(tiny_model_path):
    one_line(cli("chat", "--system", b"\xff\xfe", "--model", str(tiny_model_path), stdin="hi\n"),
             "--system must be valid Unicode text")


def test_chat_refuses_a_system_prompt_that_leaves_no_room(tiny_model_path):
    one_line(cli("chat", "--system", "x" * 300, "--model", str(tiny_model_path), stdin="hi\n"),
             "--system leaves no room for a conversation")


def test_serve_checks_its_port_before_loading_the_model():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line(cli("serve", "--port", str(port), "--model", MISSING), f"cannot listen on 127.0.0.1:{port}")


def test_serve_checks_its_host_before_loading_the_model():
    # 192.0.2.1 is TEST-NET-1: on no interface of this machine, so bind() fails at once and nothing is sent
    one_line(cli("serve", "--host", "192.0.2.1", "--port", "0", "--model", MISSING), "cannot listen on 192.0.2.1:0")


@pytest.mark.parametrize("options, message", [
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0 seconds"),
    (["--header-timeout", "0"], "--header-timeout must be > 0 seconds"),
    (["--limit-concurrency", "0"], "--limit-concurrency must be at least 1"),
    (["--allowed-origins", "http://app.example/"], "is not an origin"),
    (["--metrics-key", " "], "--metrics-key must be non-empty"),
])
def test_serve_bad_hardening_options_are_one_line(options, message):
    one_line(cli("serve", *options, "--model", MISSING), message)
