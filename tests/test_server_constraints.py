"""`minitransformer serve` against hostile constraints: what once disabled or crashed the server for everyone, sent to
a real server process, each answered as one request's 400 while the server goes on serving.

 1. a constraint over a limit   the regex that asked for a million expressions (as a regex, a schema pattern and a
                                Lark terminal), a schema of 1,500 patterned properties: 400s naming the field and the
                                limit; big schemas and grammars within the limits run and end like any request
 2. what crashed the process    6,000 chained rules, $ref chains of 2,900 and 1,200 nested properties, and the same
                                grammar sent to /tokenize: 400s, the server alive
 3. a mask over its budget      the request ends (400 code constraint_failed, or its stream's final chunk, an error
                                event and [DONE]); (the mask counters on /metrics move while a constraint runs:
                                tests/test_server_structured.py, on the real model, slow enough to watch)
 4. empty languages             five constraints no output satisfies: 400s at compile time
 5. shapes                      600 levels of anyOf, a lone surrogate: 400s, not 500s
10. the smaller errors          each names its field (prompt, stop_token_ids, max_tokens, messages); /tokenize checks
                                token ids and counts what a completion counts

A matcher failing mid-request ends only its request (the engine-level batch test is tests/test_structured_limits.py;
here, a real parser limit reached mid-output). At the end the same server still answers, greedy output is what the
library gives, and nothing is left running or waiting, nor any KV block in use. Every server fixture fails its tests
if the server logged a traceback (server_process.running_server).
"""

from __future__ import annotations

import json

import httpx
import pytest

from minitransformer import SamplingParams, generate
from server_process import assert_error, metric, post, running_server, sse_payloads, wait_for
from test_structured_limits import (
    NESTED,
    lark_alternatives,
    lark_chain,
    optional_properties,
    ref_chain,
    ref_nested,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tiny_model_path):
    with running_server("--model", str(tiny_model_path), "--max-num-seqs", "8", "--log-level", "warning") as s:
        yield s


@pytest.fixture(scope="module")
def stingy(tiny_model_path):
    """A server whose constraints may spend almost nothing on their masks (--structured-mask-budget)."""
    with running_server("--model", str(tiny_model_path), "--structured-mask-budget", "0.0000001",
                        "--log-level", "warning") as s:
        yield s


def regex(pattern: str, **fields) -> dict:
    return {"prompt": "x", "max_tokens": 8, "structured_outputs": {"regex": pattern}, **fields}


