"""Structured output: a JSON schema, a regex, a list of choices or a grammar, enforced as a mask on the logits.

"Sampling and stopping sit after logits", and so does the one feature that makes a small model's answer parse:
before the sampler draws, every token that would break the constraint gets its logit set to -inf, so whatever the
sampler picks (greedy or drawn) keeps the text inside the language the constraint describes. After the token is
chosen the matcher advances by it; once the constraint is complete (nothing but EOS could follow) the request stops.
It plugs into core's sampling stage as a TokenMask (core/sampling_params.py), which core never imports.

    StructuredOutputsParams(json=schema)    what the request asks for (vLLM's names), checked and compiled when it
                                            is made, within ConstraintLimits (params.py, limits.py)
    Constraint(params, tokenizer)           one request's matcher: allowed(V) -> mask, accept(token), complete,
                                            error (constraint.py)

The constraint compiler and the matcher are llguidance's (github.com/guidance-ai/llguidance; vLLM and SGLang offer
it as one of their structured-output backends, beside their default, xgrammar): it turns a JSON schema, regex, Lark
or GBNF grammar (llama.cpp's own format) into an Earley parser over bytes and computes, per step, which of the
vocabulary's tokens can extend the text, tokens that span several grammar symbols included. Writing that compiler is
a project of its own; what this package shows is where it plugs into the loop, what it is told about our tokenizer
(every token's bytes, which ids are control tokens, which is EOS), what one mask costs per token (Constraint.mask_s;
lesson 05 prints it), and what a server must bound when a client writes the constraint (limits.py).

Why greedy-with-a-mask is not "generate, then parse": the mask changes which token is argmax at every step, so the
model is steered into the format as it writes; generating freely and parsing afterwards keeps the model's own
choices and fails whenever they leave the format.

Modules, in reading order: limits.py, constraint.py, params.py; every name is re-exported here.
"""

from .constraint import MAX_FORCED_TOKENIZE, Constraint, vocabulary
from .limits import DEFAULT_LIMITS, ConstraintLimits
from .params import KINDS, StructuredOutputsParams

MAX_CONSTRAINT_CHARS = DEFAULT_LIMITS.max_chars
MAX_CHOICES = DEFAULT_LIMITS.max_choices

__all__ = ["StructuredOutputsParams", "Constraint", "ConstraintLimits", "DEFAULT_LIMITS", "KINDS",
           "MAX_CONSTRAINT_CHARS", "MAX_CHOICES", "MAX_FORCED_TOKENIZE", "vocabulary"]
