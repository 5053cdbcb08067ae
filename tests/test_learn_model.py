"""The model's exercises (02 rms_norm, 03 gated_ffn, 04 rope, 05 attention, 06 kv_cache): the committed learner
file fails as "not written yet", the engine's own function passes both stages, and a learner's classic mistake,
written as a learner would write it, fails with that mistake named."""

from __future__ import annotations

import textwrap

import pytest

from learner_files import check_fails, learner_file
from minitransformer.learn import track
from minitransformer.learn.track import CheckFailed


def load(name: str, source: str, tmp_path):
    """(exercise, function, file) of a learner's file holding `source` (a wrong solution, as a learner writes it)."""
    return learner_file(tmp_path, name, source, prelude="import numpy as np\n\n")


def fails_with(name: str, source: str, tmp_path) -> str:
    return check_fails(*load(name, source, tmp_path))


@pytest.mark.parametrize("name", ["rms_norm", "gated_ffn", "rope", "attention", "kv_cache"])
def test_untouched_file_is_not_written_yet(name, real_model_path):
    exercise = track.find(name)
    path = track.REPO_EXERCISES / exercise.file_name
    with pytest.raises(CheckFailed, match="not written yet"):
        track.run_check(exercise, track.load_function(exercise, path), path)


@pytest.mark.parametrize("name", ["rms_norm", "gated_ffn", "rope", "attention", "kv_cache"])
def test_the_engines_own_function_passes(name, real_model_path):
    exercise = track.find(name)
    lines = track.run_check(exercise, exercise.reference)
    assert lines and "token for token" in lines[-1]


# ------------------------------------------------------------------------------------------- 02 rms_norm

def test_rms_norm_eps_outside_the_square_root(tmp_path, real_model_path):
    message = fails_with("rms_norm", """
        def rms_norm(x, weight, eps):
            return x / (np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True)) + eps) * weight
    """, tmp_path)
    assert "a row of tiny values" in message and "eps is added outside the square root" in message


def test_rms_norm_that_subtracts_the_mean_is_layer_norm(tmp_path, real_model_path):
    message = fails_with("rms_norm", """
        def rms_norm(x, weight, eps):
            centred = x - x.mean(axis=-1, keepdims=True)
            return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) * weight
    """, tmp_path)
    assert "the mean is subtracted first: that is LayerNorm" in message


def test_rms_norm_over_the_whole_array(tmp_path, real_model_path):
    message = fails_with("rms_norm", """
        def rms_norm(x, weight, eps):
            return x / np.sqrt(np.mean(x * x) + eps) * weight
    """, tmp_path)
    assert "the mean is taken over the whole array, not over the last axis" in message


# ------------------------------------------------------------------------------------------ 03 gated_ffn

def test_gated_ffn_activation_on_the_up_half(tmp_path, real_model_path):
    message = fails_with("gated_ffn", """
        def swiglu(x, w_gate_up, w_down, activation):
            F = w_down.shape[0]
            gate, up = x @ w_gate_up[:, F:], x @ w_gate_up[:, :F]
            return (activation(gate) * up) @ w_down
        """, tmp_path)
    assert "gate and up are swapped" in message


def test_gated_ffn_activation_after_the_product(tmp_path, real_model_path):
    message = fails_with("gated_ffn", """
        def swiglu(x, w_gate_up, w_down, activation):
            F = w_down.shape[0]
            h = x @ w_gate_up
            return activation(h[:, :F] * h[:, F:]) @ w_down
        """, tmp_path)
    assert "applied after the product" in message


# ------------------------------------------------------------------------------------------------ 04 rope

def test_rope_rotate_half_where_interleaved_is_asked(tmp_path, real_model_path):
    message = fails_with("rope", """
        def apply_rope(x, cos, sin, pairing):
            half = x.shape[-1] // 2
            c, s = cos[:, None], sin[:, None]
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        """, tmp_path)
    assert "where \"interleaved\" was asked" in message


def test_rope_sine_sign_flipped(tmp_path, real_model_path):
    message = fails_with("rope", """
        def apply_rope(x, cos, sin, pairing):
            c, s = cos[:, None], sin[:, None]
            out = np.empty_like(x)
            if pairing == "neox":
                half = x.shape[-1] // 2
                a, b = x[..., :half], x[..., half:]
                out[..., :half], out[..., half:] = a * c + b * s, -a * s + b * c
            else:
                a, b = x[..., 0::2], x[..., 1::2]
                out[..., 0::2], out[..., 1::2] = a * c + b * s, -a * s + b * c
            return out
        """, tmp_path)
    assert "sine's sign is flipped" in message


# ------------------------------------------------------------------------------------------- 05 attention