def schema(value, **fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": value}}}


def grammar(text: str, **fields) -> dict:
    return {"prompt": "x", "max_tokens": 8, "structured_outputs": {"grammar": text}, **fields}


def chat_json_text(schema_text: str) -> str:
    """A chat body asking for a JSON schema, as JSON text (a schema too deep for a client's encoder to write)."""
    return ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "response_format": {"type": '
            '"json_schema", "json_schema": {"name": "s", "schema": ' + schema_text + "}}}")


REGEX, SCHEMA, GRAMMAR = "structured_outputs.regex", "response_format.json_schema.schema", "structured_outputs.grammar"

# (id, path, body, param, words of the 400)
HOSTILE = [
    ("1 nested regex", "/v1/completions", regex(NESTED), REGEX, "dictates 97,666 bytes or more"),
    ("1 nested pattern", CHAT, schema({"type": "string", "pattern": f"^{NESTED}$"}), SCHEMA, "at most 4,096 are"),
    ("1 nested Lark terminal", "/v1/completions", grammar(f"start: T\nT: /{NESTED}/\n"), GRAMMAR,
     "dictates 97,666 bytes"),
    ("1 1,500 patterned properties", CHAT, schema(optional_properties(1500, "^[a-z0-9]{2,8}$")), SCHEMA,
     "grammar size (number of symbols) too big"),
    ("2 6,000 chained rules", "/v1/completions", grammar(lark_chain(6000)), GRAMMAR, "6,002 rules; at most 1,000"),
    ("2 $ref chain of 2,900", CHAT, schema(ref_chain(2900)), SCHEMA, "2,903 levels deep through its $refs"),
    ("2 1,200 nested $ref properties", CHAT, schema(ref_nested(1200)), SCHEMA, "levels deep through its $refs"),
    ("2 the chain to /tokenize", "/tokenize", grammar(lark_chain(6000)), GRAMMAR, "6,002 rules"),
    ("2 the $refs to /tokenize", "/tokenize", schema(ref_chain(2900)), SCHEMA, "through its $refs"),
    ("3 a{65536}", "/v1/completions", regex("a{65536}"), REGEX, "the regex dictates"),
    ("3 ((a{50}){50}){50}", "/v1/completions", regex("((a{50}){50}){50}"), REGEX, "the regex dictates"),
    ("4 [^\\s\\S]", "/v1/completions", regex(r"[^\s\S]"), REGEX, "no output can satisfy the regex"),
    ("4 a Lark terminal matching nothing", "/v1/completions", grammar("start: T\nT: /[^\\s\\S]/\n"), GRAMMAR,
     "no output can satisfy the grammar"),
    ("4 start: start", "/v1/completions", grammar("start: start\n"), GRAMMAR, "no output can satisfy the grammar"),
    ("4 root ::= root", "/v1/completions", grammar("root ::= root\n"), GRAMMAR, "no output can satisfy the grammar"),
    ("4 a $ref cycle", CHAT, schema({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                                    "b": {"$ref": "#/$defs/a"}}}), SCHEMA,
     "no output can satisfy the JSON schema"),
    ("5 anyOf 300 deep", CHAT, chat_json_text("{\"anyOf\": [" * 300 + '{"type": "string"}'
                                              + ', {"type": "integer"}]}' * 300), SCHEMA,
     "nests 601 levels deep; at most 64"),
    ("5 a lone surrogate", "/v1/completions", json.dumps(regex("\ud800")), REGEX, "which is not valid Unicode"),
    ("5 a lone surrogate streamed", "/v1/completions", json.dumps(regex("a\udfff", stream=True)), REGEX,
     "not valid Unicode"),
]                   # the last three as JSON text: a client's encoder refuses them (too deep, not UTF-8); curl does not


@pytest.mark.parametrize("path, body, param, words", [case[1:] for case in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_constraint_is_a_400_naming_the_field_and_the_server_goes_on(server, path, body, param, words):
    generated = metric(server, "vllm:generation_tokens_total")
    response = post(server, body, path) if isinstance(body, dict) else \
        httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=120)
    assert_error(response, 400, f"{param}: ", words, param=param)
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}
    assert metric(server, "vllm:generation_tokens_total") == generated            # refused before any model work
    assert post(server, {"prompt": "the cat", "max_tokens": 2}).status_code == 200


def test_a_schema_nested_past_the_body_parsers_depth_is_a_400_too(server):
    """600 levels of anyOf are 1,200 of JSON: the body itself is refused before it is read as a schema."""
    body = chat_json_text('{"anyOf": [' * 600 + '{"type": "string"}' + ', {"type": "integer"}]}' * 600)
    response = httpx.post(server.url + CHAT, content=body, headers={"Content-Type": "application/json"}, timeout=120)
    assert_error(response, 400, "the request body is nested too deeply")
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_a_refused_constraint_sent_again_is_refused_the_same_way(server):
    first, again = (post(server, grammar(lark_chain(5000))) for _ in range(2))
    assert first.json() == again.json() and first.status_code == again.status_code == 400


@pytest.mark.parametrize("body", [schema(optional_properties(500), max_tokens=24),
                                  grammar(lark_alternatives(3000), max_tokens=24)],
                         ids=["500 optional properties", "3,000 Lark alternatives"])
def test_big_constraints_within_the_limits_run_and_end_like_any_request(server, body):
    path = CHAT if "messages" in body else "/v1/completions"
    response = post(server, body, path)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


# ---------------------------------------------------------------------------------------------------- mid-request

PARSER_LIMIT = regex("((x{1,30}){1,30}){1,30}", max_tokens=60)       # compiles; its lexer gives out a few x's in


