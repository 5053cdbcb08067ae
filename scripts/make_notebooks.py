"""Build notebooks 01-04 (cells below) and 07 (notebook_07_cells.py) and execute them, so the committed copies carry
their outputs.

    python scripts/make_notebooks.py              # all five, executed (about a minute each on 2 busy cores)
    python scripts/make_notebooks.py 02 04        # only these
    python scripts/make_notebooks.py --no-execute # write the cells only (the tests want committed outputs: run
                                                  # it executed, on a quiet machine, before committing)

Why a script: a notebook's JSON is hard to review in a diff; these cells are plain Python and Markdown strings.
Edit here, rerun, commit both. The notebooks execute from a fresh kernel with cwd notebooks/ (as the tests run them)
and read the model from $MINITRANSFORMER_MODEL or the default location.

Notebooks that print times (TIMED) are executed under a measure.Probe: when another program shared the cores, the
executed copy is not written (one line says which and why) unless --allow-busy, so committed timings come from a
quiet machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from notebook_07_cells import CELLS as CELLS_07  # scripts/ is on sys.path when this file runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minitransformer.lab.measure import Probe

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TIMED = ("01", "02", "04")          # they print how long something took: executed only on a quiet machine

SETUP = r'''import json, sys
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt
%matplotlib inline
plt.rcParams.update({"figure.dpi": 70, "font.size": 9})

sys.path.insert(0, str(Path.cwd().parent))          # the repository root: runs from a checkout without installing
from minitransformer import load_model
model = load_model()            # $MINITRANSFORMER_MODEL, else the default SmolLM2-135M-Instruct (fetched on first use)
cfg, tok = model.config, model.tokenizer
print(f"{cfg.name}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} query heads, "
      f"{cfg.n_kv_heads} KV heads, head_dim {cfg.head_dim}, vocab {cfg.vocab_size}; loaded in {model.load_seconds:.1f} s")'''


def md(text: str):
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text: str):
    return nbformat.v4.new_code_cell(text.strip())


# ---------------------------------------------------------------------------------------------------- 01

NB01 = [md(r'''
# Notebook 01: from text to the first next-token distribution (tokenize and prefill)

One prompt goes through SmolLM2-135M one stage at a time, with the library's own functions:
token ids -> embedding rows -> layer 0 by hand (RMSNorm, the Q/K/V projections, RoPE, one head's attention
weights) -> all 30 layers -> `prefill` -> the probabilities of the next token.
Every cell checks what it shows with an `assert`; the last cell prints a JSON summary that
`tests/test_notebooks_01_04.py` compares with references it computes itself.
'''), code(SETUP), md(r'''
## 1. Text -> token ids

The model never sees characters. `tok.encode` cuts the text into byte-level BPE pieces (`Ġ` is a space) and
returns their ids. Look at: common words are one token each, with their leading space; the same word gets the
same id wherever it is.
'''), code(r'''
prompt = "The capital of France is Paris. The capital of Germany is"
ids = tok.encode(prompt)                               # list of T ints
pieces = tok.pieces(ids)
T = len(ids)
for i, (t, p) in enumerate(zip(ids, pieces)):
    print(f"position {i:2d}   id {t:6d}   piece {p!r:14}   bytes {tok.token_bytes(t)!r}")
assert tok.decode(ids) == prompt                      # ids -> text gives the prompt back exactly
print(f"{len(prompt)} characters -> {T} tokens")
'''), md(r'''
## 2. Token ids -> embedding rows

The first layer is a table lookup: row `id` of the (vocab, d_model) embedding matrix. There is no position
information in it: the two ` capital` rows are identical. Positions enter later, through RoPE, inside attention.
SmolLM2 ties its output layer to this table: `lm_head` is the same memory, transposed.
'''), code(r'''
h0 = model.embedding[ids]                              # (T, D): one row per token, no arithmetic
print("embedding", model.embedding.shape, model.embedding.dtype, "-> h0", h0.shape)
print("first 6 values of the first 3 rows:\n", np.round(h0[:3, :6], 4))
embedding_norms = np.linalg.norm(h0, axis=1)
print("row norms:", np.round(embedding_norms, 3))
twice = [i for i in range(T) if ids[i] == ids[1]]     # " capital" appears twice
assert len(twice) == 2 and np.array_equal(h0[twice[0]], h0[twice[1]])
print(f"positions {twice} hold the same token -> identical rows")
print("lm_head shares the embedding's memory:", np.shares_memory(model.lm_head, model.embedding))
'''), md(r'''
## 3. Layer 0: RMSNorm, then the Q, K, V projections

Each layer first normalizes every row to unit root-mean-square (times a learned weight), then projects it to
queries (9 heads x 64), keys and values (3 heads x 64 each: grouped-query attention, 3 query heads share one KV head).
The model keeps Q, K and V as one fused matrix `w_qkv` (one matmul instead of three); `layer.wq`, `wk`, `wv` are
views of its columns. Look at: the fused product and the three separate ones agree; the shapes.
'''), code(r'''
from minitransformer.core.layers import apply_rope, attention, attention_probs, rms_norm, softmax, swiglu

layer = model.layers[0]
x = rms_norm(h0, layer.attn_norm, cfg.norm_eps)        # (T, D)
print("rms of h0 rows:", np.round(np.sqrt((h0 ** 2).mean(1))[:4], 4), " after RMSNorm (before the weight):",
      np.round(np.sqrt(((x / layer.attn_norm) ** 2).mean(1))[:4], 4))
q2d, k2d, v2d = x @ layer.wq, x @ layer.wk, x @ layer.wv          # (T, H*d), (T, K*d), (T, K*d)
fused = x @ layer.w_qkv                                           # (T, (H + 2K) * d)
qkv_split_diff = float(np.abs(np.concatenate([q2d, k2d, v2d], axis=1) - fused).max())
for name, a in (("x", x), ("w_qkv (fused)", layer.w_qkv), ("wq (view)", layer.wq), ("wk (view)", layer.wk),
                ("wv (view)", layer.wv), ("q = x @ wq", q2d), ("k = x @ wk", k2d), ("v = x @ wv", v2d)):
    print(f"{name:15} {str(a.shape):14} {a.dtype}")
print(f"wq is a view of w_qkv: {np.shares_memory(layer.wq, layer.w_qkv)};  max |[q k v] - x @ w_qkv| = {qkv_split_diff:.1e}")
assert qkv_split_diff < 1e-4 and q2d.dtype == np.float32
'''), md(r'''
Every layer has the same shapes. To see what the model itself computes in all 30, we pass `forward` a stand-in
for the KV cache: any object with `attend(layer, q, k, v, positions, attention)` and `advance(T)` (the protocol in
`model.py`). This one records each layer's keys and values (after RoPE) and lets the T tokens attend to each other,
as with no cache.
'''), code(r'''
class Recorder:
    """Stands where a KV cache stands (model.py's protocol); keeps every layer's new keys and values."""
    def __init__(self):
        self.k, self.v = {}, {}

    def attend(self, layer, q, k_new, v_new, positions, attention):
        self.k[layer], self.v[layer] = k_new, v_new     # (B, K, T, d) each
        return attention.causal(q, k_new, v_new, positions, positions)   # this call's tokens only, as with no cache

    def advance(self, T):
        pass

positions = np.arange(T)[None]                          # (1, T)
rec = Recorder()
all_logits = model.forward(np.array([ids]), positions, rec)             # (1, T, V)
print("layer   k shape          v shape          rms(k)   rms(v)")
for i in range(cfg.n_layers):
    k_i, v_i = rec.k[i], rec.v[i]
    print(f"{i:5d}   {str(k_i.shape):16} {str(v_i.shape):16} {np.sqrt((k_i ** 2).mean()):7.3f}  {np.sqrt((v_i ** 2).mean()):7.3f}")
print("logits", all_logits.shape)
'''), md(r'''
## 4. Heads, and RoPE

The flat projections are split into heads: (1, T, H*d) -> (1, H, T, d). Then RoPE rotates each adjacent pair
(x[2i], x[2i+1]) of every query and key by the angle position x base^(-2i/d). Look at: position 0 is not rotated;
a rotation keeps every pair's length; and the score of a query at position m with a key at position n depends on
m - n only, which is how attention learns relative positions. Our hand-rotated keys are the model's own (layer 0 of
the recorder).
'''), code(r'''
H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
G = H // K
q = q2d.reshape(1, T, H, d).transpose(0, 2, 1, 3)               # (1, H, T, d)
k = k2d.reshape(1, T, K, d).transpose(0, 2, 1, 3)               # (1, K, T, d)
v = v2d.reshape(1, T, K, d).transpose(0, 2, 1, 3)               # (1, K, T, d)
cos, sin = model.rope_cos[positions], model.rope_sin[positions] # (1, T, d/2) each: rows of the precomputed table
q_rot, k_rot = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

rope_pos0_diff = float(np.abs(k_rot[:, :, 0] - k[:, :, 0]).max())
pair_norm = lambda a: np.sqrt((a.reshape(*a.shape[:-1], d // 2, 2) ** 2).sum(-1))
rope_norm_diff = float(np.abs(pair_norm(k_rot) - pair_norm(k)).max())
k_model_diff = float(np.abs(k_rot - rec.k[0]).max())

def score(qv, kv_, m, n):
    """q.k after rotating q to position m and k to position n."""
    rot = lambda a, p: apply_rope(a[None, None, None], model.rope_cos[[[p]]], model.rope_sin[[[p]]])[0, 0, 0]
    return float(rot(qv, m) @ rot(kv_, n))
qv, kv_ = q[0, 0, T - 1], k[0, 0, 0]
scores = {(m, n): score(qv, kv_, m, n) for m, n in ((7, 2), (107, 102), (1007, 1002), (7, 6))}
rope_relative_diff = max(abs(scores[(7, 2)] - scores[p]) for p in ((107, 102), (1007, 1002)))
print(f"position 0 unchanged: {rope_pos0_diff:.1e};  pair lengths kept: {rope_norm_diff:.1e};  "
      f"hand keys vs the model's: {k_model_diff:.1e}")
for (m, n), s in scores.items():
    print(f"q at {m:4d}, k at {n:4d} (distance {m - n}): score {s:+.5f}")
assert rope_pos0_diff == 0 and rope_norm_diff < 1e-4 and k_model_diff < 1e-4 and rope_relative_diff < 1e-3
'''), md(r'''
## 5. One head's attention weights

`attention_probs` turns the scores into weights: scaled by 1/sqrt(d), causally masked (a token sees itself and
the tokens before it), softmaxed per row. Query head h reads KV head h // 3. Look at: the white upper triangle
(the mask), rows that sum to 1, and where this head looks from each token (the first row can only look at itself;
the printout names the three keys the last token weighs most).
'''), code(r'''
probs = attention_probs(q_rot, k_rot, positions, positions)     # (1, K, G, T, T)
head = 4
P = probs[0, head // G, head % G]                               # (T, T): row = query, column = key
attn_row_sum_err = float(np.abs(P.sum(-1) - 1).max())
attn_upper_max = float(np.triu(P, 1).max())
fig, ax = plt.subplots(figsize=(4.6, 4.0))
im = ax.imshow(np.where(np.tril(np.ones((T, T))) > 0, P, np.nan), cmap="viridis")
labels = [p.replace("Ġ", "␣") for p in pieces]
ax.set_xticks(range(T), labels, rotation=90); ax.set_yticks(range(T), labels)
ax.set(title=f"layer 0, query head {head} (KV head {head // G})", xlabel="key", ylabel="query")
fig.colorbar(im, ax=ax, fraction=0.046); plt.tight_layout(); plt.show()
print(f"rows sum to 1 within {attn_row_sum_err:.1e}; largest weight above the diagonal: {attn_upper_max}")
print("last token attends most to:", [(labels[j], round(float(P[-1, j]), 3)) for j in np.argsort(-P[-1])[:3]])
assert attn_row_sum_err < 1e-5 and attn_upper_max == 0
'''), md(r'''
The weights mix the value vectors; the heads are concatenated and projected back to d_model by `wo`, and the
result is added to the residual stream. `model.attention_block` does exactly these steps; then the SwiGLU
feed-forward adds its own update. That is one whole layer.
'''), code(r'''
out = attention(q_rot, k_rot, v, positions, positions)          # (1, H, T, d)
attn_update = out.transpose(0, 2, 1, 3).reshape(T, H * d) @ layer.wo                     # (T, D)
block = model.attention_block(0, layer, x, positions, cos, sin, None)                     # (T, D)
block_diff = float(np.abs(attn_update - block).max())
h1 = h0 + block
h1 = h1 + swiglu(rms_norm(h1, layer.ffn_norm, cfg.norm_eps), layer.w_gate_up, layer.w_down)   # (T, D)
print(f"attention update {attn_update.shape}; by hand vs model.attention_block: {block_diff:.1e}; after layer 0 {h1.shape}")
assert block_diff < 1e-5
'''), md(r'''
## 6. All 30 layers, then prefill

The same two residual updates, 30 times; then a final RMSNorm and `lm_head` give one score (logit) per vocabulary
entry. `prefill` does the same for the whole prompt in one pass *and* stores every layer's keys and values in a
`KVCache` (notebook 02), returning only the last position's logits: the next token's. Look at: the hand loop and
prefill agree; the residual stream of the last token grows over the layers (each adds its update to it), and the
final RMSNorm rescales it before `lm_head`.
'''), code(r'''
from minitransformer import KVCache
from minitransformer.lab.measure import time_calls
from minitransformer.core.prefill import prefill

h = h0
residual_norms = [float(np.linalg.norm(h[-1]))]
for i, L in enumerate(model.layers):
    h = h + model.attention_block(i, L, rms_norm(h, L.attn_norm, cfg.norm_eps), positions, cos, sin, None)
    h = h + swiglu(rms_norm(h, L.ffn_norm, cfg.norm_eps), L.w_gate_up, L.w_down)
    residual_norms.append(float(np.linalg.norm(h[-1])))
by_hand = rms_norm(h[-1:], model.final_norm, cfg.norm_eps) @ model.lm_head           # (1, V)

cache = KVCache(cfg, max_len=T + 1)
logits = prefill(model, ids, cache)                                                  # (1, V)
hand_vs_prefill = float(np.abs(by_hand - logits).max())
print(f"prefill of {T} tokens: logits {logits.shape} {logits.dtype}; cache now holds {cache.length} tokens; "
      f"max |hand - prefill| = {hand_vs_prefill:.1e}")

# Its time: one warm-up call, then 5 prefills into fresh caches (measure.time_calls). The fastest is the figure a
# quiet machine gives (noise only adds time); the median and the spread say how much this machine moved meanwhile.
prefill_t = time_calls(lambda: prefill(model, ids, KVCache(cfg, max_len=T + 1)), repeats=5)
print(f"prefill of {T} tokens took {prefill_t.ms()}")
print(f"|h| of the last token: {residual_norms[0]:.1f} (embedding) -> {max(residual_norms):.1f} (largest, after "
      f"{int(np.argmax(residual_norms))} layers) -> {residual_norms[-1]:.1f} (after all {cfg.n_layers})")
assert logits.dtype == np.float32 and cache.length == T and hand_vs_prefill < 1e-3
fig, ax = plt.subplots(figsize=(4.6, 2.4))
ax.plot(residual_norms, marker=".")
ax.set(xlabel="layers applied", ylabel="|h| of the last token", title="the residual stream"); plt.tight_layout(); plt.show()
'''), md(r'''
## 7. Logits -> probabilities of the next token

A softmax turns the 49,152 logits into a distribution. Greedy decoding takes the most probable token; notebook 03
shows the sampler's other choices. Look at: how much of the mass the top few tokens hold.
'''), code(r'''
p = softmax(logits)[0]                                  # (V,)
prob_sum = float(p.sum())
top = np.argsort(-p, kind="stable")[:10]
for rank, t in enumerate(top):
    print(f"{rank + 1:2d}. id {t:6d} {tok.id_to_piece(int(t))!r:14} logit {logits[0, t]:7.3f}   p {p[t]:.4f}")
print(f"sum of all probabilities: {prob_sum:.6f}; top 10 hold {p[top].sum():.3f}")
assert abs(prob_sum - 1) < 1e-5 and top[0] == int(np.argmax(logits[0]))
fig, ax = plt.subplots(figsize=(4.6, 2.4))
ax.bar(range(10), p[top]); ax.set_xticks(range(10), [tok.id_to_piece(int(t)).replace("Ġ", "␣") for t in top], rotation=60)
ax.set(ylabel="probability (log)", yscale="log", title="next token after the prompt"); plt.tight_layout(); plt.show()
'''), md(r'''
## Summary

The numbers this run measured (the test suite reads this last line).
'''), code(r'''
summary = {"prompt": prompt, "ids": ids, "pieces": pieces, "embedding_norms": embedding_norms.tolist(),
           "qkv_split_diff": qkv_split_diff, "k_model_diff": k_model_diff, "rope_pos0_diff": rope_pos0_diff,
           "rope_norm_diff": rope_norm_diff, "rope_relative_diff": rope_relative_diff, "head": head,
           "attn_last_row": P[-1].tolist(), "attn_row_sum_err": attn_row_sum_err, "attn_upper_max": attn_upper_max,
           "block_diff": block_diff, "hand_vs_prefill": hand_vs_prefill, "cache_length": cache.length,
           "top_ids": [int(t) for t in top], "top_probs": [float(p[t]) for t in top], "prob_sum": prob_sum}
print(json.dumps(summary))
''')]


# ---------------------------------------------------------------------------------------------------- 02

NB02 = [md(r'''
# Notebook 02: the KV cache, and decoding one token at a time

After prefill, each new token needs the keys and values of every earlier token, in every layer. Recomputing them
would cost a pass over the whole sequence per token; the KV cache keeps them instead, so a decode step runs only
the newest token through the model. Here we watch the cache fill during prefill and grow by one row per decode
step, then check that what it holds equals what a full recomputation gives: same keys, same logits, same tokens.
The last cell prints a JSON summary that `tests/test_notebooks_01_04.py` checks against its own references.
'''), code(SETUP), md(r'''
## 1. Allocate the cache

`KVCache` preallocates room for prompt + max new tokens: K and V, each (layers, batch, max_len, kv_heads,
head_dim), tokens before heads as in the engine's paged pool. Look at: 3 KV heads, not 9 (grouped-query attention makes the cache 3x smaller); `estimate_kv_bytes`
gives the size from the config alone, which is how a server plans its memory.
'''), code(r'''
from minitransformer import KVCache, SamplingParams, estimate_kv_bytes, generate
from minitransformer.core.decode import decode_step
from minitransformer.core.prefill import prefill

prompt = "The capital of France is"
ids = tok.encode(prompt)
T, N = len(ids), 8                                     # prompt tokens, decode steps
cache = KVCache(cfg, max_len=T + N)
per_token = estimate_kv_bytes(cfg, 1)
print(f"cache.k and cache.v: {cache.k.shape} {cache.k.dtype} each; reserved {cache.bytes_reserved:,} bytes")
print(f"per token: 2 (K,V) x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x {cfg.head_dim} x 4 bytes = {per_token:,} bytes")
print(f"with all {cfg.n_heads} heads cached it would be {per_token * cfg.n_heads // cfg.n_kv_heads:,} bytes per token")
assert cache.bytes_reserved == estimate_kv_bytes(cfg, T + N) and cache.length == 0
'''), md(r'''
## 2. Prefill fills the first T rows

Look at: `length` is the prompt length; the rows after it are still zero, waiting for decode.
'''), code(r'''
logits = prefill(model, ids, cache)                     # (1, V)
k_after_prefill = cache.k[0, 0, :, 0].copy()            # (max_len, d): layer 0, KV head 0
unfilled_max = float(np.abs(cache.k[:, :, T:]).max())
print(f"after prefill: length {cache.length}, filled shape {cache.shape}, bytes used {cache.bytes_used:,}; "
      f"largest |value| in the unfilled rows: {unfilled_max}")
assert cache.length == T and unfilled_max == 0 and (np.abs(cache.k[:, :, :T]).max(axis=-1) > 0).all()
'''), md(r'''
## 3. Decode: one token per step

Each step feeds only the last token (position = `cache.length`), appends its K and V to every layer and attends to
all stored rows. Greedy here: the next token is the argmax of the logits. Look at: the length and the bytes grow by
one token each step; the work per step is one token, while recomputing would be the whole sequence.
'''), code(r'''
tokens = [int(np.argmax(logits[0]))]                   # the first new token comes from prefill's logits
lengths, bytes_used, step_logits = [cache.length], [cache.bytes_used], [logits[0].copy()]
print("step  fed token        position  cache length  bytes used   next token")
for step in range(N):
    logits = decode_step(model, [tokens[-1]], cache)    # (1, V)
    print(f"{step + 1:4d}  {tok.id_to_piece(tokens[-1])!r:14} {cache.length - 1:8d}  {cache.length:12d}  "
          f"{cache.bytes_used:10,}   {tok.id_to_piece(int(np.argmax(logits[0])))!r}")
    tokens.append(int(np.argmax(logits[0])))
    lengths.append(cache.length); bytes_used.append(cache.bytes_used); step_logits.append(logits[0].copy())
print("text:", repr(tok.decode(tokens)))
assert lengths == list(range(T, T + N + 1))
assert bytes_used == [estimate_kv_bytes(cfg, n) for n in lengths]
'''), md(r'''
The cache of layer 0, KV head 0 as an image (rows = token slots, columns = the 64 dimensions): after prefill only
the first T rows are written; after the decode steps every slot is.
'''), code(r'''
fig, axes = plt.subplots(1, 2, figsize=(5.6, 2.8), sharey=True)
for ax, data, title in ((axes[0], k_after_prefill, f"after prefill ({T} rows)"),
                        (axes[1], cache.k[0, 0, :, 0], f"after {N} decode steps ({cache.length} rows)")):
    ax.imshow(data, aspect="auto", cmap="coolwarm", vmin=-3, vmax=3, interpolation="nearest")
    ax.set(title=title, xlabel="head dimension")
axes[0].set_ylabel("token slot"); plt.tight_layout(); plt.show()
'''), md(r'''
## 4. Cached keys == recomputed keys

Now run the whole sequence (prompt + every token fed to decode) through `forward` in one pass, with a stand-in
cache that records each layer's keys and values. If the cache is right, its rows equal these in every layer, and
the logits each decode step produced equal the full pass's logits at the same position. They are equal up to
float32 rounding (the matmuls have different shapes, so the sums run in a different order).
'''), code(r'''
class Recorder:
    """Stands where a KV cache stands (model.py's protocol); keeps every layer's new keys and values."""
    def __init__(self):
        self.k, self.v = {}, {}

    def attend(self, layer, q, k_new, v_new, positions, attention):
        self.k[layer], self.v[layer] = k_new, v_new     # (B, K, S, d)
        return attention.causal(q, k_new, v_new, positions, positions)

    def advance(self, T):
        pass

sequence = ids + tokens[:-1]                            # everything the cache holds: T + N tokens
rec = Recorder()
full = model.forward(np.array([sequence]), np.arange(len(sequence))[None], rec)         # (1, T + N, V)
key_diff = max(float(np.abs(cache.k[l, 0].transpose(1, 0, 2) - rec.k[l][0]).max()) for l in range(cfg.n_layers))
value_diff = max(float(np.abs(cache.v[l, 0].transpose(1, 0, 2) - rec.v[l][0]).max()) for l in range(cfg.n_layers))
logits_diff = float(np.abs(np.stack(step_logits) - full[0, T - 1:]).max())
full_tokens = [int(t) for t in full[0, T - 1:].argmax(-1)]
print(f"max |cached - recomputed| over 30 layers: keys {key_diff:.1e}, values {value_diff:.1e}; "
      f"logits of all {N + 1} steps {logits_diff:.1e}")
print(f"greedy tokens from the full pass == decoded tokens: {full_tokens == tokens}")
assert key_diff < 1e-4 and value_diff < 1e-4 and logits_diff < 1e-3 and full_tokens == tokens
'''), md(r'''
## 5. What the cache saves, in time

The full pass did the work of all T + N tokens; a decode step does one token's, reading the rest from the cache.
`measure.interleaved` times the two in turns (step, pass, step, pass, ...) after a warm-up of each, so a busy
moment of the machine slows both alike. Each is reported as its fastest run (what a quiet machine gives), with the
median and the spread (slowest - fastest) next to it. The step is always the same one: the last token at context
T + N - 1, rolled back with `KVCache.truncate` after each run. Look at: whether the two ranges are apart; only then
does this run show which is faster, and by how much.
'''), code(r'''
from minitransformer.lab.measure import interleaved

step_cache = KVCache(cfg, max_len=len(sequence))
prefill(model, sequence[:-1], step_cache)               # the context before the last token

def one_step():
    decode_step(model, [sequence[-1]], step_cache)      # 1 token through the model, attending to the cache
    step_cache.truncate(len(sequence) - 1)              # rolled back: every run times the same step

def full_pass():
    model.forward(np.array([sequence]), np.arange(len(sequence))[None])    # all T + N tokens, no cache

t = interleaved({"one decode step": one_step, f"full pass over {len(sequence)} tokens": full_pass}, repeats=5)
for name, timing in t.items():
    print(f"{name}: {timing.ms()}")
step, full_t = t.values()
if full_t.min > step.max:
    print(f"every full pass was slower than every decode step: the fastest pass took {full_t.min / step.min:.1f}x "
          "the fastest step")
elif step.min > full_t.max:
    print("every decode step was slower than every full pass: this run contradicts what the cache is for; "
          "rerun on a quiet machine")
else:
    print("the two ranges overlap: this run cannot tell which is faster (the machine was busy?); rerun on a "
          "quiet machine")
'''), md(r'''
## 6. The same loop inside `generate`

`generate` runs exactly these stages (`CachedRunner` in generate.py: prefill, then `decode_step` per token) plus
the sampler, the stop checks and the detokenizer. Greedy, it gives the same tokens, and reports how much cache the
request held at the end.
'''), code(r'''
result = generate(model, prompt, SamplingParams(max_tokens=N + 1, temperature=0.0))
print(f"generate: {result.token_ids} {result.text!r}; finish_reason {result.finish_reason}; "
      f"KV cache at the end: {result.kv_cache_tokens} tokens, {result.kv_cache_bytes:,} bytes")
assert result.token_ids == tokens and result.kv_cache_tokens == cache.length
assert result.kv_cache_bytes == cache.bytes_used
'''), md(r'''
## Summary

The numbers this run measured (the test suite reads this last line).
'''), code(r'''
summary = {"prompt": prompt, "T": T, "N": N, "tokens": tokens, "lengths": lengths, "bytes_used": bytes_used,
           "bytes_reserved": int(cache.bytes_reserved), "cache_k_shape": list(cache.k.shape),
           "unfilled_max": unfilled_max, "key_diff": key_diff, "value_diff": value_diff, "logits_diff": logits_diff,
           "generate_tokens": result.token_ids, "kv_cache_tokens": result.kv_cache_tokens,
           "kv_cache_bytes": result.kv_cache_bytes}
print(json.dumps(summary))
''')]


# ---------------------------------------------------------------------------------------------------- 03

NB03 = [md(r'''
# Notebook 03: choosing the next token, and deciding when to stop

Prefill gives logits; the sampler turns them into one token, and after every token the stop check decides whether
the request is over. The sampler follows vLLM's order: penalties -> (greedy argmax kept aside) -> temperature ->
min_p -> top_k -> top_p -> draw. `sampling.filtered_probs` returns the distribution each setting leaves, so we can
look at it directly. The last cell prints a JSON summary that `tests/test_notebooks_01_04.py` checks.
'''), code(SETUP), md(r'''
## 1. The raw distribution

Look at: how the probability is spread over the top tokens (entropy in nats: 0 = certain).
'''), code(r'''
from minitransformer import KVCache, SamplingParams, generate
from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.layers import softmax
from minitransformer.core.prefill import prefill
from minitransformer.core.sampling import apply_penalties, filtered_probs, make_generator, sample
from minitransformer.core.stopping import check_stop, tokens_to_suppress

prompt = "My favourite food is"
ids = tok.encode(prompt)
logits = prefill(model, ids, KVCache(cfg, max_len=len(ids) + 1))       # (1, V)
raw = softmax(logits)[0]                                                # (V,)
order = np.argsort(-raw, kind="stable")
entropy = lambda p: float(-(p[p > 0] * np.log(p[p > 0])).sum()) + 0.0     # + 0.0: no "-0.00" for a one-hot
show = lambda t: tok.id_to_piece(int(t)).replace("Ġ", "␣")
print(f"entropy {entropy(raw):.2f} nats; top 10:")
for t in order[:10]:
    print(f"  {show(t)!r:14} p {raw[t]:.4f}")
'''), md(r'''
## 2. Temperature

Logits are divided by the temperature before the softmax: below 1 sharpens the distribution, above 1 flattens
it; 0 means greedy (a one-hot at the argmax). Look at: the entropy rising with the temperature.
'''), code(r'''
temperatures = [0.0, 0.5, 1.0, 1.5]
temperature_entropy = {}
fig, ax = plt.subplots(figsize=(5.6, 2.6))
for i, temp in enumerate(temperatures):
    p = filtered_probs(logits, [SamplingParams(temperature=temp)])[0]   # (V,)
    assert abs(float(p.sum()) - 1) < 1e-5
    temperature_entropy[temp] = entropy(p)
    ax.bar(np.arange(12) + 0.2 * (i - 1.5), p[order[:12]], width=0.2, label=f"T={temp}")
    print(f"temperature {temp}: top token p {p[order[0]]:.3f}, entropy {temperature_entropy[temp]:.2f} nats")
ax.set_xticks(range(12), [show(t) for t in order[:12]], rotation=60); ax.legend(); ax.set(ylabel="probability")
plt.tight_layout(); plt.show()
assert temperature_entropy[0.0] == 0 and temperature_entropy[0.5] < temperature_entropy[1.0] < temperature_entropy[1.5]
'''), md(r'''
## 3. Truncation filters: min_p, top_k, top_p

Each removes the unlikely tail and renormalizes what is left. min_p keeps tokens at least min_p times as likely as
the best one; top_k keeps the k most likely; top_p keeps the smallest top set whose mass reaches p. Look at: how
many tokens survive each, and that every result is a distribution again (sums to 1).
'''), code(r'''
filters = {"min_p=0.1": SamplingParams(min_p=0.1), "top_k=5": SamplingParams(top_k=5),
           "top_p=0.9": SamplingParams(top_p=0.9),
           "T=0.7, top_k=50, top_p=0.8": SamplingParams(temperature=0.7, top_k=50, top_p=0.8)}
kept = {}
print("filter                        kept   raw mass kept   sum after   top 3 after")
for name, sp in filters.items():
    p = filtered_probs(logits, [sp])[0]                 # (V,)
    survivors = np.flatnonzero(p)
    kept[name] = survivors.tolist()
    print(f"{name:28} {len(survivors):5d}   {raw[survivors].sum():13.3f}   {p.sum():9.6f}   "
          f"{[(show(t), round(float(p[t]), 3)) for t in survivors[np.argsort(-p[survivors])][:3]]}")
    assert abs(float(p.sum()) - 1) < 1e-5
assert len(kept["top_k=5"]) == 5 and raw[kept["top_p=0.9"]].sum() >= 0.9
assert set(kept["top_k=5"]) == set(order[:5].tolist())
'''), md(r'''
## 4. Penalties

Repetition penalty (prompt and output tokens): a positive logit is divided by r, a negative one multiplied by r,
so both move toward "less likely". Frequency and presence penalties count output tokens only. Look at the logits
of the prompt's own tokens before and after r = 1.5.
'''), code(r'''
r = 1.5
penalised = apply_penalties(logits, [SamplingParams(repetition_penalty=r)], [ids], [[]])[0]   # (V,)
for t in ids:
    before, after = float(logits[0, t]), float(penalised[t])
    print(f"{show(t)!r:14} logit {before:+8.3f} -> {after:+8.3f}")
    assert np.isclose(after, before / r if before > 0 else before * r, rtol=1e-6)
untouched = np.setdiff1d(np.arange(cfg.vocab_size), ids)
assert np.array_equal(penalised[untouched], logits[0, untouched])
output = [int(order[0])] * 3                            # pretend the best token was already generated 3 times
freq = apply_penalties(logits, [SamplingParams(frequency_penalty=0.5, presence_penalty=0.2)], [ids], [output])[0]
print(f"frequency 0.5 x 3 + presence 0.2: {show(order[0])!r} {logits[0, order[0]]:+.3f} -> {freq[order[0]]:+.3f}")
assert np.isclose(freq[order[0]], logits[0, order[0]] - 0.5 * 3 - 0.2, atol=1e-5)
'''), md(r'''
## 5. The draw, and seeds

`sample` draws one token per row from its own random generator: one uniform number per sampled row and step.
The same seed gives the same tokens, and over many draws the frequencies match `filtered_probs`. `generate` uses
the same stage with `make_generator(params.seed)`, so its first token is our first draw.
'''), code(r'''
sp = SamplingParams(temperature=0.8, top_k=8, seed=1234)
draw = lambda g, n: [int(sample(logits, [sp], [g], [ids], [[]])[0]) for _ in range(n)]
first, again = draw(make_generator(sp.seed), 10), draw(make_generator(sp.seed), 10)
print("seed 1234:", [show(t) for t in first], "\nagain    :", [show(t) for t in again])
assert first == again
n_draws = 1000
counts = np.bincount(draw(make_generator(7), n_draws), minlength=cfg.vocab_size)
target = filtered_probs(logits, [sp])[0]
freq_diff = float(np.abs(counts / n_draws - target).max())
for t in np.flatnonzero(target)[np.argsort(-target[np.flatnonzero(target)])]:
    print(f"  {show(t)!r:14} p {target[t]:.3f}   drawn {counts[t] / n_draws:.3f}")
print(f"{n_draws} draws: largest |frequency - probability| = {freq_diff:.3f}; tokens outside the top 8 drawn: "
      f"{int(counts[target == 0].sum())}")
generated = generate(model, prompt, SamplingParams(temperature=0.8, top_k=8, seed=1234, max_tokens=1))
print("generate(..., seed=1234) first token:", show(generated.token_ids[0]))
assert freq_diff < 0.05 and counts[target == 0].sum() == 0 and generated.token_ids[0] == first[0]
'''), md(r'''
## 6. When to stop

After each token the loop detokenizes it and calls `check_stop`, which applies the rules in one fixed order:
min_tokens -> EOS -> stop token ids -> stop strings (on the *text*, so a stop string may span several tokens) ->
max_tokens. We replay one greedy output token by token under different settings. Look at: which token ends each
run, the finish_reason / stop_reason, and where the text is cut. The finish_reasons are vLLM's; stop_reason "eos"
is our own label: vLLM leaves stop_reason None (null in JSON) when EOS ends a request, and so does our HTTP
server (`minitransformer serve`).
'''), code(r'''
prompt2 = "The capital of France is"
ids2 = tok.encode(prompt2)
out = generate(model, prompt2, SamplingParams(temperature=0.0, max_tokens=12))
print("greedy output:", [tok.id_to_piece(t) for t in out.token_ids], repr(out.text))

def replay(params, token_ids):
    """Feed token_ids one at a time to a detokenizer and check_stop, as generate.py's loop does."""
    detok = IncrementalDetokenizer(tok, params.stop)
    for i in range(len(token_ids)):
        new_chars = detok.add_token(token_ids[i])
        decision = check_stop(params, detok, token_ids[:i + 1], new_chars, tok.eos_id, len(ids2), cfg.context_length)
        if decision:
            if decision.truncate_to is not None:
                detok.truncate(decision.truncate_to)
            return {"tokens": i + 1, "finish_reason": decision.finish_reason, "stop_reason": decision.stop_reason,
                    "text": detok.text}
    return None

newline = tok.encode("\n")[0]
cases = {"stop=['answer is']": (SamplingParams(max_tokens=12, stop=["answer is"]), out.token_ids),
         "stop_token_ids=[newline]": (SamplingParams(max_tokens=12, stop_token_ids=[newline]), out.token_ids),
         "same, min_tokens=4": (SamplingParams(max_tokens=12, stop_token_ids=[newline], min_tokens=4), out.token_ids),
         "max_tokens=3": (SamplingParams(max_tokens=3), out.token_ids),
         "EOS as the 3rd token": (SamplingParams(max_tokens=12), out.token_ids[:2] + [tok.eos_id]),
         "same, ignore_eos": (SamplingParams(max_tokens=3, ignore_eos=True), out.token_ids[:2] + [tok.eos_id])}
stops = {}
for name, (params, token_ids) in cases.items():
    stops[name] = replay(params, token_ids)
    s = stops[name]
    print(f"{name:26} after {s['tokens']:2d} tokens: {s['finish_reason']:6} {s['stop_reason']!r:12} text {s['text']!r}")
print("before min_tokens the sampler cannot even draw them:", tokens_to_suppress(cases["same, min_tokens=4"][0], 0, tok.eos_id))
assert stops["stop=['answer is']"]["finish_reason"] == "stop" and stops["max_tokens=3"]["finish_reason"] == "length"
assert stops["EOS as the 3rd token"]["stop_reason"] == "eos" and stops["same, ignore_eos"]["finish_reason"] == "length"
assert stops["same, min_tokens=4"]["tokens"] > stops["stop_token_ids=[newline]"]["tokens"]
'''), md(r'''
The stop string "answer is" is two tokens (` answer`, ` is`): no single token contains it, so only the text can
find it. `generate` with the same setting stops at the same token with the same text.
'''), code(r'''
stopped = generate(model, prompt2, SamplingParams(temperature=0.0, max_tokens=12, stop=["answer is"]))
print(f"generate: {len(stopped.token_ids)} tokens, {stopped.finish_reason} {stopped.stop_reason!r}, text {stopped.text!r}")
s = stops["stop=['answer is']"]
assert (len(stopped.token_ids), stopped.finish_reason, stopped.stop_reason, stopped.text) == \
    (s["tokens"], s["finish_reason"], s["stop_reason"], s["text"])
'''), md(r'''
## Summary

The numbers this run measured (the test suite reads this last line).
'''), code(r'''
summary = {"prompt": prompt, "ids": ids, "top_ids": [int(t) for t in order[:10]],
           "top_probs": [float(raw[t]) for t in order[:10]],
           "temperature_entropy": {str(t): e for t, e in temperature_entropy.items()},
           "kept": {name: len(k) for name, k in kept.items()},
           "kept_ids": {name: k for name, k in kept.items() if len(k) <= 50}, "seeded_draws": first,
           "freq_diff": freq_diff, "stop_prompt": prompt2, "greedy_ids": out.token_ids, "stops": stops,
           "generate_stop": {"tokens": len(stopped.token_ids), "finish_reason": stopped.finish_reason,
                             "stop_reason": stopped.stop_reason, "text": stopped.text}}
print(json.dumps(summary))
''')]


# ---------------------------------------------------------------------------------------------------- 04

NB04 = [md(r'''
# Notebook 04: streaming text, and the request's metrics

The model produces tokens; a user reads characters. Streaming sends the text as it is produced, with two rules:
never send half a character (one emoji can be three tokens), and hold back a tail that may still become a stop
string (it must be cut, and text already sent cannot be taken back). Then we time one request and derive the
serving metrics (TTFT, ITL, TPOT) from its timestamps. The last cell prints a JSON summary that
`tests/test_notebooks_01_04.py` checks.
'''), code(SETUP), md(r'''
## 1. A character split across tokens

Byte-level BPE tokens are runs of *bytes*. Here the parrot emoji (4 bytes) is three tokens. Decoding each token
alone shows `\ufffd` (the replacement character); the `IncrementalDetokenizer` keeps an unfinished character's
bytes until it is complete, so no delta ever contains a broken one. Look at: `new chars` is 0 for the tokens that
only start the emoji, and their delta is empty.
'''), code(r'''
from minitransformer import SamplingParams, generate, stream
from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.stopping import check_stop

text = "A parrot 🦜 says hi"
ids = tok.encode(text)
detok = IncrementalDetokenizer(tok)
partial = {"text": text, "ids": ids, "new_chars": [], "deltas": []}
print("token  bytes               alone            new chars   delta")
for t in ids:
    new_chars = detok.add_token(t)
    delta = detok.take_delta()
    partial["new_chars"].append(new_chars); partial["deltas"].append(delta)
    print(f"{t:5d}  {str(tok.token_bytes(t)):18}  {tok.decode([t])!r:15}  {new_chars:9d}   {delta!r}")
partial["final"] = detok.take_delta(final=True)
assert "".join(partial["deltas"]) + partial["final"] == text
assert not any("\ufffd" in d for d in partial["deltas"]) and 0 in partial["new_chars"]
'''), md(r'''
## 2. Holding back a possible stop string

With `stop=["The answer"]`, text ending in "The" might be the start of the stop string, so it waits; text that
cannot start it goes out at once (llama.cpp's rule: hold back only the longest tail that is a prefix of a stop
string). We replay the loop's order by hand: add the token, check for a stop, then take the delta.
Look at: the `held` column, and that the held-back "The" is never sent because " answer" completes the stop.
'''), code(r'''
prompt = "The capital of France is"
params = SamplingParams(temperature=0.0, max_tokens=12, stop=["The answer"])
greedy = generate(model, prompt, SamplingParams(temperature=0.0, max_tokens=12)).token_ids
prompt_len = len(tok.encode(prompt))
detok = IncrementalDetokenizer(tok, params.stop)
walk = {"deltas": [], "held": []}
print("token         text so far                 held  delta")
for i, t in enumerate(greedy):
    new_chars = detok.add_token(t)
    decision = check_stop(params, detok, greedy[:i + 1], new_chars, tok.eos_id, prompt_len, cfg.context_length)
    if decision:
        if decision.truncate_to is not None:
            detok.truncate(decision.truncate_to)
        walk["deltas"].append(detok.take_delta(final=True)); walk["held"].append(0)
        print(f"{tok.id_to_piece(t)!r:12}  -> stop ({decision.finish_reason}, {decision.stop_reason!r}); text cut to "
              f"{detok.text!r}; last delta {walk['deltas'][-1]!r}")
        break
    walk["held"].append(detok.held_back())
    walk["deltas"].append(detok.take_delta())
    print(f"{tok.id_to_piece(t)!r:12}  {detok.text!r:26}  {walk['held'][-1]:4d}  {walk['deltas'][-1]!r}")
walk["text"] = detok.text
assert "".join(walk["deltas"]) == detok.text and max(walk["held"]) == len("The")
'''), md(r'''
## 3. The same through `stream()`

`stream` runs the whole loop (prefill, decode, sampler, detokenizer, stop check) and yields a `Delta` per token;
the last one carries the finished `Result`. Its deltas are the ones we built by hand, and they add up to the text.
'''), code(r'''
deltas = list(stream(model, prompt, params))
result = deltas[-1].result
stream_texts = [d.text for d in deltas]
print("deltas:", stream_texts)
print(f"result: {result.text!r}, {result.finish_reason} {result.stop_reason!r}, token ids {result.token_ids}")
assert stream_texts == walk["deltas"] and "".join(stream_texts) == result.text == walk["text"]
assert [t for d in deltas for t in d.token_ids] == result.token_ids
'''), md(r'''
## 4. Metrics from timestamps

Every request records when it arrived, when it was scheduled, when each token was ready and when it finished,
all on one monotonic clock. The serving metrics are derived from those (vLLM's definitions):
TTFT = first token - arrival (what the user waits for), ITL = the gaps between tokens, TPOT = (e2e - TTFT) /
(n - 1), decode tokens/s = 1 / TPOT. Look at: the wait for the first token (the prompt's prefill) against the
gaps after it (one decode step each). These are one request's times, as the machine that executed this copy
measured them: the definitions hold for any run, the numbers only for this one (a busy machine moves them; lesson
02 times each phase repeatedly and says when its numbers show a difference).
'''), code(r'''
chat_result = generate(model, "Write one sentence about the sea.", SamplingParams(temperature=0.0, max_tokens=16),
                       chat=True)
m = chat_result.metrics
n = len(m.token_times)
times = np.array(m.token_times) - m.arrival_time                     # (n,) seconds since arrival
print(f"prompt {chat_result.usage.prompt_tokens} tokens (chat template), {n} generated: {chat_result.text!r}")
print(f"queue {m.queue_s * 1e3:.2f} ms, TTFT {m.ttft_s * 1e3:.0f} ms (prefill {m.prefill_s * 1e3:.0f} ms), "
      f"TPOT {m.tpot_s * 1e3:.1f} ms, decode {m.decode_tokens_per_s:.1f} tok/s, e2e {m.e2e_s * 1e3:.0f} ms")
print("ITL (ms):", {k: round(v * 1e3, 1) for k, v in m.itl_summary().items()})
assert np.isclose(m.ttft_s, times[0]) and len(m.itl_s) == n - 1
assert np.isclose(m.tpot_s, (m.e2e_s - m.ttft_s) / (n - 1)) and np.isclose(sum(m.itl_s), times[-1] - times[0])
assert chat_result.usage.total_tokens == chat_result.usage.prompt_tokens + n
fig, ax = plt.subplots(figsize=(5.0, 2.6))
ax.step(times * 1e3, np.arange(1, n + 1), where="post")
ax.axvline(m.ttft_s * 1e3, color="tab:red", lw=0.8, label=f"TTFT {m.ttft_s * 1e3:.0f} ms")
ax.set(xlabel="ms since arrival", ylabel="tokens generated", title="one request's timeline", xlim=(0, None))
ax.legend()
plt.tight_layout(); plt.show()
'''), md(r'''
## Summary

The numbers this run measured (the test suite reads this last line).
'''), code(r'''
summary = {"partial": partial, "prompt": prompt, "stop": params.stop, "greedy_ids": greedy, "walk": walk,
           "stream_texts": stream_texts, "result": {"text": result.text, "token_ids": result.token_ids,
                                                    "finish_reason": result.finish_reason,
                                                    "stop_reason": result.stop_reason},
           "timestamps": {"arrival": m.arrival_time, "scheduled": m.scheduled_time, "tokens": m.token_times,
                          "finished": m.finished_time},
           "metrics": m.to_dict(), "usage": chat_result.usage.to_dict()}
print(json.dumps(summary))
''')]


NB07 = [md(text) if kind == "md" else code(text) for kind, text in CELLS_07]

ALL = {"01": ("01_tokenize_and_prefill", NB01), "02": ("02_kv_cache_and_decode", NB02),
       "03": ("03_sampling_and_stopping", NB03), "04": ("04_streaming_and_metrics", NB04),
       "07": ("07_speculative_decoding", NB07)}


def build(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="*", help=f"notebook numbers among {', '.join(ALL)} (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    parser.add_argument("--allow-busy", action="store_true",
                        help="write a timed notebook executed while the machine was busy (by default it is not)")
    args = parser.parse_args()
    unknown = [w for w in args.which if w not in ALL]
    if unknown:
        parser.error(f"unknown notebook {unknown[0]!r}; choose among {', '.join(ALL)}")
    refused = []
    for key in args.which or ALL:
        name, cells = ALL[key]
        nb = build(cells)
        start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        probe = Probe() if key in TIMED and not args.no_execute else None
        if not args.no_execute:
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        path = NOTEBOOKS / f"{name}.ipynb"
        if probe:
            quiet = probe.finish()
            print(f"{name}: {quiet.line()}", file=sys.stderr)
            if not quiet.quiet and not args.allow_busy:
                print(f"not written: {path.name}: the machine was busy while it ran ({quiet.why_busy()}); close "
                      "other programs and rerun, or pass --allow-busy", file=sys.stderr)
                refused.append(name)
                continue
        nbformat.write(nb, path)
        print(f"wrote {path} ({path.stat().st_size / 1000:.0f} KB); executed in {time.perf_counter() - start:.0f} s, "
              f"kernel CPU {used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime:.0f} s", file=sys.stderr)
    if refused:
        sys.exit(1)


if __name__ == "__main__":
    main()
