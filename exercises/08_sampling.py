"""Exercise 08: the sampling filters for one row.

The model gives one logit per vocabulary token (V = 49152 for SmolLM2). Before a token is drawn, the engine reshapes
that row, in this order (vLLM's; core/sampling.py):

    temperature -> min_p -> top_k -> top_p -> softmax over the survivors (renormalised)

    filtered_probs(logits, temperature, top_k, top_p, min_p) -> probs

Shapes: logits (V,) float32; returns (V,) probabilities summing to 1, zero for every removed token.

What each setting means (core/sampling_params.py, vLLM's meanings):
  temperature  divide the logits by it; below 1e-5 (0) means greedy: a one-hot at the argmax of the logits
  min_p        0 = off; keep tokens whose probability (after temperature) is >= min_p x the top probability
  top_k        0 or -1 = off; keep the k largest logits (of what min_p left)
  top_p        1.0 = off; of what is left, renormalised, keep the smallest set of most likely tokens whose mass
               reaches top_p: walk from the most likely down, keep a token while the mass before it is < top_p
               (so the token that crosses top_p stays, and the first token always stays)

Pitfalls: top_p keeping only the tokens strictly below top_p (the crossing token belongs in the set); top_k after
top_p; min_p against 1 instead of against the top probability; temperature after the filters (min_p and top_p must
see the tempered distribution).

Check it: `minitransformer learn check sampling` (random logits, then the engine's sampler drawing from the real
model's next-token distribution with your filters). Stuck: `minitransformer learn hint sampling`.
"""

import numpy as np  # noqa: F401  (you will want it)


def filtered_probs(logits, temperature, top_k, top_p, min_p):
    raise NotImplementedError("write filtered_probs")
