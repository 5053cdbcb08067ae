"""The decoder-only transformer (llama architecture) and `load_model`.

    token ids -> embedding -> n_layers x [RMSNorm -> attention (RoPE, GQA, causal) -> + residual
                                          RMSNorm -> SwiGLU feed-forward         -> + residual]
              -> RMSNorm -> lm_head (tied to the embedding) -> logits

Every activation is float32 and every matmul is 2-D: `(B, T, D) @ (D, O)` would make NumPy loop over the batch rows,
one small matmul each, far slower than one 2-D matmul, so hidden states live as (B*T, D) and are viewed as heads only
inside attention.
Weights are dequantized once at load time and stored once, in the (in, out) layout that `x @ w` wants.

The KV cache is passed in (`kv`), never owned here: prefill.py and decode.py (and the serving engine) decide what
to keep; the model only asks the cache for the keys and values to attend to. Any object with
`update(layer, k_new, v_new, positions) -> (k, v, key_positions)` works: k_new, v_new (B, K, T, d) are this call's
keys/values, k, v (B, K, S, d) everything to attend to, key_positions (B, S) their positions, with this call's
keys last, in order (k[:, :, S-T:] is k_new): attention skips the keys after each query's own (causal_attention).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from .attention_backend import choose_attention
from .backend import DTYPE, INDEX_DTYPE, get_xp
from .config import ModelConfig
from .errors import InputError, ModelFileError
from .layers import apply_rope, causal_attention, rms_norm, swiglu
from .rope import RopeTable
from .weights import dequantize, open_gguf, resolve_model_path


@dataclass
class LayerWeights:
    """One decoder layer's weights, each in the layout its matmul wants.

    Q, K and V are one (D, H*d + 2*K*d) matrix and gate and up one (D, 2F) matrix: x @ w_qkv is one matmul where
    three would each pay a call and a pass over x, and at decode a matrix-vector product is limited by how fast its
    weights stream from memory, and a few large matrices stream faster than many small ones (measured on 2 cores:
    the matrix-vector products of all 30 layers took ~19 ms as seven matmuls per layer, ~16 ms as four).
    The separate matrices are still there to read, as views (wq, wk, wv, w_gate, w_up), at no extra memory.
    """
    attn_norm: object   # (D,)
    w_qkv: object       # (D, H*d + 2*K*d): columns [q | k | v]
    wo: object          # (H*d, D)
    ffn_norm: object    # (D,)
    w_gate_up: object   # (D, 2F): columns [gate | up]
    w_down: object      # (F, D)

    @property
    def wq(self):       # (D, H*d)
        return self.w_qkv[:, :self.wo.shape[0]]

    @property
    def wk(self):       # (D, K*d)
        q_dim = self.wo.shape[0]
        return self.w_qkv[:, q_dim:q_dim + (self.w_qkv.shape[1] - q_dim) // 2]

    @property
    def wv(self):       # (D, K*d)
        q_dim = self.wo.shape[0]
        return self.w_qkv[:, q_dim + (self.w_qkv.shape[1] - q_dim) // 2:]

    @property
    def w_gate(self):   # (D, F)
        return self.w_gate_up[:, :self.w_down.shape[0]]

    @property
    def w_up(self):     # (D, F)
        return self.w_gate_up[:, self.w_down.shape[0]:]


VOCAB_CHUNK = 4096     # vocabulary rows per lm_head product when several rows need logits (output_logits)


class Transformer:
    """A loaded model: config, tokenizer, float32 weights on one device, and `forward`."""

    def __init__(self, config: ModelConfig, tokenizer, embedding, layers: list[LayerWeights], final_norm,
                 lm_head, xp, device: str, path: Path | None = None, load_seconds: float = 0.0,
                 attention_mode: str = "auto"):
        self.config = config
        self.tokenizer = tokenizer
        self.embedding = embedding          # (V, D): row i is token i's vector
        self.layers = layers
        self.final_norm = final_norm        # (D,)
        self.lm_head = lm_head              # (D, V): embedding.T (a view, no copy) when the embeddings are tied
        self.xp = xp
        self.device = device
        self.path = path
        self.load_seconds = load_seconds
        self.kernel_attention = choose_attention(attention_mode, device)   # None: layers.attention
        self.rope = RopeTable(config, xp)       # cos and sin of the positions in use (rope.py)

    rope_cos = property(lambda self: self.rope.cos)     # (positions, d/2): row p rotates position p
    rope_sin = property(lambda self: self.rope.sin)     # (positions, d/2)

    # ------------------------------------------------------------------ the forward pass, in reading order

    def forward(self, token_ids, positions, kv=None, last_only: bool = False):
        """token_ids (B, T), positions (B, T) -> logits (B, T, V), or (B, V) for the last position if last_only.

        With kv=None the T tokens attend only to each other (a whole prompt, or the no-cache baseline).
        """
        token_ids, positions = self._check_inputs(token_ids, positions)
        B, T = token_ids.shape
        h = self.embedding[token_ids.reshape(-1)]                          # (B*T, D)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]      # (B, T, d/2) each
        for index, layer in enumerate(self.layers):
            h = h + self.attention_block(index, layer, rms_norm(h, layer.attn_norm, self.config.norm_eps),
                                         positions, cos, sin, kv)
            h = h + swiglu(rms_norm(h, layer.ffn_norm, self.config.norm_eps), layer.w_gate_up, layer.w_down)
        if last_only:
            return self.output_logits(h.reshape(B, T, -1)[:, -1])         # (B, V): only the next token's logits
        return self.output_logits(h).reshape(B, T, -1)                     # (B, T, V)

    def attention_block(self, index: int, layer: LayerWeights, x, positions, cos, sin, kv):
        """Self-attention of one layer.   x (B*T, D) normalized hidden states -> (B*T, D)."""
        cfg = self.config
        B, T = positions.shape
        q, k, v = self.project_qkv(layer, x, B, T, cos, sin)   # (B, H, T, d), (B, K, T, d), (B, K, T, d)
        if kv is None:
            k_all, v_all, key_positions = k, v, positions
        else:
            k_all, v_all, key_positions = kv.update(index, k, v, positions)        # (B, K, S, d), (B, S)
        attend = causal_attention if self.kernel_attention is None else self.kernel_attention
        out = attend(q, k_all, v_all, positions, key_positions)                   # (B, H, T, d)
        return out.transpose(0, 2, 1, 3).reshape(B * T, cfg.q_dim) @ layer.wo      # (B*T, D)

    def project_qkv(self, layer: LayerWeights, x, B: int, T: int, cos, sin):
        """x (B*T, D) -> q (B, H, T, d), k (B, K, T, d) rotated by RoPE, and v (B, K, T, d)."""
        cfg = self.config
        H, K = cfg.n_heads, cfg.n_kv_heads
        qkv = x @ layer.w_qkv                                                       # (B*T, (H + 2K) * d)
        heads = qkv.reshape(B, T, H + 2 * K, cfg.head_dim).transpose(0, 2, 1, 3)   # (B, H + 2K, T, d)
        qk = apply_rope(heads[:, :H + K], cos, sin)            # (B, H + K, T, d): q and k rotated in one call
        return qk[:, :H], qk[:, H:], heads[:, H + K:]

    def forward_flat(self, token_ids, positions, attend, logits_rows):
        """The serving engine's forward: the tokens of many sequences laid end to end, attention left to `attend`.

        token_ids (N,), positions (N,) int arrays on the device: several decodes and prefill chunks of different
        lengths in one pass. Every matmul runs once over all N rows (the weights are read once per step, whatever
        the mix); only attention needs to know which rows belong to which sequence, so the caller does it:
        attend(layer_index, q (H, N, d), k (K, N, d), v (K, N, d)) -> (H, N, d) stores this step's keys and values
        and attends each row to its own sequence (serving/model_runner.py, through the paged KV cache).
        logits_rows: the rows whose next-token logits are wanted -> logits (len(logits_rows), V).
        """
        N = positions.shape[0]
        if isinstance(positions, np.ndarray):          # on a GPU the engine has reserved its longest sequence
            self.rope.reserve(int(positions.max()) + 1)
        h = self.embedding[token_ids]                                      # (N, D)
        cos, sin = self.rope_cos[positions][None], self.rope_sin[positions][None]   # (1, N, d/2) each
        for index, layer in enumerate(self.layers):
            x = rms_norm(h, layer.attn_norm, self.config.norm_eps)
            q, k, v = self.project_qkv(layer, x, 1, N, cos, sin)          # (1, H, N, d), (1, K, N, d) x 2
            out = attend(index, q[0], k[0], v[0])                          # (H, N, d)
            h = h + out.transpose(1, 0, 2).reshape(N, self.config.q_dim) @ layer.wo       # (N, D)
            h = h + swiglu(rms_norm(h, layer.ffn_norm, self.config.norm_eps), layer.w_gate_up, layer.w_down)
        return self.output_logits(h[logits_rows])                          # (R, V): only rows that sample

    def output_logits(self, h):
        """The final RMSNorm and lm_head: h (R, D) last hidden states -> logits (R, V), one score per token.

        For several rows it is computed as (lm_head.T @ x.T).T, VOCAB_CHUNK vocabulary rows at a time: with tied
        embeddings lm_head.T is the row-major (V, D) embedding table itself, and OpenBLAS runs (V, D) @ (D, R) ~1.7x
        faster than (R, D) @ (D, V) through the transposed view at R = 16 (the serving engine's decode step), and
        4096-row slices of the table faster again than the whole (measured on 2 cores: 12.8 -> 10.8 ms at R = 16,
        12.1 -> 8.6 ms at R = 4, 25.7 -> 23.7 ms at R = 64). The same products, summed in another order: logits agree
        to float32 rounding. One row (batch-1 decode, a prompt's last token) is one matrix-vector product.
        """
        xp = self.xp
        x = rms_norm(h, self.final_norm, self.config.norm_eps)            # (R, D)
        if x.shape[0] == 1 or not isinstance(self.lm_head, xp.ndarray):   # one row, or a quantize.QuantizedLinear
            return x @ self.lm_head                                        # (R, V)
        table, x_t = self.lm_head.T, xp.ascontiguousarray(x.T)            # (V, D), (D, R)
        logits_t = xp.empty((table.shape[0], x.shape[0]), dtype=x.dtype)   # (V, R)
        for start in range(0, table.shape[0], VOCAB_CHUNK):
            stop = start + VOCAB_CHUNK
            xp.matmul(table[start:stop], x_t, out=logits_t[start:stop])
        return xp.ascontiguousarray(logits_t.T)                            # (R, V)

    def _check_inputs(self, token_ids, positions):
        """Both as (B, T) int64 arrays on the model's device, or one InputError naming what is wrong.

        Host inputs (lists, NumPy) are checked on the host, where min/max are cheap, then uploaded once. Arrays
        already on the GPU get the shape and dtype checks only: their range check would read them back to the host
        (a synchronisation per step), so in-range ids are the caller's contract there.
        """
        xp = self.xp
        checked = []
        for name, values, limit, what in (("token_ids", token_ids, self.config.vocab_size, "the vocabulary"),
                                          ("positions", positions, self.config.context_length,
                                           "the context window")):
            on_device = xp is not np and isinstance(values, xp.ndarray)
            try:
                array = values if on_device else np.asarray(values)
            except ValueError:                                   # ragged nested lists
                raise InputError(f"{name} must be a rectangular (B, T) array of integers") from None
            if array.ndim != 2 or array.size == 0:
                raise InputError(f"{name} must have shape (B, T) with at least one token; got {tuple(array.shape)}")
            if array.dtype.kind not in "iu":
                raise InputError(f"{name} must be integers, got dtype {array.dtype}")
            if not on_device:
                low, high = int(array.min()), int(array.max())
                if low < 0 or high >= limit:
                    raise InputError(f"{name[:-1].replace('_id', ' id')} {low if low < 0 else high} is outside "
                                     f"{what} [0, {limit})")
                if name == "positions":
                    self.rope.reserve(high + 1)
            checked.append(xp.asarray(array.astype(INDEX_DTYPE, copy=False)))
        if checked[0].shape != checked[1].shape:
            raise InputError(f"token_ids {tuple(checked[0].shape)} and positions {tuple(checked[1].shape)} must "
                             "have the same shape (B, T)")
        return checked

    # ------------------------------------------------------------------ sizes, for lessons and the memory estimator

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as stored (the tied lm_head is a view and is not counted twice)."""
        arrays = [self.embedding, self.final_norm] + [getattr(layer, f.name) for layer in self.layers
                                                      for f in fields(LayerWeights)]
        if not self.config.tied_embeddings:
            arrays.append(self.lm_head)
        return sum(int(a.nbytes) for a in arrays)


# ---------------------------------------------------------------------------------------------------- loading

def load_model(path: str | Path | None = None, device: str = "cpu", attention: str = "auto",
               dtype: str = "float32") -> Transformer:
    """Load a llama-architecture GGUF (the default SmolLM2-135M-Instruct when `path` is None, fetched on first
    use) onto `device` ("cpu" or "gpu"): every tensor dequantized once to float32.

    attention: "arrays" (layers.attention), "kernels" (flash_prefill / paged_decode, also on the CPU runner) or
    "auto" (kernels on the GPU, arrays on the CPU); see attention_backend.py.
    dtype: "float32" (the default: exact comparison with the CPU and HF) or "float16": float16 storage of every
    matrix, embedding included, with float32 accumulation = this float32 load, then quantize.quantize_model(model,
    "f16", embedding="f16") (half the weight bytes; norms, activations, KV cache and logits stay float32).
    "bfloat16" is refused (check_dtype says why).
    """
    from .tokenizer import Tokenizer

    check_dtype(dtype)
    start = time.perf_counter()
    xp = get_xp(device)
    path = resolve_model_path(path)
    reader = open_gguf(path)
    config = ModelConfig.from_gguf(reader)
    tokenizer = Tokenizer.from_gguf(reader)
    tensors = {t.name: t for t in reader.tensors}

    def load(name: str, shape: tuple, transpose: bool = False):
        """Dequantize one tensor, check its shape, lay it out as (in, out) if asked, move it to the device."""
        if name not in tensors:
            raise ModelFileError(f"{path}: tensor {name} is missing; not a complete llama-architecture model")
        array = dequantize(tensors[name])                      # (out, in) for matrices
        if transpose:
            array = np.ascontiguousarray(array.T)              # (in, out); the (out, in) copy is dropped here
        if array.shape != shape:
            raise ModelFileError(f"{path}: tensor {name} has shape {array.shape}, expected {shape} from the "
                                 "metadata")
        return xp.asarray(array, dtype=DTYPE)

    D, F, V = config.d_model, config.ffn_dim, config.vocab_size
    layers = []
    for i in range(config.n_layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=load(p + "attn_norm.weight", (D,)),
            w_qkv=xp.concatenate([load(p + "attn_q.weight", (D, config.q_dim), transpose=True),
                                  load(p + "attn_k.weight", (D, config.kv_dim), transpose=True),
                                  load(p + "attn_v.weight", (D, config.kv_dim), transpose=True)], axis=1),
            wo=load(p + "attn_output.weight", (config.q_dim, D), transpose=True),
            ffn_norm=load(p + "ffn_norm.weight", (D,)),
            w_gate_up=xp.concatenate([load(p + "ffn_gate.weight", (D, F), transpose=True),
                                      load(p + "ffn_up.weight", (D, F), transpose=True)], axis=1),
            w_down=load(p + "ffn_down.weight", (F, D), transpose=True),
        ))
    embedding = load("token_embd.weight", (V, D))
    lm_head = embedding.T if config.tied_embeddings else load("output.weight", (D, V), transpose=True)
    final_norm = load("output_norm.weight", (D,))
    model = Transformer(config, tokenizer, embedding, layers, final_norm, lm_head, xp, device, Path(path),
                        load_seconds=time.perf_counter() - start, attention_mode=attention)
    if dtype == "float16":
        from .quantize import quantize_model      # here, not at the top: quantize/ imports this module
        model = quantize_model(model, "f16", embedding="f16")
        model.load_seconds = time.perf_counter() - start
    return model


def check_dtype(dtype: str) -> None:
    """float32 and float16 (storage; float32 accumulation) are implemented; say why for the others instead of
    silently computing in float32."""
    if dtype in ("float32", "float16"):
        return
    if dtype == "bfloat16":
        raise InputError("dtype bfloat16 is not available: NumPy has no bfloat16 type, so the CPU could not check "
                         "the GPU's arithmetic; use float16 or float32")
    raise InputError(f"unknown dtype {dtype!r}; choose float32 or float16")
