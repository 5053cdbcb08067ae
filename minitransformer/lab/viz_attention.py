"""One new query against the cached keys and values: the KV cache's central picture, from a real decode step
(lessons 03 and 04).

    query_vs_cache.png   one decode step of lesson 03's prompt, at one layer and one query head: the new token's
                         query q, the cached keys K it reads (one row per earlier token), the scores q.k / sqrt(d)
                         and their softmax p, the cached values V, and the weighted sum p @ V, next to that head's
                         output in the model's own step

Nothing here is recomputed from the weights. The step is decode.decode_step on a RecordingCache: a KVCache that, for
one layer, copies the query and the keys and values its attention read, and the output it returned. The scores and
the weighted sum are then recomputed from those copies in plain NumPy, to show what attention does; the figure
prints how far the sum is from the model's own output (float32 rounding), and tests/test_learner_diagrams.py checks it.

The head drawn is, of its layer's query heads, the one that puts the least weight on the first token: in this model
most heads of the later layers put most of theirs there (an "attention sink"), which would leave little to see.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.backend import to_host
from ..core.decode import decode_step
from ..core.kv_cache import KVCache
from ..core.metrics import percentile
from ..core.prefill import prefill
from .viz_concepts import pyplot, token_piece
from .viz_shapes import KV_PROMPT

QUERY_COLOUR, KEY_CMAP = "#d9534f", "RdBu_r"


class RecordingCache(KVCache):
    """A KVCache that keeps, for one layer's single-token (decode) pass, what its attention read and returned."""

    def __init__(self, config, max_len: int, layer: int, xp=np):
        super().__init__(config, max_len, xp=xp)
        self.layer = layer
        self.seen: dict | None = None           # the copies, once the layer's decode pass has run

    def attend(self, layer: int, q, k_new, v_new, positions, attention):
        out = super().attend(layer, q, k_new, v_new, positions, attention)       # (B, H, T, d)
        if layer == self.layer and q.shape[2] == 1:
            end = self.length + 1                                   # advance() comes after the whole pass
            assert self.store is not None, "attend just stored into it"
            k, v = self.store.get(layer, (slice(None), slice(0, end)))                # (B, end, K, d) each
            self.seen = {"q": to_host(q[0, :, 0]).copy(),           # (H, d): the new token's query, every head
                         "k": to_host(k[0].transpose(1, 0, 2)).copy(),                 # (K, S, d): what it reads
                         "v": to_host(v[0].transpose(1, 0, 2)).copy(),
                         "out": to_host(out[0, :, 0]).copy()}       # (H, d): the model's attention output
        return out


def run_query_vs_cache(model, prompt: str = KV_PROMPT, layer: int | None = None) -> dict:
    """Prefill the prompt, take one greedy decode step on a RecordingCache, and work out one head's attention from
    the copies: q (d,), K and V (S, d), scores and probs (S,), weighted sum and the model's output (d,)."""
    config, tokenizer = model.config, model.tokenizer
    layer = config.n_layers // 2 if layer is None else layer                   # kv_cache_growth.png's layer
    ids = tokenizer.encode(prompt)
    cache = RecordingCache(config, len(ids) + 1, layer, xp=model.xp)
    logits = to_host(prefill(model, ids, cache))                               # (1, V)
    new_token = int(np.argmax(logits[0]))                                      # greedy: the step's input token
    decode_step(model, [new_token], cache)
    seen, d = cache.seen, config.head_dim
    assert seen is not None, "a decode step runs every layer, the recorded one too"
    heads = []
    for head in range(config.n_heads):
        kv_head = head // config.group_size                                    # grouped-query attention
        scores = seen["k"][kv_head] @ seen["q"][head] / np.sqrt(d)             # (S,)
        probs = np.exp(scores - scores.max())
        heads.append((probs[0] / probs.sum(), head, kv_head, scores, probs / probs.sum()))
    _, head, kv_head, scores, probs = min(heads, key=lambda h: h[0])          # least weight on the first token
    weighted = probs @ seen["v"][kv_head]                                      # (d,): sum over S of p_i * v_i
    return {"layer": layer, "head": head, "kv_head": kv_head, "head_dim": d, "new_token": new_token,
            "pieces": [token_piece(tokenizer, t) for t in ids + [new_token]],
            "q": seen["q"][head], "k": seen["k"][kv_head], "v": seen["v"][kv_head], "scores": scores,
            "probs": probs, "weighted": weighted, "model_out": seen["out"][head],
            "first_token_weights": [round(float(h[0]), 3) for h in sorted(heads, key=lambda h: h[1])]}


