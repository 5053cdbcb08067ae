"""Exercise 04: RoPE, rotary position embedding.

Attention alone does not know where a token is. RoPE tells it by rotating the query and key vectors: each head's 64
numbers form 32 pairs, and pair i of a token at position p turns by the angle p * base^(-2i/64). A query and a key
rotated this way have a dot product that depends on their distance, not on where they sit. The angles' cos and sin
are computed once at load (layers.rope_table) and gathered for the positions at hand; you get them ready:

    (a, b) -> (a cos - b sin, a sin + b cos)          for every pair (a, b), with its own angle

Which two numbers form pair i is the model's choice, `pairing`:
    "interleaved": neighbours (x[2i], x[2i + 1])     SmolLM2 and every llama in GGUF (llama.cpp's converter
                                                      permutes the Q and K rows so that each pair sits side by side)
    "neox":        halves (x[i], x[i + 32])           "rotate half": Gemma, Qwen, HF's llama checkpoints

Shapes: x (B, heads, T, 64) float32 (the model rotates q and k in one call: heads = 9 + 3 = 12 for SmolLM2);
cos, sin (B, T, 32): the angle of pair i at token t of row b (the same for every head). Returns (B, heads, T, 64).

Pitfalls: the pairing (a wrong one still answers " Paris", with logits off by up to 6); the sign of the sine (a flip
rotates backwards); cos and sin have no heads axis: broadcast them over it (cos[:, None]).

Check it: `minitransformer learn check rope`. Stuck: `minitransformer learn hint rope`.
"""

import numpy as np  # noqa: F401  (you will want it)


def apply_rope(x, cos, sin, pairing):
    raise NotImplementedError("write apply_rope")
