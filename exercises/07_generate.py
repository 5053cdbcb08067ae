"""Exercise 07: the greedy decode loop.

Generation is two stages. Prefill runs the whole prompt through the model at once, storing every layer's keys and
values in the KV cache, and returns the logits of the token after the prompt. Then decode: pick a token, feed just
that one token back (its keys and values join the cache, its query attends to all of them), get the logits of the
next, and so on, one full pass through the model per token.

    greedy_generate(model, prompt_ids, max_tokens, eos_id) -> the new token ids (a list of ints)

Use the engine's stages:
    from minitransformer.core.kv_cache import KVCache      KVCache(model.config, max_len)
    from minitransformer.core.prefill import prefill       prefill(model, prompt_ids, cache) -> logits (1, V)
    from minitransformer.core.decode import decode_step    decode_step(model, [token], cache) -> logits (1, V)

Shapes for SmolLM2-135M: logits (1, 49152), one row for the one sequence; the cache stores (30 layers, 1, max_len,
3 kv heads, 64) keys and as many values. Greedy: the next token is the argmax of the logits row.

Rules (those of core/generate.py at temperature 0): at most max_tokens new tokens, counting the one sampled from
prefill's logits; stop right after producing eos_id, which stays in the returned list (generate's token_ids keep
EOS; only the text leaves it out).

Pitfalls: feeding the prompt's last token again instead of the token just sampled; a cache sized for the prompt
only (it must hold every token the loop feeds); not stopping at eos_id; one token too many.

Check it: `minitransformer learn check generate` (runs the real model: a chat question answered in 3 tokens, EOS
included, then "The capital of France is"). Stuck: `minitransformer learn hint generate`.
"""

import numpy as np  # noqa: F401  (you will want it)

from minitransformer.core.decode import decode_step  # noqa: F401
from minitransformer.core.kv_cache import KVCache  # noqa: F401
from minitransformer.core.prefill import prefill  # noqa: F401


def greedy_generate(model, prompt_ids, max_tokens, eos_id):
    raise NotImplementedError("write greedy_generate")
