"""Two diagrams of shapes, drawn from the real objects: the KV cache filling up (lesson 03) and the matrix products
of one layer in prefill vs decode (lesson 02).

    kv_cache_growth.png            a real KVCache after prefill and after a few decode steps: its positions as slots,
                                   written (prompt, generated, this step's) or reserved and still empty, with its
                                   shape and bytes as the object reports them
    prefill_vs_decode_shapes.png   the six products of one layer (lab/layer_cost.py) for a T-token prompt and for
                                   one decode token, as rectangles of their real sizes, with FLOPs, bytes, FLOP/byte

`minitransformer figures` draws both (viz.py); tests/test_concept_diagrams.py checks the numbers drawn are the run's.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ..core.backend import to_host
from ..core.decode import decode_step
from ..core.kv_cache import KVCache
from ..core.model import LAYER_MATRICES
from ..core.prefill import prefill
from ..core.sampling import sample
from ..core.sampling_params import SamplingParams
from .layer_cost import layer_products
from .viz_concepts import pyplot as _plt, token_piece as _piece

KV_PROMPT = "The cat sat on the mat, and the dog sat on the rug, because"       # lesson 03's prompt
KV_SNAPSHOTS = (0, 1, 2, 4)                  # decode steps done when the cache is drawn (0: just after prefill)
SHAPES_PROMPT_TOKENS = 64                    # one block of causal_attention's queries: each product is one matmul


# ---------------------------------------------------------------------------------------------------- KV cache

def run_kv_growth(model, prompt: str = KV_PROMPT, snapshots=KV_SNAPSHOTS, layer: int | None = None) -> dict:
    """Prefill the prompt into a KVCache reserved for prompt + the decode steps, decode greedily, and copy one
    layer's K (every KV head, the filled positions) after each step listed in `snapshots`, with the cache's shape
    and bytes at that moment."""
    config, tokenizer = model.config, model.tokenizer
    layer = config.n_layers // 2 if layer is None else layer
    ids = tokenizer.encode(prompt)
    cache = KVCache(config, len(ids) + max(snapshots), xp=model.xp)
    params = SamplingParams(temperature=0.0)
    output: list[int] = []
    shots = []

    def snapshot(steps: int) -> None:
        k = to_host(cache.k[layer, 0, :cache.length].transpose(1, 0, 2))  # (K, length, d): a copy on the host
        shots.append({"steps": steps, "length": cache.length, "shape": cache.shape, "bytes_used": cache.bytes_used,
                      "bytes_reserved": cache.bytes_reserved, "k": k.copy()})

    logits = prefill(model, ids, cache)                                   # (1, V)
    for step in range(max(snapshots) + 1):
        if step in snapshots:
            snapshot(step)
        if step == max(snapshots):
            break
        token = int(sample(logits, [params], [None], [ids], [output])[0])
        output.append(token)
        logits = decode_step(model, [token], cache)
    pieces = [_piece(tokenizer, t) for t in ids + output]                 # spaces shown as a visible mark
    return {"layer": layer, "prompt_ids": ids, "output_ids": output, "pieces": pieces, "max_len": cache.max_len,
            "snapshots": shots}


def draw_kv_cache_growth(model, path, prompt: str = KV_PROMPT) -> dict:
    """Run the cache scenario and draw one row per snapshot: the cache's positions as slots, the written ones (prompt,
    generated, this step's) beside the reserved ones still empty, with the shape and bytes the object reports. What a
    slot holds is said once, with this model's numbers: vectors, not text. Returns the drawn data."""
    from matplotlib.patches import Rectangle
    plt = _plt()
    data = run_kv_growth(model, prompt)
    c, shots = model.config, data["snapshots"]
    max_len, P = data["max_len"], len(data["prompt_ids"])
    per_token = shots[0]["bytes_used"] // shots[0]["length"]
    colours = {"prompt": "#9ec5e8", "generated": "#9ad19a", "reserved": "#f4f4f4"}
    fig, ax = plt.subplots(figsize=(13, 1.2 * len(shots) + 2.6))
    row = 1.2
    for i, shot in enumerate(shots):
        y = (len(shots) - 1 - i) * row
        for position in range(max_len):
            kind = "reserved" if position >= shot["length"] else "prompt" if position < P else "generated"
            newest = position < P if shot["steps"] == 0 else position == shot["length"] - 1   # this step wrote it
            ax.add_patch(Rectangle((position, y), 0.92, 0.6, facecolor=colours[kind],
                                   edgecolor="black" if newest else "#999999", lw=2.0 if newest else 0.6,
                                   linestyle="-" if kind != "reserved" else ":"))
            if kind != "reserved":
                ax.text(position + 0.46, y + 0.3, data["pieces"][position], ha="center", va="center", fontsize=7,
                        family="monospace", rotation=90)
        steps = shot["steps"]
        label = "after prefill" if steps == 0 else f"after {steps} decode step" + "s" * (steps > 1)
        ax.text(-0.3, y + 0.3, f"{label}\n{shot['length']} of {max_len} positions", ha="right", va="center",
                fontsize=8.5)
        ax.text(max_len + 0.3, y + 0.3, f"cache.shape {shot['shape']}\nbytes_used {shot['bytes_used']:,} = "
                f"{shot['length']} x {per_token:,}\nof {shot['bytes_reserved']:,} reserved", ha="left",
                va="center", fontsize=8, family="monospace")
    legend = [Rectangle((0, 0), 1, 1, facecolor=colours[k], edgecolor="#999999") for k in colours]
    legend.append(Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", lw=2.0))
    ax.legend(legend, ["prompt (written by prefill, in one pass)", "generated (one position per decode step)",
                       "reserved for prompt + max_tokens, not written yet", "written by this row's step"],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=4, fontsize=8, frameon=False)
    ax.set_xlim(-9, max_len + 14)
    ax.set_ylim(-0.4, len(shots) * row)
    ax.axis("off")
    fig.suptitle(f"The KV cache filling up, one position per token: a real KVCache of {model.path.stem}, "
                 f"preallocated, written in place, never moved\nOne position holds that token's keys and values "
                 f"for every layer: 2 (K, V) x {c.n_layers} layers x {c.n_kv_heads} KV heads x {c.head_dim} "
                 f"= {2 * c.n_layers * c.n_kv_heads * c.head_dim:,} float32 numbers = {per_token:,} bytes\n"
                 f"(vectors, not text: the token is written in its slot only to name the position)", fontsize=10)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data


# ---------------------------------------------------------------------------------------------------- shapes

ACTIVATION, WEIGHT, CACHE = "#9ec5e8", "#f5b971", "#9ad19a"


def layer_weight_shapes(model) -> dict[str, tuple[int, int]]:
    """(in, out) of each weight matrix of layer 0 (model.LAYER_MATRICES), read from the loaded arrays, by label."""
    layer = model.layers[0]
    return {m.label: tuple(getattr(layer, m.field).shape) for m in LAYER_MATRICES}


def shapes_data(model, prompt_tokens: int = SHAPES_PROMPT_TOKENS) -> dict:
    """layer_products for a prompt of T tokens and for the first decode step after it, checked against the
    model's own weight arrays (a cost model that disagrees with the model is refused, not drawn)."""
    c, T = model.config, prompt_tokens
    prefill_ops, decode_ops = layer_products(c, T), layer_products(c, 1, T)
    weights = layer_weight_shapes(model)
    for op in prefill_ops:
        if op.b_is_weight and (op.inner, op.cols) != weights[op.name]:
            raise ValueError(f"layer_products gives {op.name} as ({op.inner}, {op.cols}) but the model's weight is "
                             f"{weights[op.name]}")
    return {"prompt_tokens": T, "weights": weights, "prefill": [asdict(op) for op in prefill_ops],
            "decode": [asdict(op) for op in decode_ops],
            "config": {k: getattr(c, k) for k in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim",
                                                   "ffn_dim")}}


