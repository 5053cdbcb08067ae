"""The forward pass and the loader on the tiny random-weight GGUF model (fast), against a naive float64 reference."""

import numpy as np
import pytest

import minitransformer.core.attention as attention_module
import minitransformer.core.model as model_module
from minitransformer import load_model
from minitransformer.core.errors import InputError
from minitransformer.core.gguf_file import open_gguf
from tiny_model import DIMS, tiny_tensors, write_tiny_llama


def test_config_is_read_from_metadata(tiny_model):
    cfg = tiny_model.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
            cfg.context_length) == tuple(DIMS[k] for k in ("n_layers", "d_model", "n_heads", "n_kv_heads",
                                                           "head_dim", "ffn_dim", "context_length"))
    assert cfg.tied_embeddings and cfg.group_size == 2
    assert cfg.vocab_size == tiny_model.tokenizer.vocab_size


def test_weights_stored_once_as_float32_in_matmul_layout(tiny_model):
    cfg = tiny_model.config
    layer = tiny_model.layers[0]
    assert layer.wq.shape == (cfg.d_model, cfg.q_dim) and layer.wk.shape == (cfg.d_model, cfg.kv_dim)
    assert layer.w_down.shape == (cfg.ffn_dim, cfg.d_model)
    for array in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down, layer.attn_norm, layer.ffn_norm):
        # writeable: a copy in memory, not a read-only view of the memory-mapped file
        assert array.dtype == np.float32 and array.flags.c_contiguous and array.flags.writeable
    assert layer.w_qkv.shape == (cfg.d_model, cfg.q_dim + 2 * cfg.kv_dim)
    for view in (layer.wq, layer.wk, layer.wv):                            # the separate matrices, as views
        assert np.shares_memory(view, layer.w_qkv)
    assert np.shares_memory(layer.w_gate, layer.w_gate_up) and layer.w_up.shape == (cfg.d_model, cfg.ffn_dim)
    assert np.shares_memory(tiny_model.lm_head, tiny_model.embedding)      # tied: a view, not a second copy
    n_params = sum(int(np.prod(t.shape)) for t in open_gguf(tiny_model.path).tensors)
    assert tiny_model.weight_bytes == 4 * n_params


def test_loaded_weights_are_the_values_written(tiny_model):
    """Against the float values the writer started from, so a transposition or a wrong dequantization shows:
    F32 exactly, Q8_0 within half a step (absmax/127 per block), Q4_1 within a step ((max-min)/15 per block)."""
    reader = open_gguf(tiny_model.path)
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {kinds["token_embd.weight"], kinds["blk.0.attn_q.weight"], kinds["blk.0.attn_v.weight"]} == \
        {"Q8_0", "Q4_1", "F32"}
    written = tiny_tensors(tiny_model.config.vocab_size)
    layer = tiny_model.layers[1]
    np.testing.assert_array_equal(layer.wv, written["blk.1.attn_v.weight"].T)          # F32: (D, K*d)
    embd = written["token_embd.weight"]
    assert np.abs(tiny_model.embedding - embd).max() <= np.abs(embd).max() / 127
    for name, loaded in (("blk.1.attn_q.weight", layer.wq), ("blk.1.ffn_down.weight", layer.w_down)):
        original = written[name]                                                        # (out, in)
        blocks = original.reshape(original.shape[0], -1, 32)
        step = (blocks.max(-1) - blocks.min(-1)).max() / 15
        assert np.abs(loaded.T - original).max() <= step


