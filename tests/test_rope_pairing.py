"""The RoPE pairing is the model's (ModelConfig.rope_pairing, from the architecture): "interleaved" rotates
(x[2i], x[2i+1]), as llama's GGUF files need; "neox" rotates (x[i], x[i + d/2]), as qwen2 or gemma3 files would.
Each is checked against NumPy written here, and a whole model with the other pairing is the other rotation."""

import dataclasses

import numpy as np
import pytest

from minitransformer.core.config import FAMILIES, ModelConfig
from minitransformer.core.gguf_file import open_gguf
from minitransformer.core.layers import apply_rope, rope_table
from minitransformer.core.model import Transformer

rng = np.random.default_rng(0)
D_HEAD, BASE = 8, 10000.0


def reference_rope(x, positions, first, second):
    """Rotate dimension pairs (first[i], second[i]) of x (B, heads, T, d) by position * BASE^(-2i/d), in float64,
    as a complex multiplication."""
    angle = positions[:, None, :, None] * BASE ** (-np.arange(0, D_HEAD, 2) / D_HEAD)   # (B, 1, T, d/2)
    z = (x[..., first].astype(np.float64) + 1j * x[..., second]) * np.exp(1j * angle)
    out = np.empty(x.shape)
    out[..., first], out[..., second] = z.real, z.imag
    return out


@pytest.mark.parametrize("pairing, first, second", [
    ("interleaved", np.arange(0, D_HEAD, 2), np.arange(1, D_HEAD, 2)),         # (0, 1), (2, 3), ...
    ("neox", np.arange(D_HEAD // 2), np.arange(D_HEAD // 2, D_HEAD)),           # (0, 4), (1, 5), ...
])
def test_each_pairing_rotates_its_pairs(pairing, first, second):
    cos, sin = rope_table(32, D_HEAD, BASE)
    x = rng.standard_normal((2, 3, 5, D_HEAD)).astype(np.float32)
    positions = np.array([[0, 3, 7, 11, 31], [1, 2, 3, 4, 5]])
    out = apply_rope(x, cos[positions], sin[positions], pairing)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, reference_rope(x, positions, first, second), atol=1e-5)
    np.testing.assert_array_equal(out[0, :, 0], x[0, :, 0])                    # position 0: no rotation


def test_the_two_pairings_differ():
    cos, sin = rope_table(8, D_HEAD, BASE)
    x = rng.standard_normal((1, 1, 1, D_HEAD)).astype(np.float32)
    rows = np.array([[5]])
    assert np.abs(apply_rope(x, cos[rows], sin[rows]) - apply_rope(x, cos[rows], sin[rows], "neox")).max() > 0.1


def test_the_pairing_comes_from_the_architecture(tiny_model):
    assert FAMILIES["llama"].rope_pairing == "interleaved"
    assert tiny_model.config.rope_pairing == "interleaved" and tiny_model.rope.pairing == "interleaved"
    assert ModelConfig.from_gguf(open_gguf(tiny_model.path)).rope_pairing == "interleaved"
    with pytest.raises(ValueError, match="rope_pairing"):
        dataclasses.replace(tiny_model.config, rope_pairing="rotate-half")


def test_a_neox_model_is_the_interleaved_model_with_its_pairs_regrouped(tiny_model):
    """Moving each head's q and k columns from interleaved order (0, 1, 2, 3, ...) to halves order (0, 2, ..., 1,
    3, ...) puts every rotated pair at (i, i + d/2): the neox model rotates the same pairs by the same angles, and
    q . k is a sum over the same products, so the logits agree (what llama.cpp's converter undoes for llama)."""
    c = tiny_model.config
    d = c.head_dim
    halves_order = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])         # new column j <- old column
    heads = c.n_heads + c.n_kv_heads                                                 # q and k heads, not v
    columns = np.concatenate([h * d + halves_order for h in range(heads)]
                             + [np.arange(heads * d, (heads + c.n_kv_heads) * d)])
    layers = [dataclasses.replace(layer, w_qkv=np.ascontiguousarray(layer.w_qkv[:, columns]))
              for layer in tiny_model.layers]
    neox = Transformer(dataclasses.replace(c, rope_pairing="neox"), tiny_model.tokenizer, tiny_model.embedding,
                       layers, tiny_model.final_norm, tiny_model.lm_head, tiny_model.xp, tiny_model.device)
    ids = rng.integers(0, c.vocab_size, size=(1, 20))
    positions = np.arange(20)[None]
    expected = tiny_model.forward(ids, positions)
    np.testing.assert_allclose(neox.forward(ids, positions), expected, rtol=1e-5, atol=1e-5)
    # and the same regrouped weights under the wrong (interleaved) pairing are a different model
    wrong = Transformer(c, tiny_model.tokenizer, tiny_model.embedding, layers, tiny_model.final_norm,
                        tiny_model.lm_head, tiny_model.xp, tiny_model.device)
    assert np.abs(wrong.forward(ids, positions) - expected).max() > 1e-3
