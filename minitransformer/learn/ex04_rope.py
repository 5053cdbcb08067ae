"""Exercise 04: RoPE, the rotation that puts each query's and key's position into its vector."""

from __future__ import annotations

import functools

import numpy as np

from ..core import layers, model
from .track import CheckFailed, Exercise, compare, greedy_ids, plugged, random_inputs, real_model, same_tokens

HEADS, HEAD_DIM, BASE = 12, 64, 100_000.0    # SmolLM2: 9 query + 3 key heads rotated together, rope_base 1e5
PROMPT, TOKENS = "The capital of France is", 12


def _rotate(x, cos, sin, halves: bool, sign: float):
    """A rotation by sign * angle of the pairs (x[i], x[i + d/2]) (halves) or (x[2i], x[2i + 1])."""
    d = x.shape[-1]
    cos, sin = cos[:, None], sin[:, None]                                    # (B, 1, T, d/2)
    a, b = (x[..., :d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos - sign * b * sin, sign * a * sin + b * cos      # (B, heads, T, d/2) each
    if halves:
        return np.concatenate([first, second], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = first, second
    return out


def _always_halves(x, cos, sin, pairing):
    return _rotate(x, cos, sin, True, 1.0)


def _always_neighbours(x, cos, sin, pairing):
    return _rotate(x, cos, sin, False, 1.0)


def _backwards(x, cos, sin, pairing):
    return _rotate(x, cos, sin, pairing == "neox", -1.0)


MISTAKES = (
    ('the pairs are the two halves (x[i], x[i + 32]), the "neox" pairing, where "interleaved" was asked: interleaved '
     'pairs neighbours (x[2i], x[2i + 1]), as this model\'s GGUF weights expect', _always_halves),
    ('the pairs are neighbours (x[2i], x[2i + 1]), the "interleaved" pairing, where "neox" was asked: neox ("rotate '
     'half", Gemma) pairs x[i] with x[i + 32]', _always_neighbours),
    ("the sine's sign is flipped, which rotates by -angle (backwards): the pair (a, b) becomes "
     "(a cos - b sin, a sin + b cos)", _backwards),
)




@functools.cache
def _reference() -> tuple[tuple[int, ...], np.ndarray]:
    """The real model's greedy tokens and the prompt's next-token logits (V,) with the engine's own apply_rope."""
    return tuple(greedy_ids(PROMPT, TOKENS)), _prompt_logits()


def _prompt_logits() -> np.ndarray:
    m = real_model()
    ids = np.asarray(m.tokenizer.encode(PROMPT))[None]                       # (1, T)
    positions = np.arange(ids.shape[1])[None]                                # (1, T)
    return np.asarray(m.forward(ids, positions, last_only=True))[0]          # (V,)


def check(apply_rope) -> list[str]:
    (x,) = random_inputs(3, (2, HEADS, 7, HEAD_DIM))                         # (B, heads, T, d)
    cos_table, sin_table = layers.rope_table(512, HEAD_DIM, BASE)            # (512, 32) each
    positions = np.random.default_rng(3).integers(0, 512, size=(2, 7))      # (B, T): any positions, per row
    cos, sin = cos_table[positions], sin_table[positions]                    # (B, T, 32) each
    for pairing in ("interleaved", "neox"):
        inputs = (x, cos, sin, pairing)
        rotated = apply_rope(*inputs)                                          # (B, heads, T, d)
        compare(f"apply_rope(x, cos, sin, {pairing!r}) on x (2, 12, 7, 64)", rotated,
                layers.apply_rope(*inputs), inputs, MISTAKES, axes=("batch", "head", "token", "i"),
                float32=True)
    expected_ids, expected_logits = _reference()
    calls = 0

    def counted(*args):
        nonlocal calls
        calls += 1
        return apply_rope(*args)

    with plugged(model, "apply_rope", counted):
        logits = _prompt_logits()
        got = greedy_ids(PROMPT, TOKENS)
    tokenizer = real_model().tokenizer
    compare("the real model's next-token logits after the prompt, with your apply_rope", logits, expected_logits,
            atol=1e-3, rtol=1e-3, axes=("token id",))
    same_tokens("the real model with your apply_rope", got, list(expected_ids), tokenizer.decode)
    if calls == 0:
        raise CheckFailed("the real model never called your apply_rope (is the model using its own?)")
    gap = float(np.abs(logits - expected_logits).max())
    return [f"your apply_rope rotated the real model's queries and keys {calls} times (once per layer and forward "
            f"pass): the prompt's {expected_logits.size} next-token logits are within {gap:.1e} of the reference's, "
            f"and greedy decoding gave '{PROMPT}{tokenizer.decode(got)}', the reference's {TOKENS} tokens, "
            f"token for token"]


EXERCISE = Exercise(
    number=4, name="rope", title="RoPE (rotary position embedding)", function="apply_rope",
    solution="minitransformer/core/layers.py: apply_rope (called by core/model.py's project_qkv on q and k at once)",
    question="How does RoPE encode position, why is it applied to q and k but not v, and what do 'interleaved' and "
             "'rotate half' mean?",
    lesson="notebooks/01_tokenize_and_prefill.ipynb (q and k before and after RoPE, array by array); "
           "tests/test_rope_pairing.py (what the wrong pairing does to the logits)",
    hints=(
        "cos and sin are (B, T, 32): make them (B, 1, T, 32) with cos[:, None] so they broadcast over the heads.",
        'Pick the pairs: interleaved a, b = x[..., 0::2], x[..., 1::2]; neox a, b = x[..., :32], x[..., 32:].',
        "Rotate: a cos - b sin and a sin + b cos, then put them back where a and b came from (np.empty_like, then "
        "assign the slices; or np.concatenate for the halves).",
    ),
    check=check, reference=layers.apply_rope, mistakes=MISTAKES,
)
