"""Quantization: int8 / int4 / float16 weights, the levers that cut memory and bandwidth (lesson 13).

Decode reads every weight once per token (decode.py), so its speed is about bytes / bandwidth: fewer bytes per weight
is a direct lever, paid for in quality, which quality.py measures. Our own formats, both kept in the (out, in) layout
of GGUF (one row per output channel), so a row block is a block of output channels and holds whole groups:

- int8, symmetric per output channel: scale[o] = max_i |w[o, i]| / 127, q = round(w / scale) in [-127, 127].
  1 byte per weight + one float32 scale per row. Error per element <= scale[o] / 2. The arithmetic is
  backend.quantize_int8_rows, the same the int8 KV cache applies to each (token, head) vector.
- int4, groups of 32 inputs with a scale and a minimum (the idea of llama.cpp's Q4_1): scale = (max - min) / 15,
  q = round((w - min) / scale) in [0, 15], w ~ q * scale + min. Two values per byte, packed our own way: byte k of a
  row holds value 2k in its low nibble and 2k + 1 in its high nibble (ggml's Q4_1 pairs j with j + 16 instead:
  lesson 13 part 1 unpacks one of its blocks by hand). scale and min are float16, rounded so that every w of the
  group still lies in [min, min + 15 * scale]: 4 + 32 / 32 = 5 bits per weight. Error per element <= scale / 2.
- f16, float16 storage with float32 accumulation: each weight rounded to the nearest float16, relative
  error <= 2^-11; activations are rounded to float16 at each product too, and the products summed in float32
  (schemes.matmul_float16: cuBLAS on the GPU, an emulation of its arithmetic on NumPy). 2 bytes per weight.
  load_model(dtype="float16") is the float32 load followed by quantize_model(model, "f16", embedding="f16").

`QuantizedLinear` stands where a float (in, out) matrix stood in `x @ w` and dequantizes on the fly, a block of output
rows at a time (bounded extra memory: one float32 block of at most `block_bytes`), or, for decode-sized inputs, through
the CUDA dequantize-GEMV kernel (kernels/dequant_gemv.cu) when `use_kernel` is set. `quantize_model` builds a
Transformer from these without touching model.py. The int8 KV cache is not here: it is a storage codec of both
caches (kv_storage.CODECS, one float32 scale per (token, head)), chosen by KVCache(storage="int8"),
generate(kv_cache="int8") or Engine(kv_cache="int8"), and counted by estimate_kv_bytes(..., storage="int8").

All float math in float32 with Python-float constants (backend.py says why: float64 scalars promote arrays).

Modules, in reading order: schemes.py (the int8 / int4 / float16 formats: quantize, dequantize, unpack), linear.py
(QuantizedLinear, quantize_model, set_use_kernel, expected_weight_bytes). Every name is re-exported here, so
`from minitransformer.quantize import X` works.
"""

from ..core.backend import INT8_MAX
from .linear import (
    DEFAULT_BLOCK_BYTES,
    KERNEL_MAX_ROWS,
    QuantizedLinear,
    expected_weight_bytes,
    quantize_model,
    quantized_bytes,
    set_use_kernel,
)
from .schemes import (
    FLOAT16_MAX,
    GROUP,
    INT4_LEVELS,
    SCHEMES,
    dequantize_float16,
    dequantize_int4,
    dequantize_int8,
    matmul_float16,
    quantize_float16,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

__all__ = [
    "SCHEMES", "GROUP", "INT8_MAX", "INT4_LEVELS", "quantize_int8", "dequantize_int8",
    "quantize_int4", "unpack_int4", "dequantize_int4", "FLOAT16_MAX", "quantize_float16", "dequantize_float16",
    "matmul_float16",
    "DEFAULT_BLOCK_BYTES", "KERNEL_MAX_ROWS", "quantized_bytes", "QuantizedLinear", "quantize_model",
    "set_use_kernel", "expected_weight_bytes",
]