def naive_forward(model, ids):
    """The llama forward written as plainly as possible, in float64, one sequence: (T,) -> (T, V).
    RoPE pairs adjacent dimensions (the GGUF layout), computed with complex numbers."""
    cfg = model.config
    T, d, H, K = len(ids), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    W = lambda a: np.asarray(a, dtype=np.float64)
    norm = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * W(w)
    angle = np.arange(T)[:, None] * cfg.rope_base ** (-np.arange(0, d, 2) / d)              # (T, d/2)

    def rope(x):                                           # (T, heads, d)
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angle)[:, None, :]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    x = W(model.embedding)[ids]
    for L in model.layers:
        a = norm(x, L.attn_norm)
        q = rope((a @ W(L.wq)).reshape(T, H, d))
        k = rope((a @ W(L.wk)).reshape(T, K, d))
        v = (a @ W(L.wv)).reshape(T, K, d)
        out = np.zeros((T, H, d))
        for h in range(H):
            s = q[:, h] @ k[:, h // (H // K)].T / np.sqrt(d)
            s[np.triu_indices(T, 1)] = -np.inf
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // (H // K)]
        x = x + out.reshape(T, H * d) @ W(L.wo)
        f = norm(x, L.ffn_norm)
        g = f @ W(L.w_gate)
        x = x + (g / (1 + np.exp(-g)) * (f @ W(L.w_up))) @ W(L.w_down)
    return norm(x, model.final_norm) @ W(model.embedding).T


def test_forward_matches_naive_float64_reference(tiny_model):
    ids = np.random.default_rng(1).integers(0, tiny_model.config.vocab_size, size=40)
    logits = tiny_model.forward(ids[None], np.arange(40)[None])
    assert logits.shape == (1, 40, tiny_model.config.vocab_size) and logits.dtype == np.float32
    ref = naive_forward(tiny_model, ids)
    rel = np.abs(logits[0] - ref).max(-1) / np.abs(ref).max(-1)
    assert rel.max() <= 1e-5


def test_no_float64_inside_the_forward(tiny_model, monkeypatch):
    """Every activation that leaves a building block is float32 (float64 scalars must not promote it: backend.py)."""
    seen = []
    for module, name in ((model_module, "rms_norm"), (model_module, "apply_rope"),
                         (attention_module, "causal_attention"), (model_module, "swiglu")):
        original = getattr(module, name)

        def recording(*args, _original=original, _name=name, **kwargs):
            for arg in args:
                if isinstance(arg, np.ndarray) and arg.dtype.kind == "f":
                    seen.append((_name + " input", arg.dtype))
            out = _original(*args, **kwargs)
            seen.append((_name, out.dtype))
            return out
        monkeypatch.setattr(module, name, recording)
    logits = tiny_model.forward(np.array([[5, 6, 7]]), np.array([[0, 1, 2]]))
    assert logits.dtype == np.float32
    assert {dtype for _, dtype in seen} == {np.dtype(np.float32)}, [s for s in seen if s[1] != np.float32]
    assert len({name for name, _ in seen}) == 8


def test_batch_rows_are_independent(tiny_model):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, tiny_model.config.vocab_size, size=(3, 12))
    positions = np.tile(np.arange(12), (3, 1))
    batched = tiny_model.forward(ids, positions)
    for row in range(3):
        single = tiny_model.forward(ids[row:row + 1], positions[row:row + 1])
        np.testing.assert_allclose(batched[row], single[0], rtol=1e-5, atol=1e-5)


def test_last_only_and_causality(tiny_model):
    ids = np.array([[10, 20, 30, 40, 50]])
    positions = np.arange(5)[None]
    full = tiny_model.forward(ids, positions)
    # the same math on fewer rows: equal up to float32 rounding (BLAS may block a 1-row and a 5-row GEMM apart)
    np.testing.assert_allclose(tiny_model.forward(ids, positions, last_only=True), full[:, -1], rtol=1e-5,
                               atol=1e-5)
    changed = ids.copy()
    changed[0, -1] = 60                                # a later token never changes earlier logits
    np.testing.assert_array_equal(tiny_model.forward(changed, positions)[0, :4], full[0, :4])


class ListCache:
    """The smallest object honouring the model's cache protocol: concatenate everything so far, attend to it."""

    def __init__(self, n_layers):
        self.k, self.v, self.positions = [None] * n_layers, [None] * n_layers, [None] * n_layers

    def attend(self, layer, q, k_new, v_new, positions, attention):
        if self.k[layer] is None:
            self.k[layer], self.v[layer], self.positions[layer] = k_new, v_new, positions
        else:
            self.k[layer] = np.concatenate([self.k[layer], k_new], axis=2)
            self.v[layer] = np.concatenate([self.v[layer], v_new], axis=2)
            self.positions[layer] = np.concatenate([self.positions[layer], positions], axis=1)
        return attention.causal(q, self.k[layer], self.v[layer], positions, self.positions[layer])

    def advance(self, T):
        pass


def test_kv_protocol_gives_the_same_logits_as_recomputing(tiny_model):
    ids = np.random.default_rng(3).integers(0, tiny_model.config.vocab_size, size=(1, 9))
    full = tiny_model.forward(ids, np.arange(9)[None])
    cache = ListCache(tiny_model.config.n_layers)
    tiny_model.forward(ids[:, :6], np.arange(6)[None], cache)
    for t in range(6, 9):                              # then one token at a time, reading the cache
        step = tiny_model.forward(ids[:, t:t + 1], np.array([[t]]), cache, last_only=True)
        np.testing.assert_allclose(step[0], full[0, t], rtol=1e-5, atol=1e-5)


def test_untied_output_weight_is_used(tmp_path):
    model = load_model(write_tiny_llama(tmp_path / "untied.gguf", tied=False))
    assert not model.config.tied_embeddings
    assert not np.shares_memory(model.lm_head, model.embedding)
    assert model.lm_head.shape == (model.config.d_model, model.config.vocab_size)


@pytest.mark.parametrize("ids,positions,message", [
    ([[1, 2]], [[0]], "same shape"),
    ([[1, 10_000]], [[0, 1]], "outside the vocabulary"),
    ([[-1]], [[0]], "outside the vocabulary"),
    ([[1]], [[500]], "position 500 is outside the context window"),
    ([[1, 2]], [[-1, 0]], "position -1 is outside the context window"),
    ([1, 2], [0, 1], r"shape \(B, T\)"),
    ([[1.5]], [[0]], "must be integers"),
    ([[1, 2], [3]], [[0, 1], [0]], "rectangular"),
])
def test_forward_rejects_bad_input(tiny_model, ids, positions, message):
    with pytest.raises(InputError, match=message):
        tiny_model.forward(ids, positions)                # plain lists, as a user may pass them
