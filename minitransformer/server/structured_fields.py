"""Structured output as the HTTP API asks for it: OpenAI's `response_format`, vLLM's `structured_outputs` and its
older `guided_*` fields, read into one StructuredOutputsParams (structured/params.py) that is compiled before any
model work.

    response_format {"type": "text"}                          free text (the default: no constraint)
    response_format {"type": "json_object"}                   any JSON object
    response_format {"type": "json_schema",                   the JSON schema in json_schema.schema; name is
                     "json_schema": {"name", "schema",        required (OpenAI's shape), description and strict
                                     "strict", "description"}}   are read and checked, and change nothing here
    structured_outputs {"json" | "regex" | "choice" |         vLLM's own field, with its StructuredOutputsParams
                        "grammar" | "json_object": ...}       names
    guided_json, guided_regex, guided_choice, guided_grammar  vLLM's names before v0.12.0 removed them

What `strict` means here: OpenAI's models follow a json_schema only approximately unless strict is true, and strict
mode accepts a subset of JSON Schema. This server compiles the schema into a grammar and the sampler cannot draw a
token outside it, so the output follows the schema whether strict is true, false or absent; vLLM, which decodes the
same way, reads strict and ignores it too. What no grammar can promise is that the model finishes within max_tokens:
then finish_reason is "length" and the text is the partial output, which will not parse (OpenAI does the same).

One constraint per request: two of these fields, or two kinds inside structured_outputs, is a 400 naming both (vLLM
lets response_format override structured_outputs without a word; a request that asks for two things gets told). A
bad schema, regex, grammar or choice list is a 400 whose `param` is the field that held it
(response_format.json_schema.schema, structured_outputs.regex, guided_grammar, ...).

The guided_* fields are still read because since v0.12.0 vLLM ignores them as it ignores any unknown field, so a
client written for an older vLLM gets unconstrained text that it believes constrained; here it gets what it asked
for. Fields of vLLM's StructuredOutputsParams that this server cannot honour (whitespace_pattern, structural_tag,
...) are refused rather than ignored, for the same reason.
"""

from __future__ import annotations

from typing import NamedTuple

from ..core.errors import InputError
from ..structured import DEFAULT_LIMITS, KINDS, ConstraintLimits, StructuredOutputsParams
from .errors import bad_request, json_type

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


class Ask(NamedTuple):
    """One field of the body that asks for a constraint: where it was (field: what a "two given" error names;
    param: where a compile error points) and what it asks for (a StructuredOutputsParams keyword and its value)."""
    field: str
    param: str
    kind: str
    value: object


def structured_outputs(data: dict, limits: ConstraintLimits = DEFAULT_LIMITS
                       ) -> tuple[StructuredOutputsParams | None, str | None]:
    """The body's one structured-output constraint, compiled and checked within `limits` (--structured-*), and the
    field it came from (what a later error about it names), or (None, None); each problem a 400 naming its field.
    Compiling may take a while (limits.compile_timeout_s at most): the server calls this off its event loop."""
    asks = [*_response_format(data), *_structured_outputs(data), *_guided(data)]
    if not asks:
        return None, None
    if len(asks) > 1:
        names = [ask.field for ask in asks]
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        raise bad_request(f"a request takes one structured-output constraint; this one gives {listed}: keep one",
                          param=names[1])
    ask = asks[0]
    try:
        return StructuredOutputsParams.of({ask.kind: ask.value}, limits), ask.param
    except InputError as exc:
        raise bad_request(f"{ask.param}: {exc}", param=ask.param) from None


def _response_format(data: dict) -> list[Ask]:
    """OpenAI's response_format: text (nothing), json_object, or json_schema with its name, schema and strict."""
    spec = data.get("response_format")
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise bad_request('response_format must be an object such as {"type": "json_object"}, got '
                          f"{json_type(spec)}", param="response_format")
    kind = spec.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [Ask("response_format", "response_format", "json_object", True)]
    if kind != "json_schema":
        raise bad_request(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got "
                          f"{kind!r:.60}", param="response_format.type")
    schema = spec.get("json_schema")
    if not isinstance(schema, dict):
        raise bad_request('response_format.json_schema must be an object {"name", "schema", "strict"}, got '
                          f"{json_type(schema)}", param="response_format.json_schema")
    name = schema.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("response_format.json_schema.name must be a non-empty string (OpenAI requires one), got "
                          f"{json_type(name)}", param="response_format.json_schema.name")
    for key, kind_, wanted in (("strict", bool, "true or false"), ("description", str, "a string")):
        if schema.get(key) is not None and not isinstance(schema[key], kind_):
            raise bad_request(f"response_format.json_schema.{key} must be {wanted}, got {json_type(schema[key])}",
                              param=f"response_format.json_schema.{key}")
    if schema.get("schema") is None:
        raise bad_request("response_format.json_schema.schema is missing: give the JSON schema the output must "
                          "follow", param="response_format.json_schema.schema")
    return [Ask("response_format", "response_format.json_schema.schema", "json", schema["schema"])]


def _structured_outputs(data: dict) -> list[Ask]:
    """vLLM's structured_outputs object: every kind it sets (null and json_object false set nothing)."""
    spec = data.get("structured_outputs")
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise bad_request('structured_outputs must be an object such as {"regex": "[0-9]+"}, got '
                          f"{json_type(spec)}", param="structured_outputs")
    unknown = sorted(key for key, value in spec.items() if key not in KINDS and value is not None)
    if unknown:
        raise bad_request(f"structured_outputs.{unknown[0]:.40} is not supported by this server; structured_outputs "
                          f"takes one of {', '.join(KINDS)}", param=f"structured_outputs.{unknown[0]:.40}")
    flag = spec.get("json_object")
    if flag is not None and not isinstance(flag, bool):
        raise bad_request(f"structured_outputs.json_object must be true or false, got {json_type(flag)}",
                          param="structured_outputs.json_object")
    asks = [Ask(f"structured_outputs.{kind}", f"structured_outputs.{kind}", kind, spec[kind]) for kind in KINDS
            if (spec.get(kind) is True if kind == "json_object" else spec.get(kind) is not None)]
    if not asks:
        raise bad_request(f"structured_outputs sets no constraint; give one of {', '.join(KINDS)}",
                          param="structured_outputs")
    return asks


def _guided(data: dict) -> list[Ask]:
    """vLLM's guided_json / guided_regex / guided_choice / guided_grammar (removed from vLLM in v0.12.0)."""
    return [Ask(name, name, kind, data[name]) for name, kind in GUIDED.items() if data.get(name) is not None]


