"""Exercise 07: the greedy decode loop: prefill once, then one token at a time through the KV cache."""

from __future__ import annotations

import functools

import numpy as np

from ..core.decode import decode_step
from ..core.errors import InputError
from ..core.generate import generate
from ..core.kv_cache import KVCache
from ..core.prefill import prefill
from ..core.sampling_params import SamplingParams
from .track import CheckFailed, Exercise, likely_mistake, real_model, same_tokens

FRANCE = "The capital of France is"          # what `minitransformer generate` runs in the README
QUESTION = "Is the sky blue? Answer yes or no."   # as a chat message: 'No.' and EOS, 3 tokens (greedy SmolLM2)


def greedy_generate_reference(model, prompt_ids, max_tokens, eos_id):
    """The engine's loop (core/generate.py) at temperature 0, with the exercise's signature: stop at eos_id (a stop
    token id, which generate keeps in token_ids as it keeps EOS), else after max_tokens new tokens."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            stop_token_ids=() if eos_id is None else (eos_id,))
    return list(generate(model, [int(i) for i in prompt_ids], params).token_ids)


# ------------------------------------------------------------------------------- the classic mistakes, on purpose

def _loop(model, prompt_ids, max_tokens, eos_id, cache_len=None, feed_prompt_last=False, stop_at_eos=True,
          extra_token=False):
    """The greedy loop with one thing (or none) done wrong, as a learner might."""
    cache = KVCache(model.config, cache_len or len(prompt_ids) + max_tokens + extra_token)
    logits = prefill(model, list(prompt_ids), cache)                            # (1, V)
    out: list[int] = []
    while len(out) < max_tokens + extra_token:
        token = int(np.argmax(logits[0]))
        out.append(token)
        if stop_at_eos and token == eos_id:
            break
        logits = decode_step(model, [prompt_ids[-1] if feed_prompt_last else token], cache)
    return out


MISTAKES = (
    ("the prompt's last token is decoded again at every step; each step must feed the token just sampled",
     functools.partial(_loop, feed_prompt_last=True)),
    ("the loop does not stop at eos_id; it must stop there (the eos token is the last one returned, as generate "
     "keeps it)", functools.partial(_loop, stop_at_eos=False)),
    ("max_tokens + 1 tokens: the token sampled from prefill's logits is the first of the max_tokens",
     functools.partial(_loop, extra_token=True)),
)
# Not here: decode positions one too far (a gap of one before the first decoded token). RoPE only sees relative
# positions, so the gap shifts every query-key distance to the prompt by one: on these prompts the greedy tokens
# do not change, so no check could name it. decode_step computes the position, so the learner never writes it.
CACHE_TOO_SMALL = ("the KV cache holds the prompt only (max_len = len(prompt_ids)); it must hold prompt + "
                   "max_tokens, every token the loop will feed")


@functools.cache
def _expected(prompt_ids: tuple[int, ...], max_tokens: int, eos_id: int) -> list[int]:
    return greedy_generate_reference(real_model(), prompt_ids, max_tokens, eos_id)


def _run_case(greedy_generate, what: str, prompt_ids: list[int], max_tokens: int, eos_id: int) -> list[int]:
    """The learner's tokens on one prompt, checked against the engine's: the first token that differs, and the
    classic mistake whose tokens these are."""
    model = real_model()
    try:
        got = [int(t) for t in greedy_generate(model, list(prompt_ids), max_tokens, eos_id)]
    except InputError as exc:
        if "KV cache is full" in str(exc):
            raise CheckFailed(f"{what}: greedy_generate raised InputError: {exc}. Likely mistake: "
                              f"{CACHE_TOO_SMALL}") from None
        raise
    expected = _expected(tuple(prompt_ids), max_tokens, eos_id)
    if got == expected:
        return got
    inputs = (model, list(prompt_ids), max_tokens, eos_id)
    if got[:len(expected)] == expected and expected[-1:] == [eos_id]:      # went on past EOS: no need to rerun
        hint = f". Likely mistake: {MISTAKES[1][0]}"
    elif got[:max_tokens] == expected and len(got) == max_tokens + 1:
        hint = f". Likely mistake: {MISTAKES[2][0]}"
    else:                                                                  # rerun the model as each mistake would
        hint = likely_mistake(np.asarray(got), inputs, MISTAKES, 0, 0)
    try:
        same_tokens(what, got, expected, model.tokenizer.decode)
    except CheckFailed as failed:
        raise CheckFailed(f"{failed}" + hint) from None
    # one list is the start of the other: same_tokens names the length difference only implicitly
    raise CheckFailed(f"{what}: expected {len(expected)} tokens {expected}, got {len(got)} {got}" + hint)


def check(greedy_generate) -> list[str]:
    model = real_model()
    tokenizer, eos = model.tokenizer, model.tokenizer.eos_id
    chat_ids = tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    answer = _run_case(greedy_generate, f"the chat message {QUESTION!r} (max_tokens 8, eos_id {eos})",
                       chat_ids, 8, eos)
    if not answer or answer[-1] != eos:
        raise CheckFailed(f"the reply to {QUESTION!r} should end with eos_id {eos}, as the engine's does")
    france_ids = tokenizer.encode(FRANCE)
    continued = _run_case(greedy_generate, f"{FRANCE!r} (max_tokens 12)", france_ids, 12, eos)
    return [f"your loop answered the chat message {QUESTION!r} with {tokenizer.decode(answer[:-1])!r} and stopped "
            f"at EOS (id {eos}, token {len(answer)} of at most 8), the engine's tokens exactly",
            f"and continued {FRANCE!r} with {tokenizer.decode(continued)!r}: the 12 tokens `minitransformer generate "
            f"{FRANCE!r} --max-tokens 12` prints, token for token ({len(chat_ids)} + {len(france_ids)} prompt tokens "
            f"prefilled, {len(answer) + len(continued) - 2} decode steps)"]


EXERCISE = Exercise(
    number=7, name="generate", title="The greedy decode loop (prefill, then decode)",
    function="greedy_generate",
    solution="minitransformer/core/generate.py: run_request and CachedRunner (prefill.py: prefill, decode.py: "
             "decode_step, kv_cache.py: KVCache)",
    question="Walk through what happens from a prompt to the last token: what does prefill do, what does each decode "
             "step do, and why is the first token slower than the rest?",
    lesson="lessons/01_autoregressive_loop.py (the loop in miniature); lessons/02_prefill_vs_decode.py",
    hints=(
        "Make the cache first: KVCache(model.config, len(prompt_ids) + max_tokens). prefill(model, prompt_ids, "
        "cache) returns the logits (1, V) of the token after the prompt.",
        "Each step: token = int(argmax(logits[0])); append it; stop if it is eos_id (keep it in the list, as "
        "generate does); else logits = decode_step(model, [token], cache).",
        "The token sampled from prefill's logits is the first of the max_tokens: stop when the list has max_tokens "
        "tokens. decode_step puts the token at position cache.length, so you never compute positions yourself.",
    ),
    check=check, reference=greedy_generate_reference, mistakes=MISTAKES,
)
