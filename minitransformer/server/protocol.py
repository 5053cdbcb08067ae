"""Request bodies in, as OpenAI's API defines them (with vLLM's extensions): JSON -> a checked `ApiRequest`.

The fields are OpenAI's names; the sampling ones are SamplingParams' fields under their own names (every field
whose option says http: sampling_params.sampling_options), and SamplingParams, the one validator, checks their values.
What the HTTP layer adds is JSON's types: JSON has no int/float distinction and a client may send anything, so each
field's JSON type is checked here against the field's type, and a wrong one or a value SamplingParams refuses is a 400
naming the field (`param`), before any tokenizing or model work.

    POST /v1/completions        prompt (a string, one string in a list, or token ids), max_tokens (default 16),
                                logprobs (int: top alternatives per token), echo / suffix / best_of not supported
    POST /v1/chat/completions   messages [{"role", "content"}] (content: a string or a list of text parts),
                                max_tokens or max_completion_tokens (default: what is left of the context),
                                logprobs (bool) + top_logprobs (int)
    both                        stream, stream_options.include_usage, temperature, top_p, top_k, min_p, seed, stop
                                (a string or a list), presence_penalty, frequency_penalty, repetition_penalty,
                                min_tokens, ignore_eos, include_stop_str_in_output, stop_token_ids, priority (vLLM:
                                lower runs first), n (only 1), return_token_ids (vLLM: each choice and streamed
                                chunk also carries the ids of its tokens)
    structured output           at most one of: response_format (OpenAI: {"type": "text" | "json_object" |
                                "json_schema", "json_schema": {"name", "schema", "strict", "description"}}),
                                structured_outputs (vLLM: {"json" | "regex" | "choice" | "grammar" | "json_object"}),
                                or vLLM's older guided_json / guided_regex / guided_choice / guided_grammar
                                (structured_fields.py)
Unknown fields are ignored, as vLLM and OpenAI's own server do with fields they do not use; logit_bias is known and
refused (the sampler has no bias stage), after its size is checked.

What one request may cost is bounded here, before any tokenizing or model work (each a 400 naming the field and cap):
the stop strings and stop_token_ids (their caps live in sampling_params.py: they are checked after every token),
logit_bias entries (MAX_LOGIT_BIAS), and the prompt (PromptLimits: characters, messages, token ids). A body that
is not JSON, nests deeper than Python's parser can follow, or holds a number no float can hold is a 400 too.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from dataclasses import dataclass

from ..core.backend import is_int
from ..core.errors import InputError
from ..core.sampling_params import SamplingParams, sampling_options
from ..structured import DEFAULT_LIMITS, ConstraintLimits
from .errors import bad_request, json_type
from .structured_fields import structured_outputs

# logit_bias maps token ids to biases. A bias list is a handful of banned or favoured tokens; 300 entries is far past
# that, and past it a body is refused before its entries are read one by one.
MAX_LOGIT_BIAS = 300
# A prompt's characters per token of the context, at most. Running text averages about 4 characters per token and the
# default model's vocabulary 6.7 per entry; 16 admits any ordinary prompt that could fit the context and refuses,
# before tokenizing it, one that could fit only if it were made of the rarest longest tokens (runs of spaces or #).
PROMPT_CHARS_PER_TOKEN = 16
# Every chat message costs at least this many tokens of its template (a turn marker and the role, at the least).
MIN_TOKENS_PER_MESSAGE = 2

# The sampling fields that pass straight through to SamplingParams (the API name is the SamplingParams name), with
# the JSON type each must have: a repeated field is an array, except that one string may stand for a list of strings
# (OpenAI's "stop"), which SamplingParams accepts and checks itself (None: no JSON type to check here).
SAMPLING_FIELDS = {o.name: (None if o.kind is str else list) if o.repeated else o.kind
                   for o in sampling_options() if o.http}


@dataclass
class ApiRequest:
    """One checked completion or chat request, ready for the engine."""
    chat: bool
    prompt: str | list[int] | list[dict]    # str | list[int] (completions) or {"role", "content"} dicts (chat)
    params: SamplingParams           # max_tokens is provisional when max_tokens_given is False (chat default)
    max_tokens_given: bool
    model: str | None
    stream: bool
    include_usage: bool
    priority: int | None
    return_token_ids: bool = False
    structured_param: str | None = None     # the field that gave the structured-output constraint, if one did


@dataclass(frozen=True)
class PromptLimits:
    """How large a prompt may be before it is tokenized: tokenizing (and rendering a chat template over every message)
    costs time in proportion to the text, and happens before the context check can refuse a prompt that cannot fit.

    max_chars: characters of a text prompt, or of all message contents together (PROMPT_CHARS_PER_TOKEN per token)
    max_messages: chat messages (each costs at least MIN_TOKENS_PER_MESSAGE tokens of the template)
    max_token_ids: a prompt given as token ids (one token must be left to generate)
    """
    max_chars: int
    max_messages: int
    max_token_ids: int

    @classmethod
    def for_context(cls, tokens: int) -> PromptLimits:
        """The limits for requests of at most `tokens` tokens (prompt + max_tokens)."""
        return cls(tokens * PROMPT_CHARS_PER_TOKEN, max(1, tokens // MIN_TOKENS_PER_MESSAGE), max(1, tokens - 1))


def parse_json(body: bytes) -> dict:
    """The body as a JSON object, or a 400 that says what is wrong with it.

    Python's parser raises ValueError subclasses for bad text or bytes and for an integer of more than 4,300 digits,
    and RecursionError for arrays or objects nested deeper than its recursion limit: each is the client's error."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise bad_request("the request body is nested too deeply (arrays or objects inside each other)") from None
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def parse_generation(data: dict, chat: bool, limits: PromptLimits | None = None,
                     constraint_limits: ConstraintLimits = DEFAULT_LIMITS) -> ApiRequest:
    """A completions or chat body -> ApiRequest; every problem is a 400 naming its field. limits: the prompt's caps;
    constraint_limits: a structured-output constraint's (compiling one takes time: called off the event loop)."""
    for name in ("n", "best_of"):
        if (count := _get(data, name, int, 1)) != 1:
            raise bad_request(f"{name}={count} is not supported: this server returns exactly one choice per "
                              "request; send several requests instead", param=name)
    if _get(data, "echo", bool, False):
        raise bad_request("echo is not supported", param="echo")
    if _get(data, "suffix", str, None):
        raise bad_request("suffix is not supported", param="suffix")
    _logit_bias(data)
    prompt: str | list[int] | list[dict]
    if chat:
        prompt = _messages(data.get("messages"), limits)
        if data.get("tools"):
            raise bad_request("tools are not supported by this server", param="tools")
        max_tokens = _get(data, "max_completion_tokens", int, None)
        if max_tokens is None:
            max_tokens = _get(data, "max_tokens", int, None)
        logprobs = _get(data, "top_logprobs", int, 0) if _get(data, "logprobs", bool, False) else None
    else:
        prompt = _prompt(data.get("prompt"), limits)
        max_tokens = _get(data, "max_tokens", int, 16)            # OpenAI's and vLLM's default for completions
        logprobs = _get(data, "logprobs", int, None)
    fields = {name: value for name, kind in SAMPLING_FIELDS.items()
              if (value := data.get(name) if kind is None else _get(data, name, kind, None)) is not None}
    stream_options = _get(data, "stream_options", dict, None) or {}
    stream = _get(data, "stream", bool, False)
    structured, structured_param = structured_outputs(data, constraint_limits)   # compiled: a bad schema is a 400
    return ApiRequest(
        chat=chat, prompt=prompt,
        params=sampling_params(max_tokens=max_tokens if max_tokens is not None else 1, logprobs=logprobs,
                               structured=structured, **fields),
        max_tokens_given=max_tokens is not None, model=_get(data, "model", str, None), stream=stream,
        include_usage=stream and _get(stream_options, "include_usage", bool, False, "stream_options.include_usage"),
        priority=_get(data, "priority", int, None), return_token_ids=_get(data, "return_token_ids", bool, False),
        structured_param=structured_param)