def _si(n: float, unit: str) -> str:
    """1_105_920 FLOP -> "1.11 MFLOP"; 54_564 bytes -> "54.6 kB"."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.0f} {unit}"


def _product_label(op: dict) -> str:
    times = f"  x {op['count']} KV heads" if op["count"] > 1 else ""
    return (f"({op['rows']} x {op['inner']}) @ ({op['inner']} x {op['cols']}){times}\n"
            f"{_si(op['flops'], 'FLOP')}, {_si(op['bytes'], 'B')}: {op['flops'] / op['bytes']:.2f} FLOP/byte")


def draw_prefill_vs_decode_shapes(model, path, prompt_tokens: int = SHAPES_PROMPT_TOKENS) -> dict:
    """Draw each product of one layer as A (rows x inner) @ B (inner x cols), to scale, prefill left and decode right,
    each with its FLOPs, bytes and FLOP/byte; return the drawn data."""
    from matplotlib.patches import Rectangle
    plt = _plt()
    data = shapes_data(model, prompt_tokens)
    c, T = model.config, data["prompt_tokens"]
    widest = max(op["inner"] + op["cols"] for op in data["prefill"])
    gap, panel = 0.06 * widest, 2.1 * widest                    # space between A and B; one panel's width
    heights = [max(a["rows"], a["inner"]) + 0.12 * widest for a in data["prefill"]]
    fig_h = 2.2 + 0.95 * len(heights)
    fig, ax = plt.subplots(figsize=(16, fig_h))
    y = 0.0
    for i, h in enumerate(heights):
        top, y = y, y - h                                        # every product hangs from its row's top
        for column, phase in enumerate(("prefill", "decode")):
            op, x0 = data[phase][i], column * panel
            rows = max(op["rows"], 0.004 * widest)               # one row is drawn as a hairline, still visible
            ax.add_patch(Rectangle((x0, top - rows), op["inner"], rows, facecolor=ACTIVATION, edgecolor="black",
                                   lw=0.6))
            ax.text(x0 + op["inner"] + gap / 2, top - min(op["inner"], rows) / 2, "@", ha="center", va="center",
                    fontsize=9)
            if op["b_is_weight"]:                                # the contrast in words, under the token rows
                ax.text(x0 + op["inner"] / 2, top - rows - 0.012 * widest, f"{op['rows']} row" + "s" * (op["rows"] > 1),
                        ha="center", va="top", fontsize=10, weight="bold", color="#1f5f99")
            ax.add_patch(Rectangle((x0 + op["inner"] + gap, top - op["inner"]), op["cols"], op["inner"],
                                   facecolor=WEIGHT if op["b_is_weight"] else CACHE, edgecolor="black", lw=0.6))
            ax.text(x0 + widest + 2 * gap, top, _product_label(op), fontsize=9, va="top", family="monospace")
        ax.text(-gap, top - 0.05 * widest, data["prefill"][i]["name"], ha="right", va="top", fontsize=10,
                weight="bold")
    totals = {phase: (sum(op["flops"] for op in data[phase]), sum(op["bytes"] for op in data[phase]))
              for phase in ("prefill", "decode")}
    for column, (phase, title) in enumerate((("prefill", f"prefill: T = {T} prompt tokens (rows = T)"),
                                             ("decode", f"decode: 1 new token at context {T + 1} (rows = 1)"))):
        flops, nbytes = totals[phase]
        ax.text(column * panel, 0.04 * widest, f"{title}\none layer: {_si(flops, 'FLOP')}, {_si(nbytes, 'B')}"
                f" -> {flops / nbytes:.2f} FLOP/byte", fontsize=10, weight="bold", va="bottom")
    handles = [Rectangle((0, 0), 1, 1, facecolor=colour, edgecolor="black") for colour in (ACTIVATION, WEIGHT, CACHE)]
    ax.legend(handles, ["activations (rows: the tokens of this pass)", "weights (read from memory every pass)",
                        "KV cache (keys / values of every position so far)"], loc="upper center",
              bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"Prefill vs decode: the matrix products of one layer, drawn to scale ({model.path.stem}: d_model "
                 f"{c.d_model}, {c.n_heads} query heads on {c.n_kv_heads} KV heads, head_dim {c.head_dim}, FFN "
                 f"{c.ffn_dim}; float32)\nthe same weights multiply {T} rows in prefill and 1 row in decode: FLOPs "
                 f"scale with the rows, the weight bytes do not (lab/layer_cost.py; x {c.n_layers} layers per pass)",
                 fontsize=10)
    ax.set_xlim(-0.2 * widest, 2 * panel)
    ax.set_ylim(y - 0.02 * widest, 0.25 * widest)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data
