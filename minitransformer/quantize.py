"""Quantization: int8 / int4 weights and an int8 KV cache, the levers that cut memory and bandwidth (lesson 13).

Decode reads every weight once per token (decode.py), so its speed is about bytes / bandwidth: fewer bytes per weight
is a direct lever, paid for in quality, which quality.py measures. Our own formats, both kept in the (out, in) layout
of GGUF (one row per output channel), so a row block is a block of output channels and holds whole groups:

- int8, symmetric per output channel: scale[o] = max_i |w[o, i]| / 127, q = round(w / scale) in [-127, 127].
  1 byte per weight + one float32 scale per row. Error per element <= scale[o] / 2.
- int4, groups of 32 inputs with a scale and a minimum (the idea of llama.cpp's Q4_1): scale = (max - min) / 15,
  q = round((w - min) / scale) in [0, 15], w ~ q * scale + min. Two values per byte, packed our own way: byte k of a
  row holds value 2k in its low nibble and 2k + 1 in its high nibble (ggml's Q4_1 pairs j with j + 16 instead:
  lesson 13 part 1 unpacks one of its blocks by hand). scale and min are float16, rounded so that every w of the
  group still lies in [min, min + 15 * scale]: 4 + 32 / 32 = 5 bits per weight. Error per element <= scale / 2.

`QuantizedLinear` stands where a float (in, out) matrix stood in `x @ w` and dequantizes on the fly, a block of output
rows at a time (bounded extra memory: one float32 block of at most `block_bytes`), or, for decode-sized inputs, through
the CUDA dequantize-GEMV kernel (kernels/dequant_gemv.cu) when `use_kernel` is set. `quantize_model` builds a
Transformer from these without touching model.py. `Int8KVCache` is KVCache with int8 storage and one float32 scale per
(token, head); its `quantize_kv` / `dequantize_kv` work on any array whose last axis is head_dim, so a paged pool can
reuse them.

All float math in float32 with Python-float constants (DESIGN.md "float32 pitfall").
"""

from __future__ import annotations

import numpy as np

from .backend import DTYPE, array_module
from .config import ModelConfig
from .errors import InputError
from .kv_cache import KVCache
from .serving.paged_cache import PagedKVCache, reserve

SCHEMES = ("f32", "int8", "int4")
GROUP = 32                      # int4: inputs per group (one scale and one minimum each)
INT8_MAX = 127                  # symmetric: -127..127, so -w quantizes to -q (no lone -128)
INT4_LEVELS = 15                # 0..15
DEFAULT_BLOCK_BYTES = 1 << 20   # the float32 block dequantized at a time by the NumPy path (1 MiB)
KERNEL_MAX_ROWS = 8             # decode-sized inputs (<= 8 rows) go to the GEMV kernel (use_kernel) or int4's
                                # group dot products; a prompt's many rows are a matrix-matrix product, which
                                # dequantized blocks serve better


# ------------------------------------------------------------------------------------------------- int8 weights

