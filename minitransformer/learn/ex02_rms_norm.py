"""Exercise 02: RMSNorm, the normalization before every attention and feed-forward block (and before the lm_head)."""

from __future__ import annotations

import numpy as np

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

EPS = 1e-5                                   # SmolLM2's norm_eps (config.norm_eps)


def _no_eps(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True)) * w


def _eps_outside(x, w, eps):
    return x / (np.sqrt((x * x).mean(-1, keepdims=True)) + eps) * w


def _layer_norm(x, w, eps):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + eps) * w


def _no_weight(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _whole_array(x, w, eps):
    return x / np.sqrt((x * x).mean() + eps) * w


MISTAKES = (
    ("the mean is taken over the whole array, not over the last axis (each row is normalized on its own)",
     _whole_array),
    ("the weight is never applied (x / rms alone)", _no_weight),
    ("the mean is subtracted first: that is LayerNorm; RMSNorm only divides by the root mean square", _layer_norm),
    ("eps is added outside the square root (x / (rms + eps)); it belongs inside: sqrt(mean(x^2) + eps)", _eps_outside),
)
# _no_eps differs from the right answer by about eps / (2 mean(x^2)): invisible on normal rows, so the check feeds
# a row of tiny values, where leaving eps out divides by almost zero.
MISTAKES_SMALL = (("eps is left out: a row of tiny values is divided by almost zero", _no_eps),) + MISTAKES


def check(rms_norm) -> list[str]:
    x, w = random_inputs(1, (4, 7, 576), (576,))                         # (batch, tokens, d_model), (d_model,)
    compare("rms_norm(x, weight, eps) on x (4, 7, 576)", rms_norm(x, w, EPS), layers.rms_norm(x, w, EPS),
            (x, w, EPS), MISTAKES, axes=("batch", "token", "i"), float32=True)
    tiny = x[:1, :1] * 1e-4                                              # mean(x^2) ~ 1e-8, far below eps
    compare("rms_norm on a row of tiny values (x ~ 1e-4)", rms_norm(tiny, w, EPS), layers.rms_norm(tiny, w, EPS),
            (tiny, w, EPS), MISTAKES_SMALL, atol=1e-6, axes=("batch", "token", "i"))
    expected = reference_ids("The capital of France is", 12)
    with plugged(model, "rms_norm", rms_norm):
        got = greedy_ids("The capital of France is", 12)
    same_tokens("the real model with your rms_norm", got, expected, real_model().tokenizer.decode)
    if len(got) != 12:
        raise CheckFailed("the real model with your rms_norm did not produce its 12 tokens")
    text = real_model().tokenizer.decode(got)
    return [f"your rms_norm ran inside the real model: its 61 calls per token (2 per layer x 30 layers + the final "
            f"norm) gave 'The capital of France is{text}', the reference's 12 tokens, token for token"]


EXERCISE = Exercise(
    number=2, name="rms_norm", title="RMSNorm", function="rms_norm",
    solution="minitransformer/core/layers.py: rms_norm (called by core/model.py's forward)",
    question="Why do llama-style models use RMSNorm instead of LayerNorm, and where in a layer does it sit?",
    lesson="lessons/01_autoregressive_loop.py (one forward pass per token); docs/code_tour.md step 3 (the forward)",
    hints=(
        "Each row (the last axis, d_model = 576) is normalized on its own: keepdims=True keeps the axis so the "
        "division broadcasts.",
        "rms = sqrt(mean(x^2) + eps): eps goes inside the square root.",
        "Multiply by weight (576,) at the end; there is no bias and no mean subtraction.",
    ),
    check=check, reference=layers.rms_norm, mistakes=MISTAKES_SMALL,
)
