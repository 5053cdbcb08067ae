"""Exercise 14: int8 weight quantization, one symmetric scale per output channel.

`--weights int8` stores every matrix of the model (q, k, v, o, gate, up, down, and the tied embedding / lm_head) as
int8 with one float32 scale per output row, a quarter of float32's bytes: decode reads every weight once per token,
so fewer bytes is faster decode. Row o of w (out, in) is stored as

    scale[o] = max(|w[o]|) / 127           q[o] = round(w[o] / scale[o]), clipped to [-127, 127], as int8

and read back as q[o] * scale[o], with an error of at most scale[o] / 2 per weight (1/254 of the row's largest).
The range is symmetric, -127..127 (no -128), so -w quantizes to -q. A row of zeros gets scale 1 (any scale stores
zeros exactly; 0 would divide by zero).

Shapes: w (out, in) float32, GGUF's layout (for SmolLM2: q_proj (576, 576), gate (1536, 576), down (576, 1536), the
embedding (49152, 576)). Returns q (out, in) int8 and scale (out,) float32.

Pitfalls: scale = max|w| alone (then every q is -1, 0 or 1); truncating (astype(np.int8) cuts toward zero) instead of
rounding (np.rint); one scale for the whole matrix (one outlier row then costs every row its precision); a zero row.

Check it: `minitransformer learn check int8`. Stuck: `minitransformer learn hint int8`.
"""

import numpy as np  # noqa: F401  (you will want it)


def quantize_int8(w):
    raise NotImplementedError("write quantize_int8")
