"""float16 weight storage with float32 accumulation: quantize.schemes.matmul_float16, the "f16" QuantizedLinear,
load_model(dtype="float16") and --weights f16.

Tolerances come from float16's 11-bit significand: rounding to the nearest float16 changes a value by at most
u = 2^-11 of itself (normal range), and each f16 product rounds three things (its float32 input x, its weights once at
load, its float16 output y).
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from minitransformer import SamplingParams, generate, load_model
from minitransformer.core import attention as attention_module, model as model_module
from minitransformer.core.errors import InputError
from minitransformer.core.generate import make_request
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.prefill import prefill
from minitransformer.quantize import (
    FLOAT16_MAX,
    QuantizedLinear,
    expected_weight_bytes,
    matmul_float16,
    quantize_model,
    quantized_bytes,
    set_use_kernel,
)

U = 2.0 ** -11                     # float16 unit roundoff (round to nearest, 11-bit significand)


def ulp16(values) -> np.ndarray:
    """The float16 spacing at each value: one unit in the last place."""
    return np.spacing(np.abs(np.asarray(values, dtype=np.float16))).astype(np.float64)


# ----------------------------------------------------------------------------------------- the product itself

def test_matmul_float16_is_the_exact_product_rounded_once_to_float16():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((5, 576)) * rng.choice([0.01, 1.0, 30.0], size=(5, 1))).astype(np.float16)
    b = rng.standard_normal((576, 200)).astype(np.float16)
    got = matmul_float16(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)          # products and sums of the rounded inputs, float64
    reference = exact.astype(np.float16)                          # rounded once, as cuBLAS writes C
    assert got.dtype == np.float16 and got.shape == (5, 200)
    error = np.abs(got.astype(np.float64) - reference.astype(np.float64))
    assert (error <= ulp16(reference)).all(), f"{int((error > ulp16(reference)).sum())} entries beyond 1 ulp"
    assert (got == reference).mean() > 0.95                       # mostly exact; the rest within one ulp


def test_matmul_float16_accumulates_in_float32_not_float16():
    """4096 x (1 * 1): a float16 running sum stops at 2048 (2048 + 1 rounds back to 2048); float32's does not."""
    ones = np.ones((1, 4096), np.float16)
    assert matmul_float16(ones, ones.T)[0, 0] == 4096


# ----------------------------------------------------------------------------------------- the f16 matrix

def test_f16_linear_stores_float16_and_multiplies_within_the_rounding_budget():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((37, 96)).astype(np.float32)                                     # (out, in)
    lin = QuantizedLinear.from_float(w, "f16")
    (w16,) = lin.data
    assert w16.dtype == np.float16 and w16.flags.c_contiguous and lin.shape == (96, 37)
    assert lin.nbytes == quantized_bytes(37, 96, "f16") == 2 * 37 * 96
    np.testing.assert_array_equal(lin.dequantize(), w.astype(np.float16).astype(np.float32))
    ids = np.array([3, 0, 36, 3])
    assert lin[ids].dtype == np.float32
    np.testing.assert_array_equal(lin[ids], lin.dequantize()[ids])                           # embedding lookup
    x = rng.standard_normal((6, 96)).astype(np.float32)
    y = x @ lin                                                                              # via __rmatmul__
    assert y.dtype == np.float32 and y.shape == (6, 37)
    # Against the float32 matrix in float64: x and w each off by <= u relative, y by <= u relative after the sum,
    # so |y - x w| <= (2u + u^2) sum|x||w| + u |x w| (+ float32 summation, far smaller).
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = (2 * U + U * U) * (np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64)) + U * np.abs(exact)
    assert (np.abs(y - exact) <= bound).all()
    assert np.abs(y - exact).max() > 0                                                       # really rounded
    # ... and exactly the f16 arithmetic: x and w rounded to float16, summed exactly, rounded once (<= 1 ulp)
    rounded = (x.astype(np.float16).astype(np.float64) @ w16.T.astype(np.float64)).astype(np.float16)
    assert (np.abs(y - rounded.astype(np.float64)) <= ulp16(rounded)).all()
    # use_kernel does nothing for f16 (the dequantize-GEMV kernel is int8 / int4): same numbers, no kernel call
    lin.use_kernel = True
    np.testing.assert_array_equal(x[:1] @ lin, y[:1])


