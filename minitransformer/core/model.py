"""The decoder-only transformer (llama architecture): its weights and its one forward pass (loading.py loads it).
Gemma 3, Qwen2, Qwen3 and Llama 3 run through the same pass; what each adds is an option read from its file
(config.py: q/k norms, sandwich norms, a q|k|v bias, RoPE frequency factors, ...).

    token ids -> embedding -> n_layers x [RMSNorm -> attention (RoPE, GQA, causal) -> + residual
                                          RMSNorm -> SwiGLU feed-forward         -> + residual]
              -> RMSNorm -> lm_head (the embedding seen transposed when tied, else output.weight) -> logits

Every activation is float32 and every matmul is 2-D: `(B, T, D) @ (D, O)` would make NumPy loop over the batch rows,
one small matmul each, far slower than one 2-D matmul, so hidden states live as (B*T, D) and are viewed as heads only
inside attention.
Weights are dequantized once at load time (loading.py) and stored once, in the (in, out) layout that `x @ w` wants.
LAYER_WEIGHTS below is the one description of a layer's weights (GGUF tensors, shapes); loading, quantization,
the cost model, the figures and the scripts iterate it rather than naming the weights again.

One forward pass serves every caller: a whole prompt, a decode step, the serving engine's flat batch of many
sequences' tokens laid end to end (B = 1), a CUDA-graph replay, and the self-drafter's first layers (`layers=L`).
What differs between them is only where keys and values are kept, so the cache is passed in and never owned here.
A cache is any object with

    attend(layer, q, k, v, positions, attention) -> out   store this call's keys/values of `layer`, attend each query
                                                          to its own sequence's keys; q (B, H, T, d), k and v
                                                          (B, K, T, d), out (B, H, T, d)
    advance(T)                                            after the pass: the T tokens are stored

(attention.ForwardCache: kv_cache.KVCache, and serving/paged_cache.PagedStep for the engine's pool).
`attention` is the model's one choice of arrays or kernels (attention.AttentionBackend), made at load.
With no cache the T tokens attend to each other.

Split over several processes (tensor parallelism, parallel/plan.py; lesson 15), each rank runs this same forward
on its share of the heads and FFN columns, and `comm.all_reduce` after each layer's two blocks sums the ranks'
partial outputs: the only two lines here that know other ranks exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .attention import ArrayAttention, AttentionBackend, ForwardCache, SlidingWindowAttention
from .backend import INDEX_DTYPE
from .config import ModelConfig
from .errors import InputError
from .layers import ACTIVATION, apply_rope, rms_norm, swiglu
from .rope import RopeTable


class AllReduce(Protocol):
    """What the forward asks of tensor parallelism (parallel/communicator.py's communicators are ones): sum an array
    over every process, in place, so each holds the whole sum."""

    def all_reduce(self, array: Any) -> Any: ...


@dataclass(frozen=True)
class LayerWeight:
    """One weight of a decoder layer: the LayerWeights field it is stored in, the GGUF tensors it is made of, and
    its shape, in ModelConfig's sizes.

    Why a table: loading reads these tensors, quantization replaces the matrices, the cost model multiplies by them,
    the figure draws them and the profile script sums them. Written once here, a new architecture's layer (or a
    bias) is one edit, and none of those places can disagree with the model about a shape.
    """
    field: str                      # the LayerWeights attribute: "w_qkv"
    label: str                      # its short name in cost tables and figures: "qkv"
    tensors: tuple[str, ...]        # GGUF tensors "blk.{i}.<name>.weight", side by side as columns in this order
    columns: tuple[str, ...]        # ModelConfig size of each tensor's outputs (for a vector: its length)
    rows: str | None = None         # ModelConfig size of the inputs, None for a vector (a norm's scale)
    when: str | None = None         # a ModelConfig flag: the weight exists only where it is set (Gemma 3's norms)
    kind: str = "weight"            # the GGUF suffix: "weight", or "bias" (Qwen2's q|k|v biases: blk.{i}.attn_q.bias)
    split: str | None = None        # tensor parallelism (parallel/plan.py): "column" = each rank holds some outputs
                                    # (whole heads, FFN columns), "row" = some inputs, giving a partial sum that an
                                    # all-reduce completes; None = every rank holds all of it

    @property
    def is_matrix(self) -> bool:
        return self.rows is not None

    def tensor_shapes(self, config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
        """(GGUF tensor suffix, its shape in model.py's layout: (in, out) for a matrix, (n,) for a vector)."""
        sizes = [getattr(config, c) for c in self.columns]
        if self.rows is None:                               # a vector (is_matrix is false)
            return [(t, (n,)) for t, n in zip(self.tensors, sizes)]
        return [(t, (getattr(config, self.rows), n)) for t, n in zip(self.tensors, sizes)]

    def shape(self, config: ModelConfig) -> tuple[int, ...]:
        """The stored shape: the parts' columns side by side, (in, sum of outs) for a matrix, (n,) for a vector."""
        shapes = [shape for _, shape in self.tensor_shapes(config)]
        return (*shapes[0][:-1], sum(shape[-1] for shape in shapes))

    def present(self, config: ModelConfig) -> bool:
        """Whether a model of `config` has this weight (always, unless `when` names a flag that is off)."""
        return self.when is None or bool(getattr(config, self.when))

    def gguf_names(self, layer: int) -> list[str]:
        return [f"blk.{layer}.{t}.{self.kind}" for t in self.tensors]

    def has_bias(self, config: ModelConfig) -> bool:
        """True when the file gives any of this weight's tensors a bias (ModelConfig.bias_tensors); a bias entry
        (kind "bias", Qwen2's b_qkv) is itself the bias, and has none."""
        return self.kind == "weight" and any(t in config.bias_tensors for t in self.tensors)


def weight(label: str, tensors: tuple[str, ...], columns: tuple[str, ...], rows: str | None = None,
           when: str | None = None, kind: str = "weight", split: str | None = None, optional: bool = False):
    """A LayerWeights field described by its LayerWeight (the field's name is the LayerWeight's `field`); optional:
    a weight only some families have, None where absent."""
    meta = {"weight": dict(label=label, tensors=tensors, columns=columns, rows=rows, when=when, kind=kind,
                           split=split)}
    return field(default=None, metadata=meta) if optional else field(metadata=meta)


@dataclass
class LayerWeights:
    """One decoder layer's weights, each in the layout its matmul wants, and each field described (`weight`):
    LAYER_WEIGHTS below is read off these fields, so the list of a layer's weights is written once, here.

    One llama decoder layer, in forward order, then what other families add: the q/k norms of Gemma 3 and Qwen3
    (config.qk_norm), Gemma 3's sandwich norms (config.sandwich_norms), Qwen2's q|k|v bias (config.qkv_bias).
    Q, K and V are one (D, H*d + 2*K*d) matrix and gate and up one (D, 2F) matrix: x @ w_qkv is one matmul where
    three would each pay a call and a pass over x, and at decode a matrix-vector product is limited by how fast its
    weights stream from memory, and a few large matrices stream faster than many small ones.
    The separate matrices are still there to read, as views (wq, wk, wv, w_gate, w_up), at no extra memory.
    """
    attn_norm: Any = weight("attn norm", ("attn_norm",), ("d_model",))                        # (D,)
    w_qkv: Any = weight("qkv", ("attn_q", "attn_k", "attn_v"), ("q_dim", "kv_dim", "kv_dim"), rows="d_model",
                        split="column")                             # (D, H*d + 2*K*d): columns [q | k | v]
    wo: Any = weight("wo", ("attn_output",), ("d_model",), rows="q_dim", split="row")         # (H*d, D)
    ffn_norm: Any = weight("ffn norm", ("ffn_norm",), ("d_model",))                           # (D,)
    w_gate_up: Any = weight("gate|up", ("ffn_gate", "ffn_up"), ("ffn_dim", "ffn_dim"), rows="d_model",
                            split="column")                         # (D, 2F): columns [gate | up]
    w_down: Any = weight("down", ("ffn_down",), ("d_model",), rows="ffn_dim", split="row")    # (F, D)
    # (d,) Gemma 3 and Qwen3: RMSNorm of each query head, and of each key head, before RoPE; None for llama
    attn_q_norm: Any = weight("q norm", ("attn_q_norm",), ("head_dim",), when="qk_norm", optional=True)
    attn_k_norm: Any = weight("k norm", ("attn_k_norm",), ("head_dim",), when="qk_norm", optional=True)
    # (D,) Gemma 3: RMSNorm of attention's output, and of the FFN's, before each residual add
    post_attention_norm: Any = weight("post-attn norm", ("post_attention_norm",), ("d_model",),
                                      when="sandwich_norms", optional=True)
    post_ffw_norm: Any = weight("post-ffn norm", ("post_ffw_norm",), ("d_model",), when="sandwich_norms",
                                optional=True)
    # (H*d + 2*K*d,) Qwen2: the bias x @ w_qkv adds, [q | k | v]; None for llama
    b_qkv: Any = weight("qkv bias", ("attn_q", "attn_k", "attn_v"), ("q_dim", "kv_dim", "kv_dim"), when="qkv_bias",
                        kind="bias", split="column", optional=True)

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


LAYER_WEIGHTS = tuple(LayerWeight(f.name, **f.metadata["weight"]) for f in fields(LayerWeights))
LAYER_MATRICES = tuple(w for w in LAYER_WEIGHTS if w.is_matrix)     # the four products every token goes through


def layer_weights(config: ModelConfig) -> tuple[LayerWeight, ...]:
    """The entries of LAYER_WEIGHTS a model of `config` has (llama: the first six; Gemma 3: ten; Qwen2: seven)."""
    return tuple(w for w in LAYER_WEIGHTS if w.present(config))


def layer_parameters(config: ModelConfig) -> int:
    """Numbers in one layer's weights (its four matrices and its norms), from the config alone."""
    return sum(math.prod(weight.shape(config)) for weight in layer_weights(config))


class Transformer:
    """A loaded model (loading.load_model builds one): config, tokenizer, weights on one device, and `forward`."""

    weight_scheme: str      # set only on a model quantize.quantize_model made: the scheme its layers are stored in

    def __init__(self, config: ModelConfig, tokenizer, embedding, layers: list[LayerWeights], final_norm,
                 lm_head, xp, device: str, path: Path | None = None, load_seconds: float = 0.0,
                 attention: AttentionBackend | None = None):
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
        self.attention = attention or ArrayAttention()   # arrays or kernels, chosen once (attention.py)
        self.rope = RopeTable(config, xp)       # cos and sin of the positions in use (rope.py)
        # Gemma 3's sliding layers: their own RoPE base and a windowed attention (None/unused for llama)
        self.rope_local = RopeTable(config, xp, config.rope_base_local) if config.sliding_layers else None
        self.window_attention = SlidingWindowAttention(config.sliding_window)
        self.ffn_activation = ACTIVATION[config.activation]     # SiLU (SwiGLU) or GELU-tanh (Gemma's GeGLU)
        # attention_probs scales q by 1/sqrt(d); a model whose scale differs (Gemma 3 27B) rescales q first
        self.query_rescale = config.attention_scale * math.sqrt(config.head_dim) if config.attention_scale else 1.0
        # With tensor parallelism (parallel/): this rank's collectives, and `config` holds only this rank's heads
        # and FFN columns. None on one process, where forward skips the all-reduces.
        self.comm: AllReduce | None = None

    @property
    def kernel_attention(self):
        """The KernelAttention when the kernels compute attention, else None."""
        return self.attention if self.attention.uses_kernels else None

    rope_cos = property(lambda self: self.rope.cos)     # (positions, d/2): row p rotates position p
    rope_sin = property(lambda self: self.rope.sin)     # (positions, d/2)

    # ------------------------------------------------------------------ the forward pass, in reading order

    def forward(self, token_ids, positions, cache: ForwardCache | None = None, layers: int | None = None,
                logits_rows=None, last_only: bool = False):
        """token_ids (B, T), positions (B, T) -> logits (B, T, V); with last_only (B, V) of each row's last token;
        with logits_rows (R,) only those rows of the B*T (row b*T + t), -> (R, V): the rows that will sample.

        cache: None, or an object with the protocol in the module docstring. layers: run only the first `layers`
        layers before the final norm and lm_head (the self-drafter's cut-short model, speculative/drafters.py).
        """
        token_ids, positions = self._check_inputs(token_ids, positions)
        B, T = token_ids.shape
        cfg = self.config
        h = self.embedding[token_ids.reshape(-1)]                          # (B*T, D)
        if cfg.embedding_scale != 1.0:
            h = h * cfg.embedding_scale                                    # Gemma: sqrt(d_model)
        angles = [(self.rope_cos[positions], self.rope_sin[positions])]   # (B, T, d/2) each; [1]: sliding layers'
        if self.rope_local is not None:
            local: Any = self.rope_local
            angles.append((local.cos[positions], local.sin[positions]))
        comm = self.comm        # tensor parallelism: each block's output is this rank's partial sum (parallel/plan.py)
        for index, layer in enumerate(self.layers[:layers]):
            cos, sin = angles[index in cfg.sliding_layers]
            out = self.attention_block(index, layer, rms_norm(h, layer.attn_norm, cfg.norm_eps),
                                       positions, cos, sin, cache)                 # (B*T, D)
            if comm is not None:
                comm.all_reduce(out)                       # sum over the ranks' heads: the whole block's output
            if layer.post_attention_norm is not None:                      # Gemma's sandwich norms
                out = rms_norm(out, layer.post_attention_norm, cfg.norm_eps)
            h = h + out
            out = swiglu(rms_norm(h, layer.ffn_norm, cfg.norm_eps), layer.w_gate_up, layer.w_down,
                         self.ffn_activation)
            if comm is not None:
                comm.all_reduce(out)                       # sum over the ranks' FFN columns
            if layer.post_ffw_norm is not None:
                out = rms_norm(out, layer.post_ffw_norm, cfg.norm_eps)
            h = h + out
        if cache is not None:
            cache.advance(T)
        if last_only:
            return self.output_logits(h.reshape(B, T, -1)[:, -1])         # (B, V): only the next token's logits
        if logits_rows is not None:
            return self.output_logits(h[logits_rows])                      # (R, V)
        return self.output_logits(h).reshape(B, T, -1)                     # (B, T, V)

    def attention_block(self, index: int, layer: LayerWeights, x, positions, cos, sin, cache: ForwardCache | None):
        """Self-attention of one layer.   x (B*T, D) normalized hidden states -> (B*T, D)."""
        B, T = positions.shape
        q, k, v = self.project_qkv(layer, x, B, T, cos, sin)   # (B, H, T, d), (B, K, T, d), (B, K, T, d)
        attention = self.window_attention if index in self.config.sliding_layers else self.attention
        if cache is None:
            out = attention.causal(q, k, v, positions, positions)                     # (B, H, T, d)
        else:
            out = cache.attend(index, q, k, v, positions, attention)                  # (B, H, T, d)
        return out.transpose(0, 2, 1, 3).reshape(B * T, self.config.q_dim) @ layer.wo  # (B*T, D)

    def project_qkv(self, layer: LayerWeights, x, B: int, T: int, cos, sin):
        """x (B*T, D) -> q (B, H, T, d), k (B, K, T, d) rotated by RoPE, and v (B, K, T, d)."""
        cfg = self.config
        H, K = cfg.n_heads, cfg.n_kv_heads
        qkv = x @ layer.w_qkv                                                       # (B*T, (H + 2K) * d)
        if layer.b_qkv is not None:                  # Qwen2: q, k and v each have a bias (before RoPE, as in HF)
            qkv = qkv + layer.b_qkv
        heads = qkv.reshape(B, T, H + 2 * K, cfg.head_dim).transpose(0, 2, 1, 3)   # (B, H + 2K, T, d)
        qk = heads[:, :H + K]                                                       # (B, H + K, T, d)
        if layer.attn_q_norm is not None:            # Gemma 3: every query and key head RMS-normalized before RoPE
            qk = self.xp.concatenate([rms_norm(qk[:, :H], layer.attn_q_norm, cfg.norm_eps),
                                      rms_norm(qk[:, H:], layer.attn_k_norm, cfg.norm_eps)], axis=1)
        qk = apply_rope(qk, cos, sin, self.rope.pairing)                 # (B, H + K, T, d): q and k in one call
        q = qk[:, :H] if self.query_rescale == 1.0 else qk[:, :H] * self.query_rescale
        return q, qk[:, H:], heads[:, H + K:]

    def reserve_positions(self, n: int) -> None:
        """RoPE tables for positions [0, n): the model's and, for Gemma 3, its sliding layers' own (rope.py refuses
        a table that cannot fit, before any work)."""
        for table in (self.rope, self.rope_local):
            if table is not None:
                table.reserve(n)

    def output_logits(self, h):
        """The final RMSNorm and lm_head: h (R, D) last hidden states -> logits (R, V), one score per token.

        One matmul whatever R is: with tied embeddings lm_head is the (V, D) embedding table seen transposed (a
        view), which BLAS reads as it is stored, so splitting the vocabulary into blocks only adds calls.
        """
        x = rms_norm(h, self.final_norm, self.config.norm_eps)            # (R, D)
        return x @ self.lm_head                                            # (R, V)

    def _check_inputs(self, token_ids, positions):
        """Both as (B, T) int64 arrays on the model's device, or one InputError naming what is wrong. Host inputs
        are range-checked on the host (min/max are cheap there), then uploaded once; arrays already on the GPU get the
        shape and dtype checks only, as reading them back would synchronise every step (in range is the caller's)."""
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
                    self.reserve_positions(high + 1)
            checked.append(xp.asarray(array.astype(INDEX_DTYPE, copy=False)))
        if checked[0].shape != checked[1].shape:
            raise InputError(f"token_ids {tuple(checked[0].shape)} and positions {tuple(checked[1].shape)} must "
                             "have the same shape (B, T)")
        return checked

    # ------------------------------------------------------------------ sizes, for lessons and the memory estimator

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as stored (the tied lm_head is a view and is not counted twice)."""
        arrays = [self.embedding, self.final_norm] + [getattr(layer, w.field) for layer in self.layers
                                                      for w in layer_weights(self.config)]
        if not self.config.tied_embeddings:
            arrays.append(self.lm_head)
        return sum(int(a.nbytes) for a in arrays)
