"""Exercise 13: speculative decoding's verification, one row at a time (accept the draft, or resample).

A drafter guesses k tokens; the target model checks all k in one forward pass (memory-bound decode reads the weights
once for k + 1 rows). Then, row by row, the engine keeps the draft or replaces it, and stops at the first
replacement: the tokens of a pass are the longest prefix of kept drafts, then the target's own token (the correction
at the first rejected draft, or the bonus token after k kept ones). This function decides ONE row:

    accept_or_resample(p, q, draft, generator) -> token

p (V,) float: the target's distribution at this row (V = 49152 for SmolLM2; after temperature, top-p, ...; a
one-hot at the argmax for greedy). q (V,) float: the drafter's distribution the draft was drawn from, or None for a
deterministic drafter (n-gram lookup): then q is a one-hot at the draft. draft: the drafted token id. generator: the
request's own np.random.Generator. Returns an int token id whose distribution is exactly p, whatever q was
(Leviathan et al. 2023):

  1. accept the draft with probability min(1, p[draft] / q[draft]): one uniform u = generator.random(); keep the
     draft if u * q[draft] < p[draft] (the same test without dividing by a q of 0);
  2. otherwise draw from the residual max(p - q, 0) renormalised (with q None: p with the draft's entry zeroed).
     Draw it with minitransformer.core.sampling.draw_from(residual, generator), which takes an unnormalised
     distribution and one more uniform. If the residual is all zeros (p == q), draw from p itself.

Greedy is the special case p = one-hot at the argmax, q None: the draft is kept iff it is the argmax, otherwise the
token is the argmax, the target's correction.

Use the generator exactly so (one uniform for the test, draw_from for the redraw): a seeded request then gives the
same tokens with your function as with the engine's, which is what the check compares.

Pitfalls: p and q swapped in the test (accepting with probability q/p); resampling from p instead of max(p - q, 0)
(the accepted mass would be counted twice); keeping a rejected draft.

Check it: `minitransformer learn check speculative`. Stuck: `minitransformer learn hint speculative`.
"""

import numpy as np  # noqa: F401  (you will want it)

from minitransformer.core.sampling import draw_from  # noqa: F401  (the redraw)


def accept_or_resample(p, q, draft, generator):
    raise NotImplementedError("write accept_or_resample")