def sampling_params(**fields) -> SamplingParams:
    """SamplingParams, with its range errors as 400s naming the API field."""
    try:
        return SamplingParams(**fields)
    except InputError as exc:
        raise _refused(exc) from None


def with_max_tokens(params: SamplingParams, max_tokens: int) -> SamplingParams:
    """params with another max_tokens, checked again (replace, not asdict: asdict would turn the compiled
    structured-output constraint back into a dict and compile it again)."""
    try:
        return dataclasses.replace(params, max_tokens=max_tokens)
    except InputError as exc:
        raise _refused(exc) from None


def _refused(exc: InputError):
    """SamplingParams' refusal as a 400 whose param is the field the message starts with (the longest such name:
    "stop_token_ids ..." is about stop_token_ids, not stop)."""
    message = str(exc)
    names = [f.name for f in dataclasses.fields(SamplingParams) if message.startswith(f.name)]
    return bad_request(message, param=max(names, key=len) if names else None)


def parse_token_ids(data: dict, name: str) -> list[int]:
    ids = data.get(name)
    if not isinstance(ids, list) or not all(is_int(i) for i in ids):
        raise bad_request(f"{name} must be a list of token ids (integers), got {json_type(ids)}", param=name)
    return ids


# ---------------------------------------------------------------------------------------------------- fields

