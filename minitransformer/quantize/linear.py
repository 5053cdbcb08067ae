"""QuantizedLinear, a quantized matrix standing where a float one stood in `x @ w`, and quantize_model, which builds a
quantized Transformer from them without touching model.py (lesson 13).

The matrix keeps the formats of schemes.py and multiplies a block of output rows at a time (bounded extra memory), or
hands decode-sized inputs to the CUDA dequantize-GEMV kernel when `use_kernel` is set. float16 storage ("f16") is one
product with float32 accumulation instead (schemes.matmul_float16): load_model(dtype="float16") is quantize_model(...,
"f16", embedding="f16"). quantized_bytes and expected_weight_bytes are the computed memory that the stored arrays
must match.
"""

from __future__ import annotations

import numpy as np

from ..core.backend import DTYPE, array_module
from ..core.config import ModelConfig
from ..core.errors import InputError
from ..core.model import LAYER_MATRICES, LAYER_WEIGHTS, LayerWeights, Transformer, layer_weights
from .schemes import (
    GROUP,
    SCHEMES,
    dequantize_float16,
    dequantize_int4,
    dequantize_int8,
    matmul_float16,
    quantize_float16,
    quantize_int4,
    quantize_int8,
)

DEFAULT_BLOCK_BYTES = 1 << 20   # the float32 block dequantized at a time by the NumPy path (1 MiB)
KERNEL_MAX_ROWS = 8             # decode-sized inputs (<= 8 rows) go to the GEMV kernel (use_kernel) or int4's
                                # group dot products; a prompt's many rows are a matrix-matrix product, which
                                # dequantized blocks serve better


# ----------------------------------------------------------------------------------------- the quantized matrix

