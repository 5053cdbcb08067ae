"""Notebook 07's cells (speculative decoding: one verify pass, then the sampled case), as (kind, source) pairs.

scripts/make_notebooks.py builds and executes them into notebooks/07_speculative_decoding.ipynb
(`python scripts/make_notebooks.py 07`); tests/test_notebook_07.py checks the result.
"""

CELLS = [
    ("md", r'''
# 07 · Speculative decoding: one verify pass, step by step, and the sampled case

A drafter guesses k tokens; the model checks all of them in **one** forward pass over the KV cache; the guesses it
agrees with are kept, the first one it disagrees with is replaced by its own token, and the cache is rolled back
past the rejected guesses. This notebook follows one such pass on the real model with the n-gram (prompt lookup)
drafter, using the library's own pieces (`minitransformer/speculative/`). Section 5 turns to sampling, where the
tokens cannot match plain decoding's but their distribution must. Lesson 12 measures when this is faster.
'''),
    ("code", r'''
import json, sys
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt
%matplotlib inline
plt.rcParams.update({"figure.dpi": 70, "font.size": 9})

try:
    import minitransformer
except ImportError:                                   # running from a checkout: the repository root is one level up
    sys.path.insert(0, str(Path.cwd().parent))
from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.generate import make_request
from minitransformer.speculative import SpeculativeConfig, SpeculativeRunner

model = load_model()
tok = model.tokenizer
K = 4                                                  # drafted tokens per pass
print(f"{model.config.n_layers} layers, vocabulary {model.config.vocab_size}, k = {K}")
'''),
    ("md", r'''
## 1. Prefill, and the first token

The prompt already contains the list the model is about to repeat: the situation prompt lookup is made for.
'''),
    ("code", r'''
prompt = ("Here is a list of fruits: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum.\n"
          "The same list again, comma-separated: apple, banana,")
params = SamplingParams(max_tokens=64, temperature=0.0)
request = make_request(model, prompt, params)
runner = SpeculativeRunner(model, request, SpeculativeConfig("ngram", k=K))
logits = runner.first_logits()                         # (1, V): the prefill pass
first = int(np.argmax(logits[0]))                       # greedy
prompt_len = len(request.prompt_token_ids)
print(f"prompt: {prompt_len} tokens in the cache; first token {first} = {tok.decode([first])!r}")
'''),
    ("md", r'''
## 2. The drafter's guess

The n-gram drafter looks for the context's last few tokens earlier in the context and proposes what followed them
there. No model runs.
'''),
    ("code", r'''
context = request.prompt_token_ids + [first]
drafts, _ = runner.drafter.propose(context, K, params, prompt_len, tok.eos_id)
print("context ends with:", tok.pieces(context[-3:]))
print("drafts           :", tok.pieces(drafts), drafts)
'''),
    ("md", r'''
## 3. Verify passes until one rejects a draft

`runner.next_logits(token)` drafts k tokens and runs the model ONCE over `[token, d1, ..., dk]`: k + 1 rows of
logits, row i predicting the token after d_i. Greedy verification keeps d_(i+1) while row i's argmax equals it; the
first row that disagrees gives the model's own token instead, and if all k pass, row k gives a bonus token. Tokens
that were drafts are taken from rows already computed: no new pass.
'''),
    ("code", r'''
token, emitted, passes = first, [first], []
while True:
    verified = len(runner.context)                      # tokens whose K/V are final (token is not yet)
    runner.next_logits(token)                           # draft k, then ONE forward pass of the model
    drafts, rows = list(runner.drafts), runner.rows[0]  # rows: (k + 1, V)
    target = [int(np.argmax(r)) for r in rows]
    accepted = next((i for i, d in enumerate(drafts) if target[i] != d), len(drafts))
    passes.append({"verified": verified, "written": runner.cache.length, "drafts": drafts,
                   "accepted": accepted})
    print(f"pass {len(passes)}: cache {verified} -> {runner.cache.length}, drafts {tok.pieces(drafts)}, "
          f"accepted {accepted} of {len(drafts)}")
    if accepted < len(drafts) or len(emitted) + accepted + 1 >= params.max_tokens - K:
        break                                           # a rejection: look at this pass closely
    for t in target[:accepted]:
        runner.next_logits(t)                           # rows already computed: no model pass
    emitted += target[:accepted + 1]
    token = target[accepted]
'''),
    ("code", r'''
probs = np.exp(rows - rows.max(-1, keepdims=True)); probs /= probs.sum(-1, keepdims=True)   # (k + 1, V)
for i, d in enumerate(drafts):
    verdict = "accept" if i < accepted else "REJECT" if i == accepted else "(not looked at)"
    print(f"row {i}: model {tok.id_to_piece(target[i])!r:12} draft {tok.id_to_piece(d)!r:12} "
          f"p(draft) = {probs[i, d]:.3f}  {verdict}")
fig, ax = plt.subplots(figsize=(5, 2.2))
ax.bar(range(len(drafts)), [probs[i, d] for i, d in enumerate(drafts)],
       color=["tab:green" if i < accepted else "tab:red" for i in range(len(drafts))])
ax.set(xlabel="draft position", ylabel="model's p(draft)", ylim=(0, 1.05), title="the pass with a rejection")
plt.show()
'''),
    ("md", r'''
## 4. Roll back, and compare with plain decoding

The accepted drafts' keys and values stay; the rejected ones are dropped with `KVCache.truncate` (the generate loop
does it inside the next `next_logits`). The cache must then equal plain decoding's, and the tokens plain greedy
decoding's.
'''),
    ("code", r'''
for t in target[:accepted]:
    runner.next_logits(t)                               # the accepted drafts, from computed rows
emitted += target[:accepted + 1]                        # ... then the model's own token
before = runner.cache.length
runner.cache.truncate(len(runner.context))              # keep only tokens that are in the context
after = runner.cache.length
print(f"cache {before} -> {after}: {before - after} rejected draft(s) rolled back")

from minitransformer import KVCache
from minitransformer.core.decode import decode_step
from minitransformer.core.prefill import prefill
plain_cache = KVCache(model.config, after)
prefill(model, request.prompt_token_ids, plain_cache)
for t in runner.context[prompt_len:]:
    decode_step(model, [t], plain_cache)                # plain decoding, one token at a time
diff = float(max(np.abs(runner.cache.k[:, :, :after] - plain_cache.k).max(),
                 np.abs(runner.cache.v[:, :, :after] - plain_cache.v).max()))
print(f"max |speculative cache - plain cache| over {after} tokens: {diff:.1e}")
plain = generate(model, prompt, SamplingParams(max_tokens=len(emitted), temperature=0.0))
print("speculative:", tok.pieces(emitted))
print("plain      :", tok.pieces(plain.token_ids))
'''),
    ("md", r'''
## 5. Sampling: the same distribution, not the same tokens

With a temperature above 0 a verify pass cannot ask "is the draft the model's argmax?". Speculative sampling
(Leviathan et al., 2023; Chen et al., 2023) keeps a draft x, drawn from the drafter's distribution q, with
probability min(1, p(x) / q(x)), where p is the target model's distribution; on a rejection it draws the token from
the leftover max(0, p - q), normalised. Every token is then distributed exactly as p:

```
P(y) = q(y) min(1, p(y) / q(y)) + (1 - Σ min(p, q)) · max(0, p(y) - q(y)) / Σ max(0, p - q)
     = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y),
```

because Σ max(0, p - q) = 1 - Σ min(p, q), which is also the chance of a rejection. The drafter here is the model's
own first 28 of 30 layers (the `self:28` drafter), so q is close to p but not equal to it. Below: p and q after a
fixed context, the identity checked over the whole vocabulary, then seeded draws through `accept_or_resample`, the
function the engine itself calls.
'''),
    ("code", r'''
from minitransformer.speculative.acceptance import accept_or_resample, processed_probs

story = "Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who"
ids = tok.encode(story)
sampling = SamplingParams(temperature=1.0)
LAYERS = 28                                             # the drafter: the model's first 28 of 30 layers
target_logits = model.forward(np.array([ids]), np.arange(len(ids))[None], last_only=True)         # (1, V)
draft_logits = model.forward(np.array([ids]), np.arange(len(ids))[None], layers=LAYERS, last_only=True)  # (1, V)
p = processed_probs(target_logits, sampling, ids, [], tok.eos_id).astype(np.float64)   # (V,) plain sampling's
q = processed_probs(draft_logits, sampling, ids, [], tok.eos_id).astype(np.float64)    # (V,) the drafter's
p, q = p / p.sum(), q / q.sum()
overlap = float(np.minimum(p, q).sum())            # P(keep) = sum_x q(x) min(1, p(x) / q(x)) = sum min(p, q)
leftover = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()                                       # (V,)
exact = np.minimum(p, q) + (1 - overlap) * leftover    # kept drafts + rejected mass redrawn from the leftover
identity_diff = float(np.abs(exact - p).max())
tv_draft = 0.5 * float(np.abs(q - p).sum())
print(f"chance a draft is kept: sum min(p, q) = {overlap:.3f}; TV(q, p) = {tv_draft:.3f}, what keeping every "
      "draft would cost")
print(f"max over the vocabulary of |min(p, q) + (1 - sum min(p, q)) * leftover - p| = {identity_diff:.1e}")
assert identity_diff < 1e-9
'''),
    ("md", r'''
Now the rule itself, drawn many times with a fixed seed: a draft from q, then `accept_or_resample`. The frequencies
of the tokens it returns must be as close to p as the same number of plain draws from p are: their total-variation
distance TV = ½ Σ |frequency - p| stays, 999 times in 1000, below ½ Σ sqrt(p (1 - p) / N) (its expectation's bound)
plus sqrt(ln(1000) / 2N) (one draw moves TV by at most 1/N). Keeping every draft would sit at TV(q, p) instead.
Lesson 12 does the same with 10,000 draws at three temperatures; 3,000 keep this notebook quick.
'''),
    ("code", r'''
N = 3000
rng = np.random.default_rng(0)
q_cdf = np.cumsum(q)
counts, kept = np.zeros_like(p), 0                                                                # (V,)
for _ in range(N):
    x = min(int(np.searchsorted(q_cdf, rng.random() * q_cdf[-1], side="right")), len(q) - 1)   # a draft x ~ q
    y = accept_or_resample(p, q, x, rng)        # x with probability min(1, p[x] / q[x]), else from the leftover
    kept += y == x                              # (a redraw that lands on x again counts too: a tiny overcount)
    counts[y] += 1
plain_counts = np.bincount(rng.choice(len(p), size=N, p=p), minlength=len(p))      # N plain draws from p
tv_spec = 0.5 * float(np.abs(counts / N - p).sum())
tv_plain = 0.5 * float(np.abs(plain_counts / N - p).sum())
bound = 0.5 * float(np.sqrt(p * (1 - p) / N).sum()) + float(np.sqrt(np.log(1000) / (2 * N)))
print(f"{N} draws: drafts kept {kept / N:.3f} (expected {overlap:.3f})")
print(f"TV(speculative, p) = {tv_spec:.4f}   TV(plain, p) = {tv_plain:.4f}   bound {bound:.4f}   "
      f"TV(q, p) = {tv_draft:.4f}")
assert tv_spec <= bound and tv_plain <= bound < tv_draft

top = np.argsort(-p)[:10]                                   # the target's 10 likeliest next tokens
x = np.arange(len(top))
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.bar(x - 0.27, p[top], 0.27, label="p: the model")
ax.bar(x, q[top], 0.27, label=f"q: first {LAYERS} layers")
ax.bar(x + 0.27, counts[top] / N, 0.27, label=f"speculative sampling, {N} draws")
ax.set_xticks(x, [repr(tok.id_to_piece(int(t))) for t in top], rotation=30, fontsize=7)
ax.set(ylabel="probability / frequency", title=f"next token after {story[-25:]!r}")
ax.legend(fontsize=7)
plt.show()
'''),
    ("code", r'''
summary = {"prompt_tokens": prompt_len, "k": K, "passes": passes, "tokens": emitted,
           "cache_before_rollback": before, "cache_after_rollback": after, "cache_max_diff": diff,
           "matches_plain": plain.token_ids == emitted,
           "sampled": {"prompt": story, "layers": LAYERS, "temperature": 1.0, "draws": N, "kept": kept / N,
                       "overlap": overlap, "identity_diff": identity_diff, "tv_speculative": tv_spec,
                       "tv_plain": tv_plain, "bound": bound, "tv_draft": tv_draft}}
print(json.dumps(summary))
'''),
]