ATTENTION = """
    import math

    def attention(q, k, v, q_positions, k_positions):
        G = q.shape[1] // k.shape[1]
        k, v = {spread}
        scores = q @ k.transpose(0, 1, 3, 2) / {scale}
        hidden = k_positions[:, None, :] {compare} q_positions[:, :, None]
        scores = np.where(hidden[:, None], -np.inf, scores)
        weights = np.exp(scores - {shift})
        return weights / weights.sum(-1, keepdims=True) @ v
    """
RIGHT = {"spread": "np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)", "scale": "math.sqrt(64)", "compare": ">",
         "shift": "scores.max(-1, keepdims=True)"}


def test_attention_as_written_here_is_right(tmp_path, real_model_path):
    exercise, fn, path = load("attention", ATTENTION.format(**RIGHT), tmp_path)
    assert "token for token" in track.run_check(exercise, fn, path)[-1]


def test_attention_gqa_heads_tiled(tmp_path, real_model_path):
    spread = "np.tile(k, (1, G, 1, 1)), np.tile(v, (1, G, 1, 1))"
    message = fails_with("attention", ATTENTION.format(**{**RIGHT, "spread": spread}), tmp_path)
    assert "query head h reads KV head h // 3" in message


def test_attention_mask_hides_its_own_key(tmp_path, real_model_path):
    message = fails_with("attention", ATTENTION.format(**{**RIGHT, "compare": ">="}), tmp_path)
    assert "a query cannot see its own key" in message


def test_attention_softmax_without_its_max_overflows_and_is_named(tmp_path, real_model_path):
    message = fails_with("attention", ATTENTION.format(**{**RIGHT, "shift": "0"}), tmp_path)
    assert "with large scores" in message and "got nan" in message
    assert "does not subtract each row's largest score before exp" in message


def test_attention_float64_scale(tmp_path, real_model_path):
    message = fails_with("attention", ATTENTION.format(**{**RIGHT, "scale": "np.sqrt(64)"}), tmp_path)
    assert "returns float64, not float32" in message


# -------------------------------------------------------------------------------------------- 06 kv_cache

KV_CACHE = """
    class KVCache:
        def __init__(self, config, max_len, batch=1):
            shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
            self.k = np.zeros(shape, np.float32)
            self.v = np.zeros(shape, np.float32)
            self.max_len, self.batch = max_len, batch
            self.length = 0

        def store(self, layer, start, k_new, v_new):
            T = k_new.shape[2]
            self.k[layer, :, start:start + T] = k_new.transpose(0, 2, 1, 3)
            self.v[layer, :, start:start + T] = v_new.transpose(0, 2, 1, 3)

        def read(self, layer, q, positions, attention, S):
            k = self.k[layer, :, :S].transpose(0, 2, 1, 3)
            v = self.v[layer, :, :S].transpose(0, 2, 1, 3)
            return attention.causal(q, k, v, positions, np.broadcast_to(np.arange(S), (self.batch, S)))

        def attend(self, layer, q, k_new, v_new, positions, attention):
            T = k_new.shape[2]
{attend}

        def advance(self, T):
{advance}
    """
STORE_THEN_READ = """
            self.store(layer, self.length, k_new, v_new)
            return self.read(layer, q, positions, attention, self.length + T)"""


def kv_cache(attend: str = STORE_THEN_READ, advance: str = "self.length += T") -> str:
    return KV_CACHE.format(attend=textwrap.indent(textwrap.dedent(attend).strip(), " " * 12),
                           advance=textwrap.indent(advance, " " * 12))


def test_kv_cache_as_written_here_is_right(tmp_path, real_model_path):
    exercise, fn, path = load("kv_cache", kv_cache(), tmp_path)
    assert "token for token" in track.run_check(exercise, fn, path)[-1]


def test_kv_cache_attends_before_appending(tmp_path, real_model_path):
    message = fails_with("kv_cache", kv_cache(attend="""
        out = self.read(layer, q, positions, attention, self.length)
        self.store(layer, self.length, k_new, v_new)
        return out"""), tmp_path)
    assert "a token cannot see itself" in message


def test_kv_cache_advances_inside_attend(tmp_path, real_model_path):
    message = fails_with("kv_cache", kv_cache(attend="""
        self.store(layer, self.length, k_new, v_new)
        self.length += T
        return self.read(layer, q, positions, attention, self.length)""", advance="pass"), tmp_path)
    assert "length moves on inside attend" in message


def test_kv_cache_writes_at_slot_zero(tmp_path, real_model_path):
    message = fails_with("kv_cache", kv_cache(attend="""
        self.store(layer, 0, k_new, v_new)
        return self.read(layer, q, positions, attention, self.length + T)"""), tmp_path)
    assert "every pass writes at slot 0" in message