def quantize_int8(w):
    """w (out, in) float32 -> q (out, in) int8, scale (out,) float32, with w[o] ~ q[o] * scale[o]."""
    xp = array_module(w)
    w = w.astype(DTYPE, copy=False)
    scale = xp.abs(w).max(axis=1) / float(INT8_MAX)                         # (out,)
    scale = xp.where(scale > 0, scale, 1.0).astype(DTYPE)                   # an all-zero row: any scale works
    q = xp.clip(xp.rint(w / scale[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_int8(q, scale):
    """q (out, in) int8, scale (out,) -> (out, in) float32."""
    return q.astype(DTYPE) * scale[:, None]


# ------------------------------------------------------------------------------------------------- int4 weights

def _float16_down(x):
    """The largest float16 <= x (x float32): the rounded minimum must not rise above the group's smallest value."""
    xp = array_module(x)
    h = x.astype(np.float16)
    return xp.where(h.astype(DTYPE) > x, xp.nextafter(h, np.float16(-np.inf)), h)


def _float16_up(x):
    """The smallest float16 >= x: the rounded scale must still reach the group's largest value."""
    xp = array_module(x)
    h = x.astype(np.float16)
    return xp.where(h.astype(DTYPE) < x, xp.nextafter(h, np.float16(np.inf)), h)


def quantize_int4(w):
    """w (out, in) float32, in a multiple of 32 -> packed (out, in/2) uint8, scale and minimum (out, in/32) float16.

    Value i of row o is q = round((w - min) / scale) in [0, 15]; byte k holds q[2k] (low nibble) and q[2k+1] (high).
    """
    xp = array_module(w)
    rows, cols = w.shape
    if cols % GROUP:
        raise InputError(f"int4 needs the input size to be a multiple of {GROUP} (the group size); got {cols}")
    groups = w.astype(DTYPE, copy=False).reshape(rows, cols // GROUP, GROUP)        # (out, in/32, 32)
    low = _float16_down(groups.min(axis=2))                                          # (out, in/32) float16
    span = groups.max(axis=2) - low.astype(DTYPE)
    scale = _float16_up(span / float(INT4_LEVELS))
    scale = xp.where(scale > 0, scale, np.float16(1.0)).astype(np.float16)           # a constant group
    levels = xp.rint((groups - low.astype(DTYPE)[..., None]) / scale.astype(DTYPE)[..., None])
    q = xp.clip(levels, 0, INT4_LEVELS).astype(np.uint8).reshape(rows, cols)        # (out, in)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)                                          # (out, in/2)
    return packed.astype(np.uint8), scale, low


def unpack_int4(packed):
    """packed (out, in/2) uint8 -> the 4-bit levels (out, in) uint8."""
    xp = array_module(packed)
    q = xp.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2] = packed & 0x0F
    q[:, 1::2] = packed >> 4
    return q


# Byte b -> its two levels as float32 (low nibble, high nibble): one table lookup unpacks and converts a byte
# (measured here: ~25% faster than masking, shifting and converting in three passes).
_NIBBLES = np.stack([np.arange(256) & 0x0F, np.arange(256) >> 4], axis=-1).astype(DTYPE)     # (256, 2)


def dequantize_int4(packed, scale, low):
    """packed (out, in/2), scale and min (out, in/32) float16 -> (out, in) float32."""
    xp = array_module(packed)
    rows = packed.shape[0]
    table = _NIBBLES if xp is np else xp.asarray(_NIBBLES)
    q = xp.take(table, packed, axis=0).reshape(rows, -1, GROUP)                     # (out, in/32, 32) levels
    q *= scale.astype(DTYPE)[..., None]
    q += low.astype(DTYPE)[..., None]
    return q.reshape(rows, -1)


# ----------------------------------------------------------------------------------------- the quantized matrix

def quantized_bytes(out_features: int, in_features: int, scheme: str) -> int:
    """Bytes a quantized (out, in) matrix takes: the computed memory that `QuantizedLinear.nbytes` must equal."""
    if scheme == "int8":
        return out_features * in_features + 4 * out_features                   # int8 values + float32 scales
    if scheme == "int4":
        return out_features * in_features // 2 + 2 * 2 * out_features * (in_features // GROUP)
    if scheme == "f32":
        return 4 * out_features * in_features
    raise InputError(f"unknown weight scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


class QuantizedLinear:
    """A weight matrix used as `x @ w` (w logically (in, out)), stored quantized as (out, in) rows.

    `x @ w` on a NumPy/CuPy array comes here: `__array_ufunc__ = None` makes the array's own `@` give up and Python
    calls our `__rmatmul__`. Indexing `w[ids]` returns dequantized rows (out, in) -> (len(ids), in): for a tied
    embedding, the embedding table *is* the lm_head's (out = vocab, in = d_model) rows, stored once.
    """

    __array_ufunc__ = None

    def __init__(self, scheme: str, data: tuple, shape_out_in: tuple[int, int], block_bytes: int = DEFAULT_BLOCK_BYTES,
                 use_kernel: bool = False):
        self.scheme = scheme
        self.data = data                      # int8: (q, scale); int4: (packed, scale, min)
        self.out_features, self.in_features = shape_out_in
        self.block_bytes = block_bytes
        self.use_kernel = use_kernel

    @classmethod
    def from_float(cls, w_out_in, scheme: str, **options) -> "QuantizedLinear":
        """Quantize a float (out, in) matrix (GGUF's layout; pass `w.T` for model.py's (in, out) matrices)."""
        w_out_in = array_module(w_out_in).ascontiguousarray(w_out_in)   # rows contiguous: row blocks are slices
        if scheme == "int8":
            data = quantize_int8(w_out_in)
        elif scheme == "int4":
            data = quantize_int4(w_out_in)
        else:
            raise InputError(f"QuantizedLinear takes 'int8' or 'int4', got {scheme!r}")
        return cls(scheme, data, tuple(w_out_in.shape), **options)

    @property
    def shape(self) -> tuple[int, int]:
        """The logical (in, out) shape, as the float matrix it replaces."""
        return (self.in_features, self.out_features)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.data)

    def dequantize_rows(self, start: int = 0, stop: int | None = None):
        """Output rows [start, stop) as float32 (rows, in)."""
        parts = tuple(a[start:stop] for a in self.data)
        return dequantize_int8(*parts) if self.scheme == "int8" else dequantize_int4(*parts)

    def dequantize(self):
        """The whole matrix as float32 (out, in): for tests and quality checks, not for the forward pass."""
        return self.dequantize_rows()

    def __getitem__(self, ids):
        """Dequantized rows for integer ids (N,) -> (N, in): the embedding lookup."""
        parts = tuple(a[ids] for a in self.data)
        return dequantize_int8(*parts) if self.scheme == "int8" else dequantize_int4(*parts)

    def __rmatmul__(self, x):
        """x (N, in) float32 -> x @ W (N, out), W the quantized matrix, one block of output rows at a time."""
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise InputError(f"x @ w needs x of shape (N, {self.in_features}), got {tuple(x.shape)}")
        if self.use_kernel and x.shape[0] <= KERNEL_MAX_ROWS:
            from .kernels.quant import dequant_gemv
            return dequant_gemv(x, self)
        return self._matmul_int8(x) if self.scheme == "int8" else self._matmul_int4(x)

    def _blocks(self, bytes_per_row: int):
        """[start, stop) ranges of output rows whose temporaries take at most block_bytes."""
        rows = max(1, self.block_bytes // bytes_per_row)
        return [(a, min(a + rows, self.out_features)) for a in range(0, self.out_features, rows)]

    def _matmul_int8(self, x):
        """One scale per output row commutes with the dot product: (x @ q.T) * scale, so only a float32 copy of the
        int8 block is made (measured: ~2.5x faster decode than dequantizing q * scale first)."""
        xp = array_module(x)
        q, scale = self.data
        out = xp.empty((x.shape[0], self.out_features), dtype=DTYPE)                   # (N, out)
        for a, b in self._blocks(4 * self.in_features):
            out[:, a:b] = (x @ q[a:b].astype(DTYPE).T) * scale[a:b]                     # (N, rows)
        return out

    def _matmul_int4(self, x):
        """Per group g of 32 inputs, x_g . w_g = scale * (x_g . q_g) + min * sum(x_g): the levels q are multiplied
        as they are and scale and min applied once per group (llama.cpp's Q4_1 dot product does the same), never
        dequantizing the weights. Byte k holds values 2k and 2k+1, so x's even columns meet the low nibbles and its
        odd columns the high ones: no interleaving either. Measured on one 3072 x 576 matrix: 2.4x faster than
        dequantize-then-multiply for 1 row, but 2.7x slower for 256 rows, where the 16-long dot products starve the
        BLAS and one big matmul amortizes the dequantization: so prompts (more than KERNEL_MAX_ROWS rows) take that."""
        xp = array_module(x)
        N, G = x.shape[0], self.in_features // GROUP
        if N > KERNEL_MAX_ROWS:
            out = xp.empty((N, self.out_features), dtype=DTYPE)                         # (N, out)
            for a, b in self._blocks(4 * self.in_features):
                out[:, a:b] = x @ self.dequantize_rows(a, b).T                          # (N, rows)
            return out
        packed, scale, low = self.data
        x_even = x[:, 0::2].reshape(N, G, GROUP // 2).transpose(1, 0, 2)               # (G, N, 16)
        x_odd = x[:, 1::2].reshape(N, G, GROUP // 2).transpose(1, 0, 2)                # (G, N, 16)
        x_sums = x.reshape(N, G, GROUP).sum(axis=2)                                     # (N, G)
        out = xp.empty((N, self.out_features), dtype=DTYPE)                             # (N, out)
        for a, b in self._blocks(4 * (self.in_features + G * N)):                       # levels + dots per row
            block = packed[a:b].reshape(b - a, G, GROUP // 2)                           # (rows, G, 16) bytes
            lo = (block & 0x0F).astype(DTYPE).transpose(1, 2, 0)                        # (G, 16, rows)
            hi = (block >> 4).astype(DTYPE).transpose(1, 2, 0)                          # (G, 16, rows)
            dots = x_even @ lo + x_odd @ hi                                             # (G, N, rows): x_g . q_g
            out[:, a:b] = ((dots * scale[a:b].T.astype(DTYPE)[:, None, :]).sum(axis=0)
                           + x_sums @ low[a:b].T.astype(DTYPE))                         # (N, rows)
        return out


# ------------------------------------------------------------------------------------------- a quantized model

def quantize_model(model, weights: str = "int8", embedding: str | None = "int8", use_kernel: bool = False,
                   block_bytes: int = DEFAULT_BLOCK_BYTES):
    """A new Transformer whose matrices are `weights` ("int8" | "int4"; "f32" returns `model` itself).

    Every layer matrix (q|k|v, o, gate|up, down) is quantized per output channel / per group. The tied embedding and
    lm_head are one (vocab, d_model) QuantizedLinear in `embedding` format (default "int8", as llama.cpp keeps
    token_embd at 8 bits in its 4-bit files; None = same as `weights`): `embedding[ids]` dequantizes the looked-up
    rows, `h @ lm_head` multiplies by it. Norms stay float32 and are shared with `model`, as are the tokenizer,
    config and RoPE tables. An untied lm_head is quantized on its own.
    """
    from .model import LayerWeights, Transformer

    if weights == "f32":
        return model
    if weights not in SCHEMES or (embedding is not None and embedding not in SCHEMES):
        raise InputError(f"unknown weight scheme {weights!r} / {embedding!r}; choose one of {', '.join(SCHEMES)}")
    options = dict(use_kernel=use_kernel, block_bytes=block_bytes)

    def q(w_in_out, scheme=weights):
        return QuantizedLinear.from_float(w_in_out.T, scheme, **options)                # stored as (out, in)

    layers = [LayerWeights(attn_norm=layer.attn_norm, w_qkv=q(layer.w_qkv), wo=q(layer.wo),
                           ffn_norm=layer.ffn_norm, w_gate_up=q(layer.w_gate_up), w_down=q(layer.w_down))
              for layer in model.layers]
    emb_scheme = embedding or weights
    if emb_scheme == "f32":
        table, lm_head = model.embedding, model.lm_head
    else:
        table = QuantizedLinear.from_float(model.embedding, emb_scheme, **options)      # (V, D): rows are tokens
        lm_head = table if model.config.tied_embeddings else q(model.lm_head, emb_scheme)
    quantized = Transformer(model.config, model.tokenizer, table, layers, model.final_norm, lm_head, model.xp,
                            model.device, model.path, load_seconds=model.load_seconds)
    quantized.weight_scheme = weights
    return quantized


def set_use_kernel(model, use_kernel: bool) -> None:
    """Route every QuantizedLinear of a quantized model through the CUDA kernel (True) or the NumPy path."""
    for w in [model.embedding, model.lm_head] + [getattr(layer, name) for layer in model.layers
                                                 for name in ("w_qkv", "wo", "w_gate_up", "w_down")]:
        if isinstance(w, QuantizedLinear):
            w.use_kernel = use_kernel


def expected_weight_bytes(config: ModelConfig, weights: str, embedding: str | None = "int8") -> int:
    """The weight bytes `quantize_model(model, weights, embedding).weight_bytes` must report, from the config."""
    D, F, V = config.d_model, config.ffn_dim, config.vocab_size
    qkv_out = config.q_dim + 2 * config.kv_dim
    per_layer = (quantized_bytes(qkv_out, D, weights) + quantized_bytes(D, config.q_dim, weights)
                 + quantized_bytes(2 * F, D, weights) + quantized_bytes(D, F, weights) + 2 * 4 * D)   # + 2 norms
    emb = (embedding or weights) if weights != "f32" else "f32"
    head = 0 if config.tied_embeddings else quantized_bytes(V, D, emb)
    return config.n_layers * per_layer + quantized_bytes(V, D, emb) + head + 4 * D                  # + final norm


# ----------------------------------------------------------------------------------------------- int8 KV cache

def quantize_kv(x):
    """x (..., d) float32 -> q (..., d) int8, scale (...,) float32: one symmetric scale per vector (token, head)."""
    xp = array_module(x)
    scale = xp.abs(x).max(axis=-1) / float(INT8_MAX)                                # (...,)
    scale = xp.where(scale > 0, scale, 1.0).astype(DTYPE)
    q = xp.clip(xp.rint(x / scale[..., None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_kv(q, scale):
    """q (..., d) int8, scale (...,) -> (..., d) float32."""
    return q.astype(DTYPE) * scale[..., None]


def estimate_int8_kv_bytes(config: ModelConfig, tokens: int, batch: int = 1) -> int:
    """Bytes of an int8 KV cache: 2 x layers x batch x kv_heads x tokens x (head_dim int8 + one float32 scale)."""
    return 2 * config.n_layers * batch * config.n_kv_heads * tokens * (config.head_dim + 4)


class Int8KVCache(KVCache):
    """KVCache's constructor and `update` protocol, storing int8 keys/values with one float32 scale per (token, head).

    `update` quantizes the new keys/values, stores them and returns the dequantized prefix (B, K, S, d) float32, so
    attention sees exactly what is stored (the new token's own key too). For head_dim 64 a token-head costs 68 bytes
    instead of 256: 3.8x less cache. A paged pool stores the same (int8 values, scale) pairs per block slot and calls
    the same quantize_kv / dequantize_kv.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1, xp=np, dtype=DTYPE):
        if not 1 <= max_len <= config.context_length:
            raise InputError(f"KV cache length must be in [1, {config.context_length}] (the context window), "
                             f"got {max_len}")
        self.config, self.max_len, self.batch, self.xp = config, max_len, batch, xp
        self.dtype = np.dtype(np.int8)
        shape = (config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim)
        self.k = xp.zeros(shape, dtype=np.int8)                 # (layers, batch, kv_heads, max_len, head_dim)
        self.v = xp.zeros(shape, dtype=np.int8)
        self.k_scale = xp.ones(shape[:-1], dtype=DTYPE)         # (layers, batch, kv_heads, max_len)
        self.v_scale = xp.ones(shape[:-1], dtype=DTYPE)
        self.length = 0
        self.key_positions = xp.broadcast_to(xp.arange(max_len), (batch, max_len))   # (batch, max_len)

    def update(self, layer: int, k_new, v_new, positions):
        """k_new, v_new (B, K, T, d) float32 -> dequantized k, v (B, K, length + T, d), positions (B, length + T)."""
        if self.k is None:
            raise InputError("this KV cache was released; allocate a new one")
        T = k_new.shape[2]
        start, end = self.length, self.length + T
        if end > self.max_len:
            raise InputError(f"KV cache is full: {start} tokens stored + {T} new > {self.max_len} reserved")
        self.k[layer, :, :, start:end], self.k_scale[layer, :, :, start:end] = quantize_kv(k_new)
        self.v[layer, :, :, start:end], self.v_scale[layer, :, :, start:end] = quantize_kv(v_new)
        if layer == self.config.n_layers - 1:
            self.length = end
        k = dequantize_kv(self.k[layer, :, :, :end], self.k_scale[layer, :, :, :end])     # (B, K, end, d)
        v = dequantize_kv(self.v[layer, :, :, :end], self.v_scale[layer, :, :, :end])
        return k, v, self.key_positions[:, :end]

    @property
    def bytes_used(self) -> int:
        return estimate_int8_kv_bytes(self.config, self.length, self.batch)

    @property
    def bytes_reserved(self) -> int:
        if self.k is None:
            return 0
        return int(self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes)

    def release(self) -> None:
        self.k = self.v = self.k_scale = self.v_scale = None


KV_CACHES = {"f32": KVCache, "int8": Int8KVCache}


class Int8PagedKVCache(PagedKVCache):
    """The serving engine's paged pools (serving/paged_cache.py) storing int8 values and one float32 scale per
    (slot, head): the same quantize_kv / dequantize_kv as Int8KVCache, so a token's keys are stored identically in
    both, and a block costs (head_dim + 4) / (4 * head_dim) of a float32 block (68 / 256 bytes per head at d = 64).

        k, v (layers, num_blocks, block_size, kv_heads, head_dim) int8; k_scale, v_scale (..., kv_heads) float32
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, xp=np, dtype=DTYPE):
        self.config, self.num_blocks, self.block_size, self.xp = config, num_blocks, block_size, xp
        self.dtype = np.dtype(np.int8)
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.k = reserve(shape, np.int8, xp)
        self.v = reserve(shape, np.int8, xp)
        self.k_scale = reserve(shape[:-1], DTYPE, xp)          # zeros: never-written slots read back as 0.0
        self.v_scale = reserve(shape[:-1], DTYPE, xp)

    @property
    def bytes_total(self) -> int:
        return int(self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes)

    @property
    def bytes_per_block(self) -> int:
        return estimate_int8_kv_bytes(self.config, self.block_size)

    def write(self, layer: int, slots, k_new, v_new) -> None:
        """Quantize and store keys/values of N tokens.   slots (N,) int; k_new, v_new (K, N, d) float32."""
        K, d = self.config.n_kv_heads, self.config.head_dim
        for pool, scales, new in ((self.k, self.k_scale, k_new), (self.v, self.v_scale, v_new)):
            q, scale = quantize_kv(new.transpose(1, 0, 2))                  # (N, K, d) int8, (N, K)
            pool[layer].reshape(-1, K, d)[slots] = q
            scales[layer].reshape(-1, K)[slots] = scale

    def gather(self, layer: int, block_tables):
        """block_tables (R, nb) -> dequantized k, v (R, K, nb * block_size, d) float32, key j at position j."""
        R, nb = block_tables.shape
        S, K, d = nb * self.block_size, self.config.n_kv_heads, self.config.head_dim
        k = dequantize_kv(self.k[layer][block_tables], self.k_scale[layer][block_tables])    # (R, nb, B, K, d)
        v = dequantize_kv(self.v[layer][block_tables], self.v_scale[layer][block_tables])
        return k.reshape(R, S, K, d).transpose(0, 2, 1, 3), v.reshape(R, S, K, d).transpose(0, 2, 1, 3)