def quantized_bytes(out_features: int, in_features: int, scheme: str) -> int:
    """Bytes a quantized (out, in) matrix takes: the computed memory that `QuantizedLinear.nbytes` must equal."""
    if scheme == "int8":
        return out_features * in_features + 4 * out_features                   # int8 values + float32 scales
    if scheme == "int4":
        return out_features * in_features // 2 + 2 * 2 * out_features * (in_features // GROUP)
    if scheme == "f16":
        return 2 * out_features * in_features
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
        self.data = data                      # int8: (q, scale); int4: (packed, scale, min); f16: (w16,)
        self.out_features, self.in_features = shape_out_in
        self.block_bytes = block_bytes
        self.use_kernel = use_kernel

    @classmethod
    def from_float(cls, w_out_in, scheme: str, **options) -> QuantizedLinear:
        """Quantize a float (out, in) matrix (GGUF's layout; pass `w.T` for model.py's (in, out) matrices)."""
        xp = array_module(w_out_in)
        if scheme == "f16":                   # rounded first, so the contiguous copy is the half-size one
            data = (xp.ascontiguousarray(quantize_float16(w_out_in)),)
        elif scheme in ("int8", "int4"):
            w_out_in = xp.ascontiguousarray(w_out_in)                   # rows contiguous: row blocks are slices
            data = quantize_int8(w_out_in) if scheme == "int8" else quantize_int4(w_out_in)
        else:
            raise InputError(f"QuantizedLinear takes 'int8', 'int4' or 'f16', got {scheme!r}")
        return cls(scheme, data, tuple(w_out_in.shape), **options)

    @property
    def shape(self) -> tuple[int, int]:
        """The logical (in, out) shape, as the float matrix it replaces."""
        return (self.in_features, self.out_features)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.data)

    def _dequantize(self, parts: tuple):
        """The same rows of every stored array (`self.data`, sliced or indexed) -> float32 (rows, in)."""
        if self.scheme == "f16":
            return dequantize_float16(*parts)
        return dequantize_int8(*parts) if self.scheme == "int8" else dequantize_int4(*parts)

    def dequantize_rows(self, start: int = 0, stop: int | None = None):
        """Output rows [start, stop) as float32 (rows, in)."""
        return self._dequantize(tuple(a[start:stop] for a in self.data))

    def dequantize(self):
        """The whole matrix as float32 (out, in): for tests and quality checks, not for the forward pass."""
        return self.dequantize_rows()

    def __getitem__(self, ids):
        """Dequantized rows for integer ids (N,) -> (N, in): the embedding lookup."""
        return self._dequantize(tuple(a[ids] for a in self.data))

    def __rmatmul__(self, x):
        """x (N, in) float32 -> x @ W (N, out), W the quantized matrix, one block of output rows at a time."""
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise InputError(f"x @ w needs x of shape (N, {self.in_features}), got {tuple(x.shape)}")
        if self.scheme == "f16":              # before use_kernel: the dequantize-GEMV kernel is int8 / int4 only
            return self._matmul_float16(x)
        if self.use_kernel and x.shape[0] <= KERNEL_MAX_ROWS:
            from ..kernels.quant import dequant_gemv
            return dequant_gemv(x, self)
        return self._matmul_int8(x) if self.scheme == "int8" else self._matmul_int4(x)

    def _blocks(self, bytes_per_row: int):
        """[start, stop) ranges of output rows whose temporaries take at most block_bytes."""
        rows = max(1, self.block_bytes // bytes_per_row)
        return [(a, min(a + rows, self.out_features)) for a in range(0, self.out_features, rows)]

    def _matmul_float16(self, x):
        """x rounded to float16, one float16 product with float32 accumulation (schemes.matmul_float16), widened
        back to float32: float16 is the storage, the activations stay float32. No row blocks: on the GPU it is one
        cublasGemmEx that reads the float16 weights as they are, so no float32 copy of the weights exists to bound.
        On NumPy the emulation makes one, of the whole matrix at every call (the tied lm_head: V x D x 4 bytes): far
        slower than float32, the price of checking the GPU's arithmetic on a CPU (lesson 13 times the formats)."""
        (w16,) = self.data                                                              # (out, in) float16
        return matmul_float16(x.astype(np.float16), w16.T).astype(DTYPE)               # (N, out)

    def _matmul_int8(self, x):
        """One scale per output row commutes with the dot product: (x @ q.T) * scale, so only a float32 copy of the
        int8 block is made, not the product q * scale as well."""
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
        odd columns the high ones: no interleaving either. It wins for a few rows; for many rows the 16-long dot
        products starve the BLAS and one big matmul amortizes the dequantization, so prompts (more than
        KERNEL_MAX_ROWS rows) dequantize a block and multiply instead."""
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
    """A new Transformer whose matrices are `weights` ("int8" | "int4" | "f16"; "f32" returns `model` itself).

    Every layer matrix (model.LAYER_MATRICES: q|k|v, o, gate|up, down) is quantized per output channel / per group,
    or rounded to float16 ("f16": float16 storage, float32 accumulation; use_kernel does nothing for it). The tied
    embedding and lm_head are one (vocab, d_model) QuantizedLinear in `embedding` format (default "int8", as
    llama.cpp keeps token_embd at 8 bits in its 4-bit files; None = same as `weights`): `embedding[ids]` dequantizes
    the looked-up rows, `h @ lm_head` multiplies by it. Norms stay float32 and are shared with `model`, as are the
    tokenizer and config; the new Transformer builds its own RoPE table. An untied lm_head is quantized on its own.
    """
    if weights == "f32":
        return model
    if weights not in SCHEMES or (embedding is not None and embedding not in SCHEMES):
        raise InputError(f"unknown weight scheme {weights!r} / {embedding!r}; choose one of {', '.join(SCHEMES)}")
    options = dict(use_kernel=use_kernel, block_bytes=block_bytes)

    def q(w_in_out, scheme=weights):
        return QuantizedLinear.from_float(w_in_out.T, scheme, **options)                # stored as (out, in)

    layers = [LayerWeights(**{w.field: q(getattr(layer, w.field)) if w.is_matrix else getattr(layer, w.field)
                              for w in LAYER_WEIGHTS})
              for layer in model.layers]
    emb_scheme = embedding or weights
    if emb_scheme == "f32":
        table, lm_head = model.embedding, model.lm_head
    else:
        table = QuantizedLinear.from_float(model.embedding, emb_scheme, **options)      # (V, D): rows are tokens
        lm_head = table if model.config.tied_embeddings else q(model.lm_head, emb_scheme)
    quantized = Transformer(model.config, model.tokenizer, table, layers, model.final_norm, lm_head, model.xp,
                            model.device, model.path, load_seconds=model.load_seconds, attention=model.attention)
    quantized.weight_scheme = weights
    return quantized


def set_use_kernel(model, use_kernel: bool) -> None:
    """Route every QuantizedLinear of a quantized model through the CUDA kernel (True) or the NumPy path."""
    for w in [model.embedding, model.lm_head] + [getattr(layer, m.field) for layer in model.layers
                                                 for m in LAYER_MATRICES]:
        if isinstance(w, QuantizedLinear):
            w.use_kernel = use_kernel


def expected_weight_bytes(config: ModelConfig, weights: str, embedding: str | None = "int8") -> int:
    """The weight bytes `quantize_model(model, weights, embedding).weight_bytes` must report, from the config."""
    D, V = config.d_model, config.vocab_size

    def stored_bytes(weight) -> int:
        if not weight.is_matrix:
            return 4 * weight.shape(config)[0]                     # a norm's scale stays float32
        in_features, out_features = weight.shape(config)
        return quantized_bytes(out_features, in_features, weights)

    per_layer = sum(stored_bytes(w) for w in layer_weights(config))
    emb = (embedding or weights) if weights != "f32" else "f32"
    head = 0 if config.tied_embeddings else quantized_bytes(V, D, emb)
    return config.n_layers * per_layer + quantized_bytes(V, D, emb) + head + 4 * D                  # + final norm
