"""Structured output: a JSON schema, a regex, a list of choices or a grammar, enforced as a mask on the logits.

"Sampling and stopping sit after logits", and so does the one feature that makes a small model's answer parse:
before the sampler draws, every token that would break the constraint gets its logit set to -inf, so whatever the
sampler picks (greedy or drawn) keeps the text inside the language the constraint describes. After the token is
chosen the matcher advances by it; once the constraint is complete (nothing but EOS could follow) the request stops.

    StructuredOutputsParams(json=schema)    what the request asks for (vLLM's names), checked when it is made
    Constraint(params, tokenizer)           one request's matcher: allowed(V) -> mask, accept(token), complete

The constraint compiler and the matcher are llguidance's (github.com/guidance-ai/llguidance; vLLM, SGLang and
llama.cpp use it too): it turns a JSON schema, regex, Lark or GBNF grammar into an Earley parser over bytes and
computes, per step, which of the vocabulary's tokens can extend the text, tokens that span several grammar symbols
included. Writing that compiler is a project of its own; what this file shows is where it plugs into the loop, what
it is told about our tokenizer (every token's bytes, which ids are control tokens, which is EOS), and what one mask
costs per token (Constraint.mask_s; lesson 05 prints it).

Why greedy-with-a-mask is not "generate, then parse": the mask changes which token is argmax at every step, so the
model is steered into the format as it writes; generating freely and parsing afterwards keeps the model's own
choices and fails whenever they leave the format.
"""

from __future__ import annotations

import copy
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance
import numpy as np

from .core.errors import InputError
from .core.metrics import now

