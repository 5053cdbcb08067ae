"""model.LAYER_WEIGHTS, the one description of a decoder layer's weights: it names LayerWeights' fields, the GGUF
tensors each is made of and its shape from the config, and the loaded model agrees with it."""

import dataclasses

import numpy as np
import pytest

from minitransformer import load_model
from minitransformer.config import ModelConfig
from minitransformer.errors import ModelFileError
from minitransformer.model import LAYER_MATRICES, LAYER_WEIGHTS, LayerWeights, layer_weights
from minitransformer.weights import open_gguf
from tiny_model import DIMS, write_tiny_llama


def test_the_table_is_layer_weights_fields_in_order():
    assert [w.field for w in LAYER_WEIGHTS] == [f.name for f in dataclasses.fields(LayerWeights)]
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


def test_the_config_reads_biases_and_the_loader_refuses_them(tmp_path):
    plain = ModelConfig.from_gguf(open_gguf(write_tiny_llama(tmp_path / "plain.gguf")))
    assert plain.bias_tensors == () and not any(w.has_bias(plain) for w in LAYER_WEIGHTS)
    q_dim, kv_dim = DIMS["n_heads"] * DIMS["head_dim"], DIMS["n_kv_heads"] * DIMS["head_dim"]
    biases = {f"blk.{i}.{name}.bias": np.full(n, 0.5, dtype=np.float32)
              for i in range(DIMS["n_layers"]) for name, n in (("attn_q", q_dim), ("attn_k", kv_dim),
                                                                ("attn_v", kv_dim))}
    path = write_tiny_llama(tmp_path / "biased.gguf", extra=biases)
    config = ModelConfig.from_gguf(open_gguf(path))
    assert config.bias_tensors == ("attn_k", "attn_q", "attn_v")
    assert [w.field for w in LAYER_WEIGHTS if w.has_bias(config)] == ["w_qkv"]
    with pytest.raises(ModelFileError, match="w_qkv have biases"):
        load_model(path)
