"""StructuredOutputsParams: what a request's output must match, checked and compiled once, before any model work.

    StructuredOutputsParams(json=schema)      compile: limits.py's checks, then llguidance's compiler on a big stack,
                                              then a probe of what it accepts (a byte vocabulary: no model needed)
    spec.prepare(tokenizer)                   the compiled grammar against one model's vocabulary: a matcher kept as
                                              the template every request of that constraint copies
    spec.make_mask(tokenizer) -> Constraint   one request's matcher (core's TokenMaskSpec protocol)

Both steps are cached by their source, so a schema that a client sends again costs nothing, and a refused one is
refused again at once. The server runs them off its event loop and off its engine thread (in a worker thread,
before the request reaches the engine); the CLI before it loads the model.
"""

from __future__ import annotations

import collections
import json
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import llguidance

from ..core.errors import InputError
from .constraint import Constraint, vocabulary
from .limits import DEFAULT_LIMITS, ConstraintLimits, check_rules, check_schema, check_text, on_big_stack, one_line

KINDS = ("json", "regex", "choice", "grammar", "json_object")
WHAT = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex", "choice": "choice list",
        "grammar": "grammar"}
CACHED = 256                          # compiled grammars (and refusals) kept, by source; matchers per model


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a request's output must match; exactly one of the five (vLLM's StructuredOutputsParams names).

    json: a JSON schema (a dict, or its JSON text); regex: the whole output matches it (Rust regex syntax);
    choice: the output is one of these strings; grammar: a Lark or GBNF grammar (llama.cpp's format);
    json_object: any JSON object (OpenAI's response_format {"type": "json_object"}).
    Checked and compiled once, when the request is made, within `limits` (limits.py): a bad or too costly schema,
    regex or grammar, or one that no output can satisfy, is one InputError naming the problem (exit 2 on the CLI,
    400 on the server), before any model work.
    JSON output may hold any whitespace between tokens, as vLLM allows by default (llguidance's
    whitespace_flexible); a small model sometimes spends its tokens on it, and max_tokens ends that ("length").
    """
    json: Any = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    limits: ConstraintLimits = field(default=DEFAULT_LIMITS, repr=False, compare=False)
    compiled: str = field(default="", init=False, repr=False, compare=False)   # llguidance's grammar text

    def __post_init__(self):
        given = _given(self)
        if len(given) != 1:
            raise InputError(f"structured output takes exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        object.__setattr__(self, "compiled", compile_grammar(self.kind, source(self), self.limits))

    @property
    def kind(self) -> str:
        return _given(self)[0]

    def prepare(self, tokenizer) -> llguidance.LLMatcher:
        """The matcher of this constraint over `tokenizer`'s vocabulary, at its start: built (on a big stack, its
        first mask computed, so a language this vocabulary cannot write is refused here) or taken from the cache.
        Requests copy it (Constraint); the server calls this in a worker thread, so the engine thread only copies."""
        return template(self.compiled, tokenizer, self.kind, self.limits)

    def make_mask(self, tokenizer) -> Constraint:
        """One request's matcher of this constraint (core's TokenMaskSpec protocol: SamplingParams.structured)."""
        return Constraint(self, tokenizer)

    @classmethod
    def of(cls, value, limits: ConstraintLimits = DEFAULT_LIMITS) -> StructuredOutputsParams:
        """A StructuredOutputsParams from itself or a dict of its fields ({"json": {...}}), as the API accepts."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(KINDS))
            if unknown:
                raise InputError(f"structured output has no field {unknown[0]!r}; it takes one of {', '.join(KINDS)}")
            return cls(**value, limits=limits)
        raise InputError(f"structured must be a StructuredOutputsParams or a dict with one of {', '.join(KINDS)}, "
                         f"got {type(value).__name__}")


def _given(spec: StructuredOutputsParams) -> list[str]:
    """The kinds the caller set (json_object counts when True; the others when not None: json=False is a schema)."""
    return [k for k in KINDS if (spec.json_object is True if k == "json_object" else getattr(spec, k) is not None)]


def source(spec: StructuredOutputsParams) -> str:
    """The constraint as the text the compiler is given (checked against the limits): the schema's JSON, the
    regex, the grammar, or the choices as a Lark alternation of JSON-quoted literals (Lark's string escapes are
    JSON's)."""
    kind, limits = spec.kind, spec.limits
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else spec.json
        if isinstance(schema, str):
            check_text("the JSON schema", schema, limits)
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as exc:
                raise InputError(f"the JSON schema is not valid JSON: {exc}") from None
        if schema is False:
            raise InputError("the JSON schema is false, which no value matches: nothing could be generated")
        if schema is True:                  # JSON Schema's true: any JSON value
            schema = {}
        if not isinstance(schema, dict):
            raise InputError(f"a JSON schema must be an object (or true/false), got {type(schema).__name__}")
        return check_schema(schema, limits)
    if kind == "regex":
        if not isinstance(spec.regex, str) or not spec.regex:
            raise InputError(f"regex must be a non-empty string, got {spec.regex!r:.80}")
        check_text("the regex", spec.regex, limits)
        return spec.regex
    if kind == "choice":
        choices = spec.choice
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices \
                or not all(isinstance(c, str) and c for c in choices):
            raise InputError(f"choice must be a non-empty list of non-empty strings, got {choices!r:.80}")
        if len(choices) > limits.max_choices:
            raise InputError(f"choice has {len(choices)} strings; at most {limits.max_choices} are allowed")
        check_text("the choices", "".join(choices), limits)
        return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    if not isinstance(spec.grammar, str) or not spec.grammar.strip():
        raise InputError(f"grammar must be a non-empty string (Lark or GBNF), got {spec.grammar!r:.80}")
    check_text("the grammar", spec.grammar, limits)
    check_rules(spec.grammar, limits)
    return spec.grammar


