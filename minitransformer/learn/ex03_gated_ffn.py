"""Exercise 03: the gated feed-forward (SwiGLU), the second half of every layer."""

from __future__ import annotations

import math

from ..core import layers, model
from .track import (
    CheckFailed,
    Exercise,
    compare,
    greedy_ids,
    plugged,
    random_inputs,
    real_model,
    reference_ids,
    same_tokens,
)

D, F = 576, 1536                             # SmolLM2's d_model and FFN hidden size
PROMPT, TOKENS = "The capital of France is", 12


def _swapped(x, w_gate_up, w_down, activation):
    gate_up = x @ w_gate_up
    return (gate_up[:, :F] * activation(gate_up[:, F:])) @ w_down


def _no_activation(x, w_gate_up, w_down, activation):
    gate_up = x @ w_gate_up
    return (gate_up[:, :F] * gate_up[:, F:]) @ w_down


def _activation_after(x, w_gate_up, w_down, activation):
    gate_up = x @ w_gate_up
    return activation(gate_up[:, :F] * gate_up[:, F:]) @ w_down


def _always_silu(x, w_gate_up, w_down, activation):
    gate_up = x @ w_gate_up
    return (layers.silu(gate_up[:, :F]) * gate_up[:, F:]) @ w_down


MISTAKES = (
    ("the activation is applied to the up half (columns F:) instead of the gate half: gate and up are swapped; "
     "activation(x @ W_gate) with W_gate = w_gate_up[:, :F]", _swapped),
    ("no activation at all: (x @ W_gate) * (x @ W_up) is only bilinear; the gate goes through activation() first",
     _no_activation),
    ("the activation is applied after the product, activation(gate * up); it belongs on the gate alone, "
     "activation(gate) * up", _activation_after),
    ("SiLU is written in instead of the `activation` passed (Gemma passes gelu_tanh): call activation(gate)",
     _always_silu),
)




def check(swiglu) -> list[str]:
    # Weights scaled like a trained layer's (1/sqrt(fan-in)), so gate, up and the output are all of order 1.
    x, w_gate_up, w_down = random_inputs(2, (5, D), (D, 2 * F), (F, D))          # (N, D), (D, 2F), (F, D)
    w_gate_up, w_down = w_gate_up / math.sqrt(D), w_down / math.sqrt(F)
    for activation in (layers.silu, layers.gelu_tanh):
        inputs = (x, w_gate_up, w_down, activation)
        got = swiglu(*inputs)                                                  # (N, D)
        compare(f"swiglu(x, w_gate_up, w_down, {activation.__name__}) on x (5, 576)", got,
                layers.swiglu(*inputs), inputs, MISTAKES, atol=1e-4, axes=("token", "i"), float32=True)
    calls = 0

    def counted(*args):
        nonlocal calls
        calls += 1
        return swiglu(*args)

    with plugged(model, "swiglu", counted):
        got = greedy_ids(PROMPT, TOKENS)
    tokenizer = real_model().tokenizer
    same_tokens("the real model with your swiglu", got, list(reference_ids(PROMPT, TOKENS)), tokenizer.decode)
    if calls == 0:
        raise CheckFailed("the real model never called your swiglu (is the model using its own?)")
    return [f"your swiglu ran inside the real model {calls} times (30 layers x {calls // 30} forward passes: the "
            f"prompt, then one per new token) and gave '{PROMPT}{tokenizer.decode(got)}', the reference's "
            f"{TOKENS} tokens, token for token"]


EXERCISE = Exercise(
    number=3, name="gated_ffn", title="The gated feed-forward (SwiGLU)", function="swiglu",
    solution="minitransformer/core/layers.py: swiglu (called by core/model.py's forward, once per layer)",
    question="What is SwiGLU, why does a gated FFN have three weight matrices instead of two, and how big is F?",
    lesson="lessons/17_model_shape.py (where the parameters and FLOPs of a layer go); docs/code_tour.md",
    hints=(
        "One matmul gives both halves: gate_up = x @ w_gate_up, (N, 2F); F = w_down.shape[0] = 1536.",
        "The gate is gate_up[:, :F], the up is gate_up[:, F:]. Only the gate goes through activation().",
        "Multiply activation(gate) * up element by element, (N, F), then @ w_down -> (N, 576).",
    ),
    check=check, reference=layers.swiglu, mistakes=MISTAKES,
)
