"""Exercise 14: int8 weight quantization per output channel (quantize/schemes.py's quantize_int8)."""

from __future__ import annotations

import functools

import numpy as np

from ..quantize import linear, schemes
from .track import CheckFailed, Exercise, compare, greedy_ids, plugged, random_inputs, real_model, same_tokens

PROMPT, MAX_TOKENS = "The capital of France is", 8


def _absmax_scale(w):
    scale = np.abs(w).max(axis=-1).astype(np.float32)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8), scale


def _truncated(w):
    scale = (np.abs(w).max(axis=-1) / 127).astype(np.float32)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(w / scale[:, None], -127, 127).astype(np.int8), scale


def _one_scale(w):
    scale = np.float32(np.abs(w).max() / 127)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


MISTAKES = (
    ("scale = max|w| of the row: it must be max|w| / 127, so the largest weight maps to 127 (with max|w| every q is "
     "-1, 0 or 1)", _absmax_scale),
    ("w / scale is truncated toward zero (astype(np.int8) alone): round it first (np.rint), or the error is up to a "
     "whole scale step instead of half", _truncated),
    ("one scale for the whole matrix: the engine keeps one per output row (per channel), scale of shape (out,), so "
     "one large row does not cost the others their precision", _one_scale),
)


def _stage1(quantize) -> None:
    w, = random_inputs(13, (48, 64), scale=0.05)                       # (out, in), weight-sized values
    w[5] *= 20                                                            # an outlier row
    w[11] = 0.0                                                           # a row of zeros: scale 1
    q, scale = quantize(w)
    q_ref, scale_ref = schemes.quantize_int8(w)
    compare("the scales of w (48, 64)", scale, scale_ref, (w,), [(label, lambda w, f=f: f(w)[1]) for label, f in
                                                                  MISTAKES], atol=0, rtol=1e-6, axes=("row",))
    if np.asarray(q).dtype != np.int8:
        raise CheckFailed(f"q must be int8 (a quarter of float32's bytes), got {np.asarray(q).dtype}")
    compare("q of w (48, 64)", q, q_ref, (w,), [(label, lambda w, f=f: f(w)[0]) for label, f in MISTAKES],
            atol=0, rtol=0, axes=("row", "column"))


@functools.cache
def _reference_ids() -> tuple[int, ...]:
    return tuple(greedy_ids(PROMPT, MAX_TOKENS, model=linear.quantize_model(real_model(), "int8")))


def check(quantize_int8) -> list[str]:
    _stage1(quantize_int8)
    expected = _reference_ids()
    with plugged(linear, "quantize_int8", quantize_int8):
        quantized = linear.quantize_model(real_model(), "int8")
    got = greedy_ids(PROMPT, MAX_TOKENS, model=quantized)
    decode = real_model().tokenizer.decode
    same_tokens("the real model quantized with your quantize_int8", got, expected, decode)
    worst = 0.0
    pairs = [(real_model().embedding, quantized.embedding)] + \
        [(getattr(layer, m).T, getattr(quantized.layers[i], m))               # (out, in), the stored layout
         for i, layer in enumerate(real_model().layers[:2]) for m in ("w_qkv", "w_down")]
    for w, stored in pairs:
        w = np.asarray(w)
        error = np.abs(stored.dequantize() - w).max(axis=1) / np.maximum(np.abs(w).max(axis=1), 1e-30)
        worst = max(worst, float(error.max()))
    return [f"your quantize_int8 stored every matrix of the real model (4 per layer: q|k|v, o, gate|up, down; and "
            f"the tied embedding: "
            f"{quantized.weight_bytes / 2**20:.0f} MiB against {real_model().weight_bytes / 2**20:.0f} MiB in "
            f"float32); the largest error of a weight relative to its row's largest |w|, over the embedding and "
            f"layers 0-1: {worst:.5f} (the bound is 1/254 = {1 / 254:.5f})",
            f"greedy on the int8 model: {decode(got)!r}, the reference int8 model's {MAX_TOKENS} tokens, token for "
            f"token"]


EXERCISE = Exercise(
    number=14, name="int8", title="int8 weights, one scale per output channel", function="quantize_int8",
    solution="minitransformer/quantize/schemes.py: quantize_int8 (core/backend.py: quantize_int8_rows; called by "
             "quantize/linear.py's QuantizedLinear.from_float for every matrix of quantize_model)",
    question="How does weight-only int8 quantization work, why per channel, and why does it speed up decode?",
    lesson="lessons/13_quantization.py (bytes, speed and quality of f32, int8, int4)",
    hints=(
        "One scale per row: np.abs(w).max(axis=1) / 127, shape (out,).",
        "q = np.rint(w / scale[:, None]), clipped to [-127, 127], then .astype(np.int8).",
        "A row of zeros has max 0: give it scale 1 (np.where(scale > 0, scale, 1.0)), and return scale as float32.",
    ),
    check=check, reference=schemes.quantize_int8, mistakes=MISTAKES,
)