# ---------------------------------------------------------------------------------------------------- compiling

_compiled: collections.OrderedDict = collections.OrderedDict()   # (kind, source, limits) -> grammar or InputError
_lock = threading.Lock()


def compile_grammar(kind: str, text: str, limits: ConstraintLimits) -> str:
    """llguidance's grammar for a checked source, compiled within the limits on a big stack (or the cached
    outcome: the grammar, or the same InputError again)."""
    key = (kind, text, limits)
    with _lock:
        if key in _compiled:
            _compiled.move_to_end(key)
            found = _compiled[key]
            if isinstance(found, InputError):
                raise found
            return found
    try:
        outcome: str | InputError = on_big_stack(lambda: probe(kind, text, limits), limits.compile_timeout_s,
                                                 f"the {WHAT[kind]}")
    except InputError as exc:
        outcome = exc
    with _lock:
        _compiled[key] = outcome
        while len(_compiled) > CACHED:
            _compiled.popitem(last=False)
    if isinstance(outcome, InputError):
        raise outcome
    return outcome


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: what the probe runs the grammar against, with no model."""
    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
    tokens = [bytes([b]) for b in range(256)] + [b"\xff<eos>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_BYTES: list = []                     # the byte vocabulary, built on first use (6 ms)


def probe(kind: str, text: str, limits: ConstraintLimits) -> str:
    """Compile, validate within the limits, and run the grammar's first step over bytes: the bytes it dictates
    before the model chooses anything (at most max_forced_bytes), and whether any output at all can satisfy it
    (llguidance's "NoExtensionBias": its first mask allows nothing but the end)."""
    what = WHAT[kind]
    try:
        if kind in ("json", "json_object"):
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(text)
        else:
            grammar = llguidance.grammar_from("grammar", text)      # Lark, or GBNF turned into Lark
    except ValueError as exc:
        raise InputError(f"invalid {what}: {one_line(str(exc))}") from None
    parser = limits.parser()
    error = llguidance.LLMatcher.validate_grammar(grammar, None, limits=parser)
    if error:
        raise InputError(f"invalid {what}: {one_line(error)}")
    if not _BYTES:
        _BYTES.append(llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes())))
    matcher = llguidance.LLMatcher(_BYTES[0], grammar, log_level=0, limits=parser)
    if matcher.is_error():
        raise InputError(f"invalid {what}: {one_line(matcher.get_error())}")
    forced = matcher.compute_ff_bytes()
    if len(forced) > limits.max_forced_bytes:
        raise InputError(f"the {what} dictates {len(forced):,} bytes or more before the model chooses anything; at "
                         f"most {limits.max_forced_bytes:,} are allowed")
    matcher.compute_bitmask()
    if forced and not matcher.is_error():
        matcher.consume_token(forced[0])                # a run of dictated bytes cut short by a limit fails here
    if matcher.is_error():
        reason = one_line(matcher.get_error())
        if reason.startswith("NoExtensionBias"):
            raise InputError(f"no output can satisfy the {what}: it matches no string")
        raise InputError(f"the {what} is over a limit of the compiler: {reason}")
    return grammar


# ---------------------------------------------------------------------------------------------------- per model

_templates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> {(grammar, limits): matcher}


def template(grammar: str, tokenizer, kind: str, limits: ConstraintLimits) -> llguidance.LLMatcher:
    """The cached matcher of `grammar` over `tokenizer`'s vocabulary at its start (see prepare)."""
    vocab = vocabulary(tokenizer)
    with _lock:
        kept = _templates.setdefault(tokenizer, collections.OrderedDict())
        if (grammar, limits) in kept:
            kept.move_to_end((grammar, limits))
            return kept[grammar, limits]

    def build():
        matcher = llguidance.LLMatcher(vocab, grammar, log_level=0, limits=limits.parser())
        if not matcher.is_error():
            matcher.compute_bitmask()                   # the first mask: a language this vocabulary cannot write
        return matcher

    matcher = on_big_stack(build, limits.compile_timeout_s, f"the {WHAT[kind]}")
    if matcher.is_error():
        reason = one_line(matcher.get_error())
        if reason.startswith("NoExtensionBias"):
            raise InputError(f"no output this model can write satisfies the {WHAT[kind]}")
        raise InputError(f"invalid {kind} constraint for this model's vocabulary: {reason}")
    with _lock:
        kept[grammar, limits] = matcher
        while len(kept) > CACHED:
            kept.popitem(last=False)
    return matcher
