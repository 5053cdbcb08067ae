"""Structured output over HTTP: OpenAI's response_format driven by the official `openai` client, vLLM's
structured_outputs and guided_* fields, streaming, refusals (400 naming the field, the server serving on), and the
mask's cost on /metrics. Every constrained output parses and validates against its schema (jsonschema)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from openai import OpenAI

from minitransformer.server.errors import APIError
from minitransformer.server.protocol import parse_generation
from minitransformer.structured import StructuredOutputsParams
from server_process import metric, running_server, sse_payloads, wait_for
from structured_cases import CHOICES, REGEXES, SCHEMAS
from test_server import metrics

MAX_TOKENS = 128           # the schemas' prompts finish within ~96 tokens greedy; the margin costs nothing


def client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def response_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def chat(server, prompt: str, **fields):
    return client(server).chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", temperature=0,
                                                  messages=[{"role": "user", "content": prompt}], **fields)


@pytest.fixture(scope="module")
def server(real_model_path):
    with running_server("--model", str(real_model_path), "--max-num-seqs", "16", "--log-level", "warning") as s:
        yield s


# ---------------------------------------------------------------------------------------------------- parsing alone

def params_of(body: dict, chat: bool = False):
    return parse_generation({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], **body}, chat).params


def refusal(body: dict, chat: bool = False) -> APIError:
    with pytest.raises(APIError) as info:
        params_of(body, chat)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("body,kind", [
    ({"response_format": {"type": "json_object"}}, "json_object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}},
     "json"),
    ({"response_format": {"type": "json_schema",                  # strict false, and a description: the same mask
                          "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": False,
                                          "description": "d"}}}, "json"),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "regex"),
    ({"structured_outputs": {"choice": ["a", "b"], "json_object": False, "whitespace_pattern": None}}, "choice"),
    ({"structured_outputs": {"grammar": 'start: "x"'}}, "grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object"),
    ({"guided_json": {"type": "object"}}, "json"),
    ({"guided_regex": "[a-z]+"}, "regex"),
    ({"guided_choice": ["a", "b"]}, "choice"),
    ({"guided_grammar": 'start: "x"'}, "grammar"),
])
@pytest.mark.parametrize("is_chat", [False, True])
def test_each_way_of_asking_becomes_one_constraint(body, kind, is_chat):
    assert params_of(body, is_chat).structured.kind == kind


def test_text_format_and_absent_fields_ask_for_nothing():
    assert params_of({}).structured is None
    assert params_of({"response_format": {"type": "text"}, "structured_outputs": None, "guided_json": None},
                     chat=True).structured is None


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "text, json_object, json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name",
     "non-empty string"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format.json_schema.schema",
     "missing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": "yes"}}},
     "response_format.json_schema.strict", "true or false"),
    ({"response_format": response_format("n", {"type": "nope"})}, "response_format.json_schema.schema",
     "invalid JSON schema"),
    ({"response_format": response_format("n", {"type": "integer", "minimum": 5, "maximum": 1})},
     "response_format.json_schema.schema", "invalid JSON schema"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex", "invalid regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty list"),
    ({"structured_outputs": {"choice": "yes"}}, "structured_outputs.choice", "non-empty list"),
    ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar", "invalid grammar"),
    ({"structured_outputs": {}}, "structured_outputs", "sets no constraint"),
    ({"structured_outputs": [1]}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {"json_object": 1}}, "structured_outputs.json_object", "true or false"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "not supported"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": 5}, "guided_regex", "regex must be a non-empty string"),
])
def test_a_bad_constraint_is_a_400_naming_its_field(body, param, words):
    error = refusal(body, chat=True)
    assert error.param == param and words in error.message, error.message
    assert error.message.startswith(param), error.message


@pytest.mark.parametrize("body,names", [
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     ["response_format", "structured_outputs.regex"]),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}},
     ["structured_outputs.regex", "structured_outputs.choice"]),
    ({"guided_json": {}, "guided_regex": "a"}, ["guided_json", "guided_regex"]),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"], "guided_grammar": 'start: "a"'},
     ["response_format", "guided_choice", "guided_grammar"]),
])
def test_two_constraints_are_a_400_naming_both(body, names):
    error = refusal(body)
    assert all(name in error.message for name in names) and error.param == names[1], error.message


# ---------------------------------------------------------------------------------------------------- the real model

def test_every_schema_through_the_openai_clients_response_format_parses_and_validates(server, real_model):
    from minitransformer import SamplingParams, generate

    def ask(case):
        name, schema, prompt = case
        return chat(server, prompt, max_tokens=MAX_TOKENS, response_format=response_format(name, schema))

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:                 # concurrent: one batch, each its own matcher
        replies = list(pool.map(ask, SCHEMAS))
    for (name, schema, _), reply in zip(SCHEMAS, replies):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        assert choice.model_extra["stop_reason"] is None                 # as vLLM reports the EOS that follows
        jsonschema.validate(json.loads(choice.message.content), schema)
    name, schema, prompt = SCHEMAS[0]                                    # the same tokens as the library's
    alone = generate(real_model, prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                        structured=StructuredOutputsParams(json=schema)), chat=True)
    assert replies[0].choices[0].message.content == alone.text


def test_json_object_is_an_object(server):
    reply = chat(server, "Return a JSON object with the keys x and y set to 1 and 2.", max_tokens=MAX_TOKENS,
                 response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_vllm_structured_outputs_regex_and_choice_and_the_older_guided_names(server):
    completions = client(server).completions
    for regex, prompt in REGEXES[:4]:
        for body in ({"structured_outputs": {"regex": regex}}, {"guided_regex": regex}):
            reply = completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=24,
                                       temperature=0, extra_body=body)
            assert re.fullmatch(regex, reply.choices[0].text), (regex, reply.choices[0].text)
            assert reply.choices[0].finish_reason == "stop"
    for choices, prompt in CHOICES[:4]:
        for body in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
            reply = completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=8,
                                       temperature=0, extra_body=body)
            assert reply.choices[0].text in choices, (choices, reply.choices[0].text)


def test_streamed_deltas_concatenate_to_the_valid_json(server):
    name, schema, prompt = SCHEMAS[2]                                    # nested objects
    fields = dict(max_tokens=MAX_TOKENS, response_format=response_format(name, schema))
    with ThreadPoolExecutor(2) as pool:                                 # side by side, in one batch
        whole_reply = pool.submit(chat, server, prompt, **fields)
        chunks = list(pool.submit(chat, server, prompt, stream=True, **fields).result())
        whole = whole_reply.result().choices[0].message.content
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_max_tokens_before_the_end_is_length_with_the_partial_text(server):
    name, schema, prompt = SCHEMAS[0]
    full = chat(server, prompt, max_tokens=MAX_TOKENS, response_format=response_format(name, schema))
    cut = chat(server, prompt, max_tokens=4, response_format=response_format(name, schema))
    assert cut.choices[0].finish_reason == "length"
    assert full.choices[0].message.content.startswith(cut.choices[0].message.content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)


def test_bad_constraints_are_400s_before_any_work_and_the_server_keeps_serving(server):
    url = server.url + "/v1/chat/completions"
    messages = [{"role": "user", "content": "hi"}]
    bad = [({"response_format": response_format("n", {"type": "nope"})}, "response_format.json_schema.schema"),
           ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
           ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
           ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex")]
    before = metrics(server)
    for body, param in bad:
        reply = httpx.post(url, json={"messages": messages, "max_tokens": 4, **body}, timeout=60)
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param, reply.text
        assert error["type"] == "invalid_request_error" and param.split(".")[-1] in error["message"]
    assert metrics(server)["vllm:prompt_tokens_total"] == before["vllm:prompt_tokens_total"]     # no model work
    # no max_tokens: the chat default (the rest of the context) is set after the constraint was compiled
    reply = chat(server, "Is Paris in France? Answer: ", extra_body={"guided_choice": ["yes", "no"]})
    assert reply.choices[0].message.content in ("yes", "no") and reply.choices[0].finish_reason == "stop"


def test_metrics_show_what_the_masks_cost(server):
    key = 'minitransformer:structured_output_requests_total{complete=true,type=regex}'
    before = metrics(server)
    reply = client(server).completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=REGEXES[0][1],
                                              max_tokens=16, temperature=0,
                                              extra_body={"structured_outputs": {"regex": REGEXES[0][0]}})
    after = metrics(server)
    tokens = reply.usage.completion_tokens
    assert after[key] == before.get(key, 0) + 1
    assert after["minitransformer:structured_output_masks_total"] - \
        before["minitransformer:structured_output_masks_total"] == tokens
    assert after["minitransformer:structured_output_mask_seconds_total"] > \
        before["minitransformer:structured_output_mask_seconds_total"]
    histogram = "minitransformer:structured_output_mask_seconds_per_token"
    assert after[histogram + "_count"] == before[histogram + "_count"] + 1
    assert after[histogram + "_bucket{le=+Inf}"] == after[histogram + "_count"]


def test_the_mask_counters_move_while_a_constrained_request_runs(server):
    masks = "minitransformer:structured_output_masks_total"
    before = metric(server, masks)
    body = {"prompt": "Spell a long word:", "max_tokens": 200, "stream": True,
            "structured_outputs": {"regex": "[a-z]{200}"}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        payloads = sse_payloads(response)
        for _ in range(4):
            next(payloads)
        assert metric(server, "vllm:num_requests_running") == 1
        assert metric(server, masks) >= before + 3                  # counted as computed, not when it finishes
    assert wait_for(lambda: metric(server, "vllm:num_requests_running") == 0, 60)