# What one request's constraint may weigh: the schema / grammar / regex text as the compiler reads it. Compiling is
# done before any model work, on the request's own thread; a megabyte of grammar is a denial of service, while real
# schemas (OpenAI allows 100 properties, 5 levels deep) stay far below this.
MAX_CONSTRAINT_CHARS = 100_000
MAX_CHOICES = 1024

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a request's output must match; exactly one of the five (vLLM's StructuredOutputsParams names).

    json: a JSON schema (a dict, or its JSON text); regex: the whole output matches it (Rust regex syntax);
    choice: the output is one of these strings; grammar: a Lark or GBNF grammar (llama.cpp's format);
    json_object: any JSON object (OpenAI's response_format {"type": "json_object"}).
    Checked and compiled once, when the request is made: a bad schema, regex or grammar is one InputError naming the
    problem (exit 2 on the CLI, 400 on the server), before any model work.
    JSON output may hold any whitespace between tokens, as vLLM allows by default (llguidance's
    whitespace_flexible); a small model sometimes spends its tokens on it, and max_tokens ends that ("length").
    """
    json: Any = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    compiled: str = field(default="", init=False, repr=False, compare=False)   # llguidance's grammar text

    def __post_init__(self):
        given = _given(self)
        if len(given) != 1:
            raise InputError(f"structured output takes exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        object.__setattr__(self, "compiled", _compile(self))

    @property
    def kind(self) -> str:
        return _given(self)[0]

    def make_mask(self, tokenizer) -> Constraint:
        """One request's matcher of this constraint (core's TokenMaskSpec protocol: SamplingParams.structured)."""
        return Constraint(self, tokenizer)

    @classmethod
    def of(cls, value) -> StructuredOutputsParams:
        """A StructuredOutputsParams from itself or a dict of its fields ({"json": {...}}), as the API accepts."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(KINDS))
            if unknown:
                raise InputError(f"structured output has no field {unknown[0]!r}; it takes one of {', '.join(KINDS)}")
            return cls(**value)
        raise InputError(f"structured must be a StructuredOutputsParams or a dict with one of {', '.join(KINDS)}, "
                         f"got {type(value).__name__}")


def _given(spec: StructuredOutputsParams) -> list[str]:
    """The kinds the caller set (json_object counts when True; the others when not None: json=False is a schema)."""
    return [k for k in KINDS if (spec.json_object is True if k == "json_object" else getattr(spec, k) is not None)]


def _compile(spec: StructuredOutputsParams) -> str:
    """The constraint as llguidance's grammar text, checked: InputError naming what is wrong."""
    kind = spec.kind
    if kind == "json" or kind == "json_object":
        schema = {"type": "object"} if kind == "json_object" else spec.json
        if isinstance(schema, str):
            _check_size("the JSON schema", schema)
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise InputError(f"the JSON schema is not valid JSON: {e}") from None
        if schema is False:
            raise InputError("the JSON schema is false, which no value matches: nothing could be generated")
        if schema is True:                  # JSON Schema's true: any JSON value
            schema = {}
        if not isinstance(schema, dict):
            raise InputError(f"a JSON schema must be an object (or true/false), got {type(schema).__name__}")
        _check_size("the JSON schema", json.dumps(schema))
        grammar, what = llguidance.LLMatcher.grammar_from_json_schema(schema), "JSON schema"
    elif kind == "regex":
        if not isinstance(spec.regex, str) or not spec.regex:
            raise InputError(f"regex must be a non-empty string, got {spec.regex!r}")
        _check_size("the regex", spec.regex)
        grammar, what = llguidance.LLMatcher.grammar_from_regex(spec.regex), "regex"
    elif kind == "choice":
        choices = spec.choice
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices \
                or not all(isinstance(c, str) and c for c in choices):
            raise InputError(f"choice must be a non-empty list of non-empty strings, got {choices!r:.80}")
        if len(choices) > MAX_CHOICES:
            raise InputError(f"choice has {len(choices)} strings; at most {MAX_CHOICES} are allowed")
        _check_size("the choices", "".join(choices))
        # a Lark alternation of JSON-quoted literals: Lark string literals use JSON's escapes
        grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        what = "choice list"
    else:
        if not isinstance(spec.grammar, str) or not spec.grammar.strip():
            raise InputError(f"grammar must be a non-empty string (Lark or GBNF), got {spec.grammar!r:.80}")
        _check_size("the grammar", spec.grammar)
        try:
            grammar = llguidance.grammar_from("grammar", spec.grammar)     # GBNF is turned into Lark first
        except ValueError as e:
            raise InputError(f"invalid grammar: {e}") from None
        what = "grammar"
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise InputError(f"invalid {what}: {' '.join(error.split())}")
    return grammar


def _check_size(what: str, text: str) -> None:
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InputError(f"{what} has {len(text):,} characters; at most {MAX_CONSTRAINT_CHARS:,} are allowed "
                         "(it is compiled before the request starts)")


# --- what llguidance is told about our tokenizer --------------------------------------------------------------

_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> llguidance.LLTokenizer


class _TokenizerView:
    """Our tokenizer as llguidance's TokenizerWrapper reads one: each token's bytes (control tokens marked with a
    leading 0xFF byte, llguidance's convention for "special: never produced by text"), EOS and BOS ids, and a
    function from text bytes to ids (llguidance uses it to tokenize forced text canonically)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.control_ids)
        self.tokens = [b"\xff" + tokenizer.token_bytes(i) if i in tokenizer.control_ids else tokenizer.token_bytes(i)
                       for i in range(tokenizer.vocab_size)]

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text.decode("utf-8"))


def vocabulary(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, built once per tokenizer (it indexes every token's bytes: ~0.1 s for
    49,152 tokens) and shared by all its requests."""
    vocab = _vocabularies.get(tokenizer)
    if vocab is None:
        if tokenizer.eos_id is None:
            raise InputError("structured output needs the tokenizer's end-of-sequence token, and this model's "
                             "tokenizer names none")
        vocab = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenizerView(tokenizer)))
        _vocabularies[tokenizer] = vocab
    return vocab


# --- one request's matcher ------------------------------------------------------------------------------------