def draw_query_vs_cache(model, path, prompt: str = KV_PROMPT) -> dict:
    """Run the step and draw q over K, the probabilities, and V with p @ V under it; return the drawn data."""
    plt = pyplot()
    data = run_query_vs_cache(model, prompt)
    S, pieces = len(data["probs"]), data["pieces"]
    fig = plt.figure(figsize=(13, 7.2))
    grid = fig.add_gridspec(2, 3, height_ratios=(1, S), width_ratios=(4, 2.2, 4), hspace=0.08, wspace=0.32,
                            left=0.1, right=0.97, top=0.83, bottom=0.09)

    def image(rows):                               # one colour scale per kind (keys and queries, values and sums)
        vmax = percentile(np.abs(rows).ravel(), 99) or 1.0
        return dict(aspect="auto", cmap=KEY_CMAP, vmin=-vmax, vmax=vmax, interpolation="nearest")
    keys, values = image(np.vstack([data["k"], data["q"]])), image(np.vstack([data["v"], data["weighted"]]))

    q_ax, k_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
    q_ax.imshow(data["q"][None, :], **keys)
    q_ax.set_yticks([0], [f"q  {pieces[-1]}"], fontsize=8, family="monospace", color=QUERY_COLOUR)
    q_ax.set_xticks([])
    q_ax.set_title("the new token's query q (one row) and the cached keys K", fontsize=9)
    k_ax.imshow(data["k"], **keys)
    k_ax.set_yticks(range(S), pieces, fontsize=8, family="monospace")
    k_ax.get_yticklabels()[-1].set_color(QUERY_COLOUR)
    k_ax.set_xlabel(f"head_dim ({data['head_dim']})", fontsize=8)

    p_ax = fig.add_subplot(grid[1, 1], sharey=k_ax)
    p_ax.barh(range(S), data["probs"], color="tab:blue")
    for i, (score, p) in enumerate(zip(data["scores"], data["probs"])):
        p_ax.text(p, i, f" {p:.2f}  (score {score:+.1f})", va="center", fontsize=7)
    p_ax.set_xlim(0, 2.2 * float(data["probs"].max()))
    p_ax.tick_params(labelleft=False)
    p_ax.set_xlabel("p = softmax(q.k / sqrt(d)) over the cached tokens", fontsize=8)
    p_ax.set_title("one score per cached token", fontsize=9)

    out_ax, v_ax = fig.add_subplot(grid[0, 2]), fig.add_subplot(grid[1, 2], sharey=k_ax)
    out_ax.imshow(data["weighted"][None, :], **values)
    out_ax.set_yticks([0], ["p @ V"], fontsize=8, family="monospace")
    out_ax.set_xticks([])
    out_ax.set_title("the cached values V; p @ V is the head's output", fontsize=9)
    v_ax.imshow(data["v"], **values)
    v_ax.tick_params(labelleft=False)
    v_ax.set_xlabel(f"head_dim ({data['head_dim']})", fontsize=8)

    gap = float(np.abs(data["weighted"] - data["model_out"]).max())
    fig.suptitle(f"One decode step of {model.path.stem}: the new token's query reads every cached key and value "
                 f"once (layer {data['layer']}, query head {data['head']}, which reads KV head {data['kv_head']})\n"
                 f"The last row is the token this step processes; the rows above it were computed once, at prefill, "
                 f"and only read now: that is what the KV cache saves.\n"
                 f"p @ V recomputed here from the cached rows vs the model's own output for this head: max "
                 f"|difference| {gap:.1e} (float32 rounding).\n"
                 f"Colours: K and q on one scale, V and p @ V on another, clipped at the 99th percentile.",
                 fontsize=9.5)
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data
