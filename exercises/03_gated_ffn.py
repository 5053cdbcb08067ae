"""Exercise 03: the gated feed-forward (SwiGLU).

After attention, every layer runs each token's vector through a feed-forward block on its own. Llama-style models
gate it: two projections of x, the "gate" and the "up", are multiplied element by element after the gate goes
through an activation (SiLU for SmolLM2: silu(z) = z * sigmoid(z); GELU-tanh for Gemma), then projected back down:

    swiglu(x) = (activation(x @ W_gate) * (x @ W_up)) @ W_down

The engine keeps W_gate and W_up side by side in one matrix, so one matmul computes both: the first F columns are
the gate, the last F the up.

Shapes (SmolLM2-135M): x (N, 576) float32 (N = batch x tokens), w_gate_up (576, 3072) = [gate (576, 1536) | up
(576, 1536)], w_down (1536, 576). F = 1536 = w_down.shape[0]. Returns (N, 576). `activation` is a function of an
array (the model passes layers.silu; the check also passes layers.gelu_tanh, as for Gemma).

Pitfalls: the activation goes on the gate half only (the first F columns), not on the up half and not on the
product; use the `activation` you are given, do not write SiLU in.

Check it: `minitransformer learn check gated_ffn`. Stuck: `minitransformer learn hint gated_ffn`.
"""

import numpy as np  # noqa: F401  (you will want it)


def swiglu(x, w_gate_up, w_down, activation):
    raise NotImplementedError("write swiglu")