def test_f16_refuses_weights_beyond_float16_range():
    w = np.ones((4, 8), np.float32)
    w[2, 5] = 70000.0                                             # > 65504: float16 would make it inf
    with pytest.raises(InputError, match=r"largest \|w\| is 70000, above float16's maximum 65504"):
        QuantizedLinear.from_float(w, "f16")
    assert FLOAT16_MAX == float(np.finfo(np.float16).max)


# ----------------------------------------------------------------------------------------- the tiny model

def independent_f16_bytes(c) -> int:
    """2 bytes per matrix weight (embedding included, tied lm_head stored once), 4 per norm weight."""
    matrices = c.n_layers * c.d_model * (c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim   # q, k, v
                                         + c.n_heads * c.head_dim + 3 * c.ffn_dim)                # o, gate/up/down
    norms = (2 * c.n_layers + 1) * c.d_model
    return 2 * (matrices + c.vocab_size * c.d_model) + 4 * norms


@pytest.fixture(scope="module")
def tiny_f16(tiny_model_path):
    return load_model(tiny_model_path, dtype="float16")


def test_float16_tiny_model_logits_dtypes_and_bytes(tiny_model, tiny_f16, monkeypatch):
    c = tiny_model.config
    assert tiny_f16.weight_scheme == "f16" and tiny_f16.layers[0].w_down.data[0].dtype == np.float16
    assert tiny_f16.embedding.data[0].dtype == np.float16 and tiny_f16.lm_head is tiny_f16.embedding
    assert tiny_f16.layers[0].attn_norm.dtype == np.float32                    # norms stay float32
    assert tiny_f16.weight_bytes == expected_weight_bytes(c, "f16", "f16") == independent_f16_bytes(c)
    norm_bytes = 4 * (2 * c.n_layers + 1) * c.d_model
    assert tiny_f16.weight_bytes - norm_bytes == (tiny_model.weight_bytes - norm_bytes) // 2   # matrices: exactly half

    seen = []                                                     # (what, dtype) of every activation on the way
    original_norm, original_attention = model_module.rms_norm, attention_module.causal_attention
    monkeypatch.setattr(model_module, "rms_norm", lambda x, w, eps: seen.append(("h", x.dtype))
                        or original_norm(x, w, eps))
    monkeypatch.setattr(attention_module, "causal_attention", lambda q, k, v, *p: seen.extend(
        [("q", q.dtype), ("k", k.dtype), ("v", v.dtype)]) or original_attention(q, k, v, *p))
    original_matmul = QuantizedLinear._matmul_float16
    monkeypatch.setattr(QuantizedLinear, "_matmul_float16", lambda self, x: seen.append(("x", x.dtype))
                        or original_matmul(self, x))
    ids = [5, 70, 3, 9, 120, 44, 7, 200]
    cache = KVCache(c, len(ids))
    logits = prefill(tiny_f16, ids, cache, all_logits=True)[0]                                 # (T, V)
    assert cache.k.dtype == cache.v.dtype == np.float32 and logits.dtype == np.float32
    assert {dtype for _, dtype in seen} == {np.dtype(np.float32)} and ("x", np.float32) in seen
    monkeypatch.undo()

    reference = prefill(tiny_model, ids, KVCache(c, len(ids)), all_logits=True)[0]
    # Budget: every rounding moves a value by <= u of itself, and to first order the changes add up. On the longest
    # path to a logit: the embedding row (1), per layer 4 products x 3 roundings (x, w, y), the lm_head's 3:
    # 1 + 12 L + 3 roundings, each <= u of the logits' scale.
    roundings = 1 + 12 * c.n_layers + 3
    tolerance = roundings * U * float(np.abs(reference).max())
    difference = float(np.abs(logits - reference).max())
    assert 0 < difference <= tolerance, f"max |f16 - f32| = {difference:.4g}, budget {tolerance:.4g}"
    assert (logits.argmax(-1) == reference.argmax(-1)).all()


