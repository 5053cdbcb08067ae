"""Every refusal of `minitransformer serve`: the status, OpenAI's error object naming the problem, and a server that
serves on afterwards. One real-model server with the guardrails switched on: API keys (one tenant with a quota),
one running request at most, one waiting at most, a 4 KiB body limit; and one with a 3 s request timeout."""

from __future__ import annotations

import json

import httpx
import pytest

from server_process import assert_error, running_server

KEYS = {"sk-alice": {"tenant": "alice", "quota_tokens": 300}, "sk-bob": {"tenant": "bob", "priority": 1}}
MODEL = "SmolLM2-135M-Instruct.Q4_1"
BOB = {"Authorization": "Bearer sk-bob"}
BOB_JSON = {**BOB, "Content-Type": "application/json"}          # raw bodies say what they are (415 otherwise)


@pytest.fixture(scope="module")
def server(real_model_path, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    with running_server("--model", str(real_model_path), "--api-keys", str(keys), "--max-num-seqs", "1",
                        "--max-waiting", "1", "--max-body-bytes", "4096", "--log-level", "warning") as process:
        yield process


@pytest.fixture(scope="module")
def timeout_server(real_model_path):
    with running_server("--model", str(real_model_path), "--request-timeout", "3", "--log-level", "warning") as process:
        yield process


def post(server, body, headers=BOB, path="/v1/completions", **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60, **kwargs)


def assert_still_serves(server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    ok = post(server, {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2, ok.text


def test_api_keys_401_without_or_with_a_wrong_key(server):
    assert_error(post(server, {"prompt": "Hi"}, headers={}), 401, "missing API key", code="invalid_api_key")
    assert_error(post(server, {"prompt": "Hi"}, headers={"Authorization": "Bearer sk-eve"}), 401, "invalid API key",
                 code="invalid_api_key")
    assert_error(httpx.get(server.url + "/v1/models"), 401, "missing API key", code="invalid_api_key")
    assert httpx.get(server.url + "/v1/models", headers=BOB).json()["data"][0]["id"] == MODEL
    assert_still_serves(server)


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "Hi", "max_tokens": "5"}, "max_tokens", ["max_tokens must be an integer", '"5"']),
    ({"prompt": "Hi", "temperature": "hot"}, "temperature", ["temperature must be a number"]),
    ({"prompt": "Hi", "temperature": -1}, "temperature", ["temperature must be >= 0"]),
    ({"prompt": "Hi", "top_p": 0}, "top_p", ["top_p must be in (0, 1]"]),
    ({"prompt": "Hi", "stream": "yes"}, "stream", ["stream must be true or false"]),
    ({"prompt": "Hi", "stop": 5}, "stop", ["stop must be a string or a list of strings"]),
    ({"prompt": "Hi", "n": 2}, "n", ["n=2 is not supported", "one choice per request"]),
    ({"prompt": "Hi", "best_of": 0}, "best_of", ["best_of=0 is not supported"]),
    ({"prompt": "Hi", "logprobs": 99}, "logprobs", ["logprobs must be an integer in [0, 20]"]),
    ({"prompt": ""}, "prompt", ["prompt is empty"]),
    ({"prompt": {"text": "Hi"}}, "prompt", ["prompt must be a string or a list of token ids"]),
    ({"prompt": ["a", "b"]}, "prompt", ["one prompt per request"]),
    ({"prompt": [1, 10**9]}, "prompt", ["prompt token id 1000000000 is outside the vocabulary"]),
])
def test_bad_fields_are_400_naming_the_field(server, body, param, words):
    assert_error(post(server, body), 400, *words, param=param)


def test_chat_bad_messages_are_400(server):
    chat = "/v1/chat/completions"
    assert_error(post(server, {"messages": []}, path=chat), 400, "messages must be a non-empty list",
                 param="messages")
    assert_error(post(server, {"messages": [{"role": "user", "content": 5}]}, path=chat), 400,
                 "messages[0].content must be a string", param="messages[0].content")
    assert_error(post(server, {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": "x",
                               "logprobs": True}, path=chat), 400, "top_logprobs must be an integer",
                 param="top_logprobs")
    assert_still_serves(server)