def test_a_parser_limit_reached_mid_output_is_a_400_for_that_request_only(server):
    response = post(server, PARSER_LIMIT)
    assert_error(response, 400, f"{REGEX}: the regex constraint reached a limit of its parser at output token",
                 "too many expressions constructed", param=REGEX, code="constraint_failed")
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    assert post(server, regex("[0-9]{3}")).json()["choices"][0]["finish_reason"] == "stop"


def test_a_stream_whose_constraint_fails_ends_with_its_final_chunk_an_error_event_and_done(server):
    with httpx.stream("POST", server.url + "/v1/completions", json={**PARSER_LIMIT, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        payloads = list(sse_payloads(response))
    assert payloads[-1] == "[DONE]"
    *chunks, error = [json.loads(p) for p in payloads[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert set("".join(c["choices"][0]["text"] for c in chunks)) == {"x"}
    assert error["error"]["code"] == "constraint_failed" and error["error"]["param"] == REGEX
    assert "reached a limit of its parser" in error["error"]["message"]


def test_a_constraint_over_the_mask_budget_ends_its_request_and_not_the_others(stingy):
    assert_error(post(stingy, regex("[a-z]{1,6}")), 400, f"{REGEX}: the regex constraint's masks took",
                 "ms per token are allowed", param=REGEX, code="constraint_failed")
    plain = post(stingy, {"prompt": "the cat", "max_tokens": 4, "ignore_eos": True})
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(stingy.url + "/health", timeout=30).status_code == 200


# ---------------------------------------------------------------------------------------------------- 10. fields

VOCAB = 264                                                        # the tiny model's vocabulary


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": [5, VOCAB], "max_tokens": 2}, "prompt",
     f"prompt token id {VOCAB} is outside the vocabulary [0, {VOCAB})"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stop_token_ids": [VOCAB + 5]}, "stop_token_ids",
     f"stop token id {VOCAB + 5} is outside the vocabulary"),
    ("/v1/completions", {"prompt": [5], "max_tokens": 128}, "max_tokens",
     "max_tokens (128) leaves no room for a prompt in the context length of 128 tokens; at most 127"),
    ("/v1/completions", {"prompt": "a b c " * 100, "max_tokens": 100}, "prompt", "prompt (more than 28 tokens)"),
    (CHAT, {"messages": [{"role": "user", "content": "a b c " * 100}], "max_tokens": 100}, "messages",
     "prompt (more than 28 tokens)"),
    ("/tokenize", {"prompt": [5, VOCAB]}, "prompt", f"prompt token id {VOCAB} is outside the vocabulary"),
], ids=["prompt id", "stop_token_ids", "max_tokens over the context", "prompt over the room", "chat over the room",
        "/tokenize id"])
def test_each_error_names_its_field(server, path, body, param, words):
    assert_error(post(server, body, path), 400, words, param=param)


def test_tokenize_counts_what_a_completion_counts(server):
    for prompt in ("the cat sat", [5, 6, 7]):
        counted = post(server, {"prompt": prompt}, "/tokenize").json()
        usage = post(server, {"prompt": prompt, "max_tokens": 1}).json()["usage"]
        assert counted["count"] == usage["prompt_tokens"] == len(counted["tokens"])


def test_tokenize_counts_gemmas_bos_as_its_completion_does(gemma_model_path):
    with running_server("--model", str(gemma_model_path), "--log-level", "warning") as gemma:
        counted = post(gemma, {"prompt": "The capital of France is"}, "/tokenize").json()
        usage = post(gemma, {"prompt": "The capital of France is", "max_tokens": 1}).json()["usage"]
    assert counted["count"] == usage["prompt_tokens"] == 6 and counted["tokens"][0] == 2      # <bos> first


# ---------------------------------------------------------------------------------------------------- afterwards

def test_after_all_of_it_the_server_answers_greedily_as_before_and_holds_nothing(server, tiny_model):
    """Runs last in this module (pytest keeps file order): the same server that took every case above."""
    body = {"prompt": "the cat sat", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    text = post(server, body).json()["choices"][0]["text"]
    assert text == generate(tiny_model, "the cat sat", SamplingParams(max_tokens=12, temperature=0.0,
                                                                      ignore_eos=True)).text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert wait_for(lambda name=name: metric(server, name) == 0, 30), name
