"""Speculative decoding: a cheap drafter guesses k tokens, the model checks all k in ONE forward pass.

    plain:        [decode x] -> t1   [decode t1] -> t2   [decode t2] -> t3 ...        one target pass per token
    speculative:  drafter guesses d1..dk after x;  [target on x, d1..dk] -> rows r0..rk in one pass
                  keep d1 if r0 agrees, d2 if r1 agrees, ...; at the first disagreement take the target's own
                  token instead (or, when all k pass, the bonus token from rk): 1 to k+1 tokens per target pass

Decode is memory-bound (decode.py): a pass over k+1 tokens streams the same weights as a pass over one, so when the
guesses are good the target produces several tokens for about the price of one. Lesson 12 measures whether that
holds on the machine at hand (on 2 CPU cores a 5-token pass is not free, see the lesson).

Verification is done row by row inside core's ordinary loop (core/generate.py, through request.RequestState), so
penalties, min_tokens, stop checks, the detokenizer, logprobs and metrics are the same code as plain decoding. It plugs
in as that loop's runner: `generate(model, prompt, params, runner=speculative_runner("ngram", 4))`; the
`SpeculativeRunner` stands where core's CachedRunner stands and only changes where the next logits come from and how a
row's token is chosen:
- greedy: the row's token is the plain greedy choice; the draft is accepted iff it equals it. Output == plain greedy.
- sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", and Chen et al.
  2023): accept draft d with probability min(1, p(d)/q(d)), p the target's and q the drafter's distribution after
  the same SamplingParams processing; on rejection draw from normalize(max(p - q, 0)). The token then has exactly
  distribution p. A rejected draft has p(d) < q(d), so max(p - q, 0) is 0 at d: "token == draft" means accepted.
Rejected drafts are rolled back with KVCache.truncate: the target cache then equals plain decoding's.
With structured output (structured/) each verified row goes through the request's mask like any sampled token, so
greedy output is plain constrained greedy's; the drafters guess inside the constraint too (drafters.py), so no
verify row is spent on a draft the mask would refuse.

Drafters (`propose(context, k, ...)` -> k draft tokens and the distributions they were drawn from):
- "ngram": prompt lookup (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; vLLM's ngram proposer): find
  the context's last n tokens earlier in the context and propose what followed them. No model, one-hot q.
- "self:L": the model's own first L layers + the shared final norm and lm_head (layer-skip self-speculation,
  Zhang et al. 2023 "Draft & Verify"): model.forward(..., layers=L). Its keys/values for layers < L are exactly the
  target's, so it keeps no cache of its own: it writes its draft tokens' K/V into the target cache past the verified
  length, where the verify pass overwrites them.
- a second Transformer with the same vocabulary (`--draft-model PATH`): its own KV cache, rolled back the same way.

Modules, in reading order: config.py (SpeculativeConfig, make_config, parse_method), acceptance.py
(processed_probs, accept_or_resample), drafters.py (the Drafter protocol; n-gram, self, second model), runner.py
(SpeculativeRunner, speculative_runner, SpeculativeStats). Every name is re-exported here, so
`from minitransformer.speculative import X` works.
"""

from .acceptance import accept_or_resample, processed_probs
from .config import (
    MAX_SPECULATIVE_TOKENS,
    SpeculativeConfig,
    check_layers,
    check_same_vocabulary,
    describe,
    make_config,
    parse_method,
)
from .drafters import Drafter, ModelDrafter, NgramDrafter, SecondModelDrafter, SelfDrafter, make_drafter
from .runner import SpeculativeRunner, SpeculativeStats, VerifyPass, speculative_runner

__all__ = [
    "MAX_SPECULATIVE_TOKENS", "SpeculativeConfig", "make_config", "parse_method", "check_layers", "describe",
    "check_same_vocabulary",
    "processed_probs", "accept_or_resample",
    "Drafter", "make_drafter", "NgramDrafter", "ModelDrafter", "SelfDrafter", "SecondModelDrafter",
    "SpeculativeStats", "SpeculativeRunner", "VerifyPass", "speculative_runner",
]
