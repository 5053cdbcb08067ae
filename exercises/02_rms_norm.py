"""Exercise 02: RMSNorm.

Every layer of the model normalizes its input twice (before attention, before the feed-forward) and once more before
the lm_head: 61 calls per token for SmolLM2's 30 layers. RMSNorm scales each row so its root mean square is 1, then
multiplies by a learned weight per dimension:

    rms_norm(x) = x / sqrt(mean(x^2 over the last axis) + eps) * weight

Shapes: x (..., D) float32 (D = d_model = 576; the leading axes are batch and tokens), weight (D,), eps a float
(1e-5 for this model). Returns (..., D).

Pitfalls: the mean is over the last axis only, one per row; eps goes inside the square root; no mean subtraction
(that would be LayerNorm) and no bias.

Check it: `minitransformer learn check rms_norm`. Stuck: `minitransformer learn hint rms_norm`.
"""

import numpy as np  # noqa: F401  (you will want it)


def rms_norm(x, weight, eps):
    raise NotImplementedError("write rms_norm")