def _get(data: dict, name: str, kind: type, default, param: str | None = None):
    """data[name] checked against a JSON type (int: no floats, no booleans; float: any number); absent or null ->
    default."""
    value = data.get(name)
    if value is None:
        return default
    ok = {int: is_int(value), float: isinstance(value, numbers.Real) and not isinstance(value, bool),
          bool: isinstance(value, bool)}.get(kind, isinstance(value, kind))
    if not ok:
        wanted = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                  dict: "an object", list: "an array"}[kind]
        raise bad_request(f"{param or name} must be {wanted}, got {json_type(value)} {_short(value)}",
                          param=param or name)
    return value


def _logit_bias(data: dict) -> None:
    """logit_bias: refused, since the sampler has no bias stage; an oversized one is named as such first."""
    bias = data.get("logit_bias")
    if bias is None or bias == {}:
        return
    if not isinstance(bias, dict):
        raise bad_request(f"logit_bias must be an object mapping token ids to biases, got {json_type(bias)}",
                          param="logit_bias")
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are accepted",
                          param="logit_bias")
    raise bad_request("logit_bias is not supported by this server (its sampler has no bias stage); leave it out",
                      param="logit_bias")


def _prompt(prompt, limits: PromptLimits | None) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                                   # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt is empty; give at least one character", param="prompt")
        if limits is not None and len(prompt) > limits.max_chars:
            raise bad_request(f"prompt has {len(prompt)} characters; at most {limits.max_chars} are accepted "
                              f"({PROMPT_CHARS_PER_TOKEN} per token of the context)", param="prompt")
        return prompt
    if isinstance(prompt, list) and limits is not None and len(prompt) > limits.max_token_ids:
        raise bad_request(f"prompt is a list of {len(prompt)} items; at most {limits.max_token_ids} token ids fit in "
                          "the context with one token to generate", param="prompt")
    if isinstance(prompt, list) and prompt and all(is_int(i) for i in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"one prompt per request (got {len(prompt)}); send several requests", param="prompt")
    raise bad_request(f"prompt must be a string or a list of token ids, got {json_type(prompt)}", param="prompt")


def _messages(messages, limits: PromptLimits | None) -> list[dict]:
    """OpenAI messages -> [{"role", "content": str}]; content given as text parts is joined."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
    if limits is not None and len(messages) > limits.max_messages:
        raise bad_request(f"messages has {len(messages)} messages; at most {limits.max_messages} fit in the context "
                          f"(each costs at least {MIN_TOKENS_PER_MESSAGE} tokens of the chat template)",
                          param="messages")
    out = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{n}] must be an object with a string role", param=f"messages[{n}]")
        content = message.get("content")
        if isinstance(content, list):                        # [{"type": "text", "text": "..."}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{n}].content: only text parts are supported",
                                  param=f"messages[{n}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{n}].content must be a string or a list of text parts, got "
                              f"{json_type(content)}", param=f"messages[{n}].content")
        out.append({"role": message["role"], "content": content})
    chars = sum(len(m["content"]) + len(m["role"]) for m in out)
    if limits is not None and chars > limits.max_chars:
        raise bad_request(f"messages have {chars} characters in all; at most {limits.max_chars} are accepted "
                          f"({PROMPT_CHARS_PER_TOKEN} per token of the context)", param="messages")
    return out


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
