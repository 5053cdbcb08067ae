"""The matrix products of one decoder layer, each with its shape, FLOPs and bytes: the one cost model.

forward_cost (machine.py) gives one pass's totals by adding these up over the layers, plus the lm_head and the new
keys and values written; this lists the six products that make up a layer, as model.py and layers.py compute them,
so one can see *which* product is memory-bound and why. A prefill of T tokens multiplies each weight by T rows; a
decode step by one. The four weight products are model.LAYER_MATRICES, in its order; attention's two products read
the KV cache instead of weights, once per KV head for its G = H / K query heads (grouped-query attention:
layers.attention multiplies (G*T, d) by (d, S)).

    qkv       x (N, D) @ w_qkv (D, (H + 2K) d)     q, k and v in one product, columns [q | k | v] (model.py)
    q k^T     q (G T, d) @ k^T (d, S)               per KV head: the scores
    probs v   probs (G T, S) @ v (S, d)              per KV head: the attention output
    wo        out (N, H d) @ wo (H d, D)
    gate|up   x (N, D) @ w_gate_up (D, 2F)           SwiGLU's gate and up in one product (layers.swiglu)
    down      h (N, F) @ w_down (F, D)

FLOPs are 2 per multiply-add, with attention counting only the (query, key) pairs layers.causal_attention computes
(layers.causal_pairs). Bytes are each product's operands read and its result written once, weights included
(forward_cost leaves out two of them, q read by q k^T and the attention output written by probs v: its docstring
says why; tests/test_concept_diagrams.py checks the difference is exactly those). The figure
prefill_vs_decode_shapes.png draws these (viz_shapes.py); lesson 02_prefill_vs_decode measures the totals.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import ModelConfig
from ..core.kv_cache import kv_bytes_per_token
from ..core.layers import causal_pairs
from ..core.model import LAYER_MATRICES


@dataclass(frozen=True)
class Product:
    """One matrix product (A @ B = C), done `count` times per layer: A is (rows, inner), B (inner, cols)."""
    name: str
    rows: int
    inner: int
    cols: int
    count: int                # 1 for a weight product, K (one per KV head) for attention's
    b_is_weight: bool         # B is a weight matrix (read from the model) rather than the KV cache
    flops: int
    bytes: int                # every operand read and the result written, weights included
    weight_bytes: int         # of which the weight matrix B (0 when B is the KV cache)

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: below the machine's ridge point the product waits on memory."""
        return self.flops / self.bytes


def layer_products(config: ModelConfig, new_tokens: int, context_tokens: int = 0, batch: int = 1,
                   dtype_bytes: int = 4) -> list[Product]:
    """The six products of one layer for `new_tokens` tokens per sequence after `context_tokens` cached ones.

    Prefill of T tokens: layer_products(cfg, T); a decode step at context S: layer_products(cfg, 1, S).
    The shapes are one sequence's (batch 1 draws them); FLOPs and bytes cover the whole batch.
    """
    c, b = config, dtype_bytes
    H, K, d = c.n_heads, c.n_kv_heads, c.head_dim
    G, T, S = H // K, new_tokens, context_tokens + new_tokens
    N = batch * T                                            # rows through the weight products
    pairs = batch * causal_pairs(T, S)                       # (query, key) pairs per query head

    def weight_product(matrix):
        inner, cols = matrix.shape(c)                                          # (in, out), model.py's layout
        return Product(matrix.label, T, inner, cols, 1, True, 2 * N * inner * cols,
                       (inner * cols + N * inner + N * cols) * b,              # weights, input read, output written
                       inner * cols * b)

    kv_read = batch * S * kv_bytes_per_token(c, dtype=f"f{b}") // (2 * c.n_layers)   # K or V of this layer, S keys
    attention = [
        Product("q k^T", G * T, d, S, K, False, 2 * H * d * pairs,
                N * H * d * b + kv_read + H * pairs * b, 0),                  # q and k read, scores written
        Product("probs v", G * T, S, d, K, False, 2 * H * d * pairs,
                H * pairs * b + kv_read + N * H * d * b, 0),                  # scores and v read, output written
    ]
    products = []
    for matrix in LAYER_MATRICES:
        products.append(weight_product(matrix))
        if matrix.field == "w_qkv":                          # attention runs on q, k and v, before wo
            products += attention
    return products