class Constraint:
    """One request's position in its constraint: which tokens may come next, advanced by each token taken.

    allowed(V) -> (V,) bool mask of the ids the sampler may draw (computed once per position);
    accept(token) after the loop takes a token; complete: nothing but EOS could follow (the request stops).
    mask_s and allowed_counts record what each mask cost and how many tokens it let through (lesson 05).
    The matcher only ever sees tokens the loop took. Speculative decoding drafts ahead of it (lesson 12): a model
    drafter draws each guess under the mask of a fork() advanced through the guesses before it, the n-gram drafter
    cuts its guess at valid_prefix; what the drafts' checks cost is counted apart (draft_masks, draft_mask_s), as
    it is not the request's per-token mask.
    """

    def __init__(self, params: StructuredOutputsParams, tokenizer):
        self.params = params
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self.matcher = llguidance.LLMatcher(vocabulary(tokenizer), params.compiled, log_level=0)
        if self.matcher.is_error():      # checked against the vocabulary too: a grammar no token sequence can write
            raise InputError(f"invalid {params.kind} constraint: {self.matcher.get_error()}")
        self._bitmask = np.full((1, (self.vocab_size + 31) // 32), -1, dtype=np.int32)   # (1, ceil(V/32)) 1 bit/id
        self._mask: np.ndarray | None = None      # the mask of the current position, until a token is accepted
        self.mask_s = 0.0                         # time spent computing masks, seconds
        self.allowed_counts: list[int] = []       # tokens allowed at each position a mask was computed for
        self.draft_masks = 0                      # masks and checks made for speculative drafts (fork, valid_prefix)
        self.draft_mask_s = 0.0                   # ... and their time, seconds
        self._owner: Constraint | None = None     # a fork: the request's constraint it drafts ahead of
        self._at_owner = False                    # a fork not yet advanced stands where its owner stands

    def allowed(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) bool on the host: True where the token keeps the output inside the constraint. Ids past the
        tokenizer's vocabulary (a padded lm_head) are never allowed."""
        if self._owner is not None and self._at_owner:
            return self._owner.allowed(vocab_size)   # the request's own next mask: its verify row needs it too
        if self._mask is None or self._mask.shape[0] != vocab_size:
            start = now()
            self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
            bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[:self.vocab_size]   # (V_tok,)
            mask = np.zeros(vocab_size, dtype=bool)                                          # (V,)
            mask[:min(vocab_size, self.vocab_size)] = bits[:vocab_size].astype(bool)
            if self.matcher.is_error():   # a parser limit hit mid-output: end the request on EOS, not on a crash
                mask[:] = False
                mask[self.eos_id] = True
            elapsed = now() - start
            if self._owner is None:
                self.mask_s += elapsed
                self.allowed_counts.append(int(mask.sum()))
            else:
                self._owner.draft_masks += 1
                self._owner.draft_mask_s += elapsed
            self._mask = mask
        return self._mask

    def accept(self, token: int) -> None:
        """Advance past the token the loop took. A token the mask forbade is a bug in the loop: it raises."""
        if self.matcher.is_error():       # allowed() forced EOS; the request ends on it (summary()'s "error")
            self._mask = None
            return
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"token {token} breaks the {self.params.kind} constraint: {self.matcher.get_error()}")
        self._mask = None
        self._at_owner = False

    def fork(self) -> Constraint:
        """A copy of this matcher for drafting ahead: a model drafter takes each guess under fork.allowed(V) and
        advances the fork by it (fork.accept), so every guess keeps the output inside the constraint; the request's
        own matcher never sees a guess. Dropping the fork is the roll-back of the rejected guesses.

        Why a copy and not LLMatcher.rollback(n) on the request's matcher: both are cheap next to computing one
        mask (llguidance's deep_copy costs about as much as consuming and rolling back a few tokens), and a copy
        cannot leave the request's matcher advanced by a guess -- not when a draft pass raises, nor when the loop
        ends mid-draft -- nor make the request's cached mask stale. The fork's masks count as draft_masks of this
        constraint, not as its per-token mask cost; its first mask is this constraint's next one (the verify row
        needs that mask anyway), so it is computed once."""
        draft = copy.copy(self)
        draft.matcher = self.matcher.deep_copy()
        draft._bitmask = self._bitmask.copy()
        draft._mask, draft._owner, draft._at_owner = None, self, True
        draft.allowed_counts = []
        return draft

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the current position, the constraint accepts in order (the matcher does not
        move): a one-hot drafter (n-gram lookup) cuts its guess there, since a guess past it would only be
        rejected by the verify pass. Counted as one draft check."""
        if not tokens:
            return 0
        start = now()
        count = self.matcher.validate_tokens([int(t) for t in tokens])
        self.draft_masks += 1
        self.draft_mask_s += now() - start
        return count

    @property
    def complete(self) -> bool:
        """The constraint is satisfied and nothing but EOS could follow (or EOS was taken)."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (EOS is allowed), though more may follow (a regex like `a+`)."""
        return self.matcher.is_accepting()

    def summary(self) -> dict:
        """Result.structured: the constraint's kind, whether the output completed it, and what the masks cost
        (draft_masks / draft_mask_s: the checks of speculative drafts, zero without speculation)."""
        masks = len(self.allowed_counts)
        error = self.matcher.get_error() or None     # is_stopped() is true in an error state too
        return {"type": self.params.kind, "complete": not error and (self.complete or self.accepting),
                "error": error, "masks": masks,
                "mask_s": self.mask_s, "mask_s_per_token": self.mask_s / masks if masks else None,
                "allowed_tokens": list(self.allowed_counts),
                "draft_masks": self.draft_masks, "draft_mask_s": self.draft_mask_s}