def test_malformed_json_and_unknown_model(server):
    broken = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "Hi",', headers=BOB_JSON)
    assert_error(broken, 400, "not valid JSON")
    assert_error(httpx.post(server.url + "/v1/completions", content=b"[1, 2]", headers=BOB_JSON), 400,
                 "must be a JSON object")
    assert_error(post(server, {"prompt": "Hi", "model": "gpt-4o"}), 404, "'gpt-4o' does not exist", MODEL,
                 param="model", code="model_not_found")
    assert_still_serves(server)


def test_over_the_context_is_400_with_both_numbers_naming_the_field(server):
    assert_error(post(server, {"prompt": "Hi there", "max_tokens": 9000}), 400,
                 "max_tokens (9000) leaves no room for a prompt in the context length of 8192 tokens; at most 8191",
                 param="max_tokens")
    assert_error(post(server, {"prompt": [5] * 100, "max_tokens": 8100}), 400,
                 "prompt (100 tokens) + max_tokens (8100) = 8200 exceeds the context length of 8192 tokens",
                 param="prompt")
    assert_still_serves(server)


def test_a_body_over_the_limit_is_413_with_or_without_a_content_length(server):
    big = json.dumps({"prompt": "word " * 2000}).encode()
    assert_error(httpx.post(server.url + "/v1/completions", content=big, headers=BOB_JSON), 413, "4096",
                 code="request_too_large")
    chunked = httpx.post(server.url + "/v1/completions", content=iter([big[:3000], big[3000:]]),
                         headers=BOB_JSON)
    assert_error(chunked, 413, "4096", code="request_too_large")
    assert_still_serves(server)


def test_a_request_over_its_tenants_whole_quota_is_400_not_a_retry(server):
    """It could never run, so it is not a 429: an OpenAI client retries those by itself (test_server_hardening.py
    has the 429 of a quota that other requests hold for now)."""
    headers = {"Authorization": "Bearer sk-alice"}
    response = post(server, {"prompt": "Hi", "max_tokens": 400}, headers=headers)
    assert_error(response, 400, "alice", "quota of 300", "can never run", param="max_tokens", code="quota_exceeded")
    assert "Retry-After" not in response.headers
    assert post(server, {"prompt": "Hi", "max_tokens": 3}, headers=headers).status_code == 200
    assert_still_serves(server)


def test_a_full_waiting_queue_is_429_with_retry_after(server):
    """One runs (max-num-seqs 1) until its client leaves, one waits (max-waiting 1): the third is refused."""
    body = {"prompt": "Count to one hundred:", "max_tokens": 4000, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60, headers=BOB) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as running:
            lines = running.iter_lines()        # kept: a dropped line iterator closes the connection, an abort
            next(line for line in lines if line.startswith("data: "))                     # it runs
            with http.stream("POST", server.url + "/v1/completions", json=body):         # headers: it is queued
                refused = post(server, {"prompt": "Hi", "max_tokens": 2})
                assert_error(refused, 429, "waiting queue is full", "--max-waiting 1", code="queue_full")
                assert refused.headers["Retry-After"] == "1"
    assert_still_serves(server)                          # both clients left: both requests were aborted


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_past_its_timeout_ends_with_length_and_its_partial_text(timeout_server, stream):
    server = timeout_server
    body = {"prompt": "Write a long story.", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        choice = [c for c in chunks if c["choices"]][-1]["choices"][0]
        usage = chunks[-1]["usage"]
    else:
        response = post(server, body, headers={})
        assert response.status_code == 200
        choice, usage = response.json()["choices"][0], response.json()["usage"]
        text = choice["text"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", "timeout")
    assert 0 < usage["completion_tokens"] < 1000 and text
    ok = post(server, {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "ignore_eos": True}, headers={})
    assert ok.json()["choices"][0]["finish_reason"] == "length" and ok.json()["usage"]["completion_tokens"] == 2
