"""Acceptance: which token a verified row yields, so that speculative output keeps plain sampling's distribution
(lesson 12).

processed_probs is the distribution plain sampling draws from (sampling.distribution, for one row that may run ahead
of the verified output: drafters draw from it too); accept_or_resample is one step of Leviathan et al.'s speculative
sampling (see the package docstring, speculative/__init__.py).
"""

from __future__ import annotations

import numpy as np

from ..core.backend import to_host
from ..core.sampling import SamplingRow, distribution, draw_from
from ..core.stopping import tokens_to_suppress


def processed_probs(logits, params, prompt_ids, output_ids, eos_id, constraint=None):
    """The distribution plain sampling draws from after prompt_ids + output_ids (sampling.distribution: the
    structured-output mask of `constraint` standing after output_ids -> min_tokens suppression -> penalties ->
    temperature, min_p, top_k, top_p; a one-hot at the argmax for greedy).   logits (1, V) -> (V,) on the host."""
    row = SamplingRow(params, prompt_ids, output_ids, tokens_to_suppress(params, len(output_ids), eos_id),
                      constraint=constraint)
    return to_host(distribution(logits, [row])[0])


def accept_or_resample(p, q, draft: int, generator) -> int:
    """One speculative-sampling step: the returned token has distribution p whatever q is.

    p (V,) target probabilities, q (V,) the drafter's (None: a one-hot at draft, as n-gram drafts are), draft the
    token drawn from q. Accept it with probability min(1, p[d] / q[d]); otherwise draw from max(p - q, 0),
    renormalised. Two uniforms from the request's generator at most: one for the test, one for the redraw.
    """
    q_d = 1.0 if q is None else float(q[draft])
    if generator.random() * q_d < float(p[draft]):     # u < p/q without dividing by a q of 0
        return draft
    if q is None:
        residual = p.copy()
        residual[draft] = 0.0                           # max(p - onehot, 0): p without d
    else:
        residual = np.maximum(p - q, 0.0)
    if not residual.sum() > 0:                          # p == q up to rounding: nothing left, p itself is exact
        residual = p
    return draw_from(residual, generator)
