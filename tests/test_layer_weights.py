"""model.LAYER_WEIGHTS, the one description of a decoder layer's weights: it names LayerWeights' fields, the GGUF
tensors each is made of and its shape from the config, and the loaded model agrees with it."""


import numpy as np
import pytest

from minitransformer import load_model
from minitransformer.core.config import ModelConfig
from minitransformer.core.errors import ModelFileError
from minitransformer.core.gguf_file import open_gguf
from minitransformer.core.model import LAYER_MATRICES, LAYER_WEIGHTS, layer_weights
from tiny_model import DIMS, write_tiny_llama


def test_the_four_matrices_in_forward_order():
    """LAYER_WEIGHTS is read off LayerWeights' fields (model.weight), so the two cannot disagree; what the cost
    model, the figures and the shard plan rely on is the matrices' order and names."""
    assert [m.field for m in LAYER_MATRICES] == ["w_qkv", "wo", "w_gate_up", "w_down"]
    assert [m.label for m in LAYER_MATRICES] == ["qkv", "wo", "gate|up", "down"]    # bench/layer_cost's names


def test_every_loaded_weight_has_the_tables_shape_and_tensors(tiny_model):
    c = tiny_model.config
    D, F, q_dim, kv_dim = c.d_model, c.ffn_dim, c.q_dim, c.kv_dim
    expected = {"attn_norm": (D,), "w_qkv": (D, q_dim + 2 * kv_dim), "wo": (q_dim, D), "ffn_norm": (D,),
                "w_gate_up": (D, 2 * F), "w_down": (F, D)}                            # written out, not derived
    assert {w.field: w.shape(c) for w in layer_weights(c)} == expected
    file_shapes = {t.name: tuple(int(n) for n in t.shape) for t in open_gguf(tiny_model.path).tensors}
    for i, layer in enumerate(tiny_model.layers):
        for w in LAYER_WEIGHTS:
            if not w.present(c):                             # Gemma 3's extra norms: a llama layer has none
                assert getattr(layer, w.field) is None
                continue
            assert getattr(layer, w.field).shape == w.shape(c)
            for name, (_, shape) in zip(w.gguf_names(i), w.tensor_shapes(c)):
                assert file_shapes[name] == shape            # gguf lists a tensor's shape innermost first: (in, out)


def qkv_biases(names=("attn_q", "attn_k", "attn_v"), value: float = 0.5) -> dict:
    """Bias tensors for the tiny model's layers, by GGUF name."""
    sizes = {"attn_q": DIMS["n_heads"] * DIMS["head_dim"], "attn_k": DIMS["n_kv_heads"] * DIMS["head_dim"],
             "attn_v": DIMS["n_kv_heads"] * DIMS["head_dim"], "attn_output": DIMS["d_model"]}
    return {f"blk.{i}.{name}.bias": np.full(sizes[name], value, dtype=np.float32)
            for i in range(DIMS["n_layers"]) for name in names}


def test_the_config_reads_qkv_biases_and_the_forward_adds_them(tmp_path):
    plain_path = write_tiny_llama(tmp_path / "plain.gguf")
    plain = ModelConfig.from_gguf(open_gguf(plain_path))
    assert plain.bias_tensors == () and not plain.qkv_bias and not any(w.has_bias(plain) for w in LAYER_WEIGHTS)
    path = write_tiny_llama(tmp_path / "biased.gguf", extra=qkv_biases())
    config = ModelConfig.from_gguf(open_gguf(path))
    assert config.bias_tensors == ("attn_k", "attn_q", "attn_v") and config.qkv_bias
    assert [w.field for w in LAYER_WEIGHTS if w.has_bias(config)] == ["w_qkv"]
    model, reference = load_model(path), load_model(plain_path)
    q_dim, kv_dim = config.q_dim, config.kv_dim
    assert model.layers[0].b_qkv.shape == (q_dim + 2 * kv_dim,) and (model.layers[0].b_qkv == 0.5).all()
    assert reference.layers[0].b_qkv is None
    x = np.random.default_rng(0).standard_normal((3, config.d_model)).astype(np.float32)        # (T, D)
    ones = np.ones((1, 3), dtype=np.int64)
    cos, sin = model.rope_cos[np.arange(3)[None]], model.rope_sin[np.arange(3)[None]]
    q, k, v = model.project_qkv(model.layers[0], x, 1, 3, cos, sin)
    q0, k0, v0 = reference.project_qkv(reference.layers[0], x, 1, 3, cos, sin)
    np.testing.assert_allclose(v, v0 + 0.5, rtol=1e-6, atol=1e-6)       # v is not rotated: the bias shows as added
    assert not np.allclose(q, q0) and not np.allclose(k, k0)
    assert not np.allclose(model.forward(ones, np.arange(3)[None]), reference.forward(ones, np.arange(3)[None]))


@pytest.mark.parametrize("names,field", [(("attn_q",), "w_qkv"), (("attn_q", "attn_k", "attn_v", "attn_output"),
                                                                  "wo")])
def test_a_bias_the_forward_does_not_add_is_refused(tmp_path, names, field):
    """Only q, k and v biases together (Qwen2's) are added; a bias on q alone, or on the output projection, would
    be dropped, so the file is refused."""
    path = write_tiny_llama(tmp_path / "biased.gguf", extra=qkv_biases(names))
    with pytest.raises(ModelFileError, match=f"layers' {field} have biases"):
        load_model(path)