def test_float16_load_is_the_float32_load_then_quantize_f16(tiny_model, tiny_f16, kernel_sized_path):
    ids, pos = np.array([[5, 70, 3, 9]]), np.arange(4)[None]
    again = quantize_model(tiny_model, "f16", embedding="f16")
    np.testing.assert_array_equal(tiny_f16.forward(ids, pos), again.forward(ids, pos))
    assert again.weight_bytes == expected_weight_bytes(tiny_model.config, "f16", "f16")
    # f16 layers with the default int8 embedding also add up
    mixed = quantize_model(tiny_model, "f16")
    assert mixed.weight_bytes == expected_weight_bytes(tiny_model.config, "f16")
    # the attention choice made at load survives the conversion (quantize_model used to reset it to "auto")
    assert load_model(kernel_sized_path, attention="kernels", dtype="float16").kernel_attention is not None
    # use_kernel (what --device gpu sets for int8 / int4) changes nothing for f16
    set_use_kernel(again, True)
    np.testing.assert_array_equal(again.forward(ids, pos), tiny_f16.forward(ids, pos))


def test_other_dtypes_are_refused_with_their_reason(tiny_model_path):
    with pytest.raises(InputError, match="bfloat16 is not available: NumPy has no bfloat16"):
        load_model(tiny_model_path, dtype="bfloat16")
    with pytest.raises(InputError, match="unknown dtype 'float8'; choose float32 or float16"):
        load_model(tiny_model_path, dtype="float8")


def test_cli_weights_f16_generates_what_the_api_does(tiny_model_path, tiny_f16):
    result = subprocess.run([sys.executable, "-m", "minitransformer", "generate", "Hi", "--weights", "f16",
                             "--max-tokens", "4", "--json", "--model", str(tiny_model_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    expected = generate(tiny_f16, "Hi", SamplingParams(max_tokens=4, temperature=0.0))
    assert out["token_ids"] == expected.token_ids and out["usage"]["completion_tokens"] == len(expected.token_ids)


# ----------------------------------------------------------------------------------------- the real model

def test_float16_real_model_greedy_equals_float32_and_nothing_overflows(real_model, monkeypatch):
    """Measured largest |x| into / |y| out of the float16 products on several prompts (scripts aside): x 3346,
    y 27280 (layer 11's ffn_down): 2.4x under float16's 65504. Checked again here on the prompts of this test."""
    f16 = quantize_model(real_model, "f16", embedding="f16")          # what load_model(dtype="float16") does
    largest = {"x": 0.0, "y": 0.0}
    original = QuantizedLinear._matmul_float16

    def recording(self, x):
        y = original(self, x)
        largest["x"] = max(largest["x"], float(np.abs(x).max()))
        largest["y"] = max(largest["y"], float(np.abs(y).max()))
        return y

    monkeypatch.setattr(QuantizedLinear, "_matmul_float16", recording)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    differences = []
    for prompt, chat in (("The capital of France is", False), ("Write a story about a dragon.", True)):
        ids = make_request(real_model, prompt, params, chat=chat).prompt_token_ids
        pos = np.arange(len(ids))[None]
        logits = f16.forward([ids], pos)                                            # (1, T, V)
        assert logits.dtype == np.float32 and np.isfinite(logits).all()
        differences.append(float(np.abs(logits - real_model.forward([ids], pos)).max()))
        want, got = generate(real_model, prompt, params, chat=chat), generate(f16, prompt, params, chat=chat)
        assert got.token_ids == want.token_ids, (f"{prompt!r}: f16 {got.token_ids} vs f32 {want.token_ids}; "
                                                 f"prompt logits max |f16 - f32| {differences[-1]:.4g}")
    assert largest["y"] < FLOAT16_MAX and largest["x"] < FLOAT16_MAX, (largest, differences)
    print(f"f16 vs f32 prompt logits max |diff| {differences}, largest |x| in / |y| out {largest}")
