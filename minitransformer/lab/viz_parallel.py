"""One decoder layer split over N tensor-parallel ranks, drawn from the shard plan (lesson 15).

    tensor_parallel_layer.png   a lane per rank: the hidden state every rank holds, its column-parallel w_qkv
                                shard (its q heads | its KV heads) and w_gate_up shard, its row-parallel wo and
                                w_down shards, as rectangles of their real shapes (in x out), and the two
                                all-reduces that join the lanes

Every number drawn comes from parallel/plan.py's ShardPlan (which heads and FFN columns a rank holds) and
model.LAYER_MATRICES (which matrix splits which way, and its shape for the rank's config): the same objects the
loader reads each rank's shard with, so the figure cannot disagree with what a rank holds
(tests/test_concept_diagrams.py loads the shards and compares). Nothing is timed.
"""

from __future__ import annotations

from pathlib import Path

from ..core.config import ModelConfig
from ..core.model import LAYER_MATRICES
from ..parallel.plan import ShardPlan, supported_sizes
from .viz_concepts import pyplot as _plt

RANK_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
REDUCE = "#f2d16b"
FIGURE_SIZE = 3                  # figures/tensor_parallel_layer.png: SmolLM2 over 3 ranks, as lesson 15 runs it


def figure_size(config: ModelConfig) -> int:
    """The ranks the committed figure splits a model over: 3 when its heads allow it (SmolLM2), else the smallest
    size above 1 that the plan allows, else 1."""
    sizes = [n for n in supported_sizes(config) if n > 1]
    return FIGURE_SIZE if FIGURE_SIZE in sizes else (sizes[0] if sizes else 1)


def shard_layout(config: ModelConfig, size: int) -> dict:
    """What each rank holds of one layer: its query heads, KV heads and FFN columns (as [start, stop) of the whole
    model's), and each matrix's shape on that rank next to the whole model's; plus the all-reduce payload."""
    ranks = []
    for rank in range(size):
        plan = ShardPlan(config, size, rank)
        local, q, ffn = plan.shard_config(), plan.span("q_dim"), plan.span("ffn_dim")
        ranks.append({"rank": rank,
                      "q_heads": [q.start // config.head_dim, q.stop // config.head_dim],
                      "kv_heads": [plan.first_kv_head, plan.first_kv_head + local.n_kv_heads],
                      "ffn_columns": [ffn.start, ffn.stop],
                      "shapes": {w.field: w.shape(local) for w in LAYER_MATRICES},
                      "split": {w.field: w.split for w in LAYER_MATRICES}})
    return {"model": config.name, "size": size, "d_model": config.d_model, "head_dim": config.head_dim,
            "whole": {w.field: w.shape(config) for w in LAYER_MATRICES}, "ranks": ranks,
            "kv_replicas": ShardPlan(config, size, 0).kv_replicas,
            "all_reduce_bytes_per_token": config.d_model * 4}       # float32 hidden state of one token


def draw_tensor_parallel_layer(config: ModelConfig, size: int, path, model_name: str | None = None) -> dict:
    """Draw shard_layout(config, size): one lane per rank, matrices to scale, the two all-reduces across the lanes.
    model_name: what the title calls the model (the file's name, as the other figures; default the name the GGUF
    file carries inside, which can be a training run's, e.g. "Smollm2 135M 8k Lc100K Mix1 Ep2"). Returns the layout."""
    from matplotlib.patches import FancyBboxPatch, Rectangle
    plt = _plt()
    data = shard_layout(config, size)
    D = config.d_model
    unit = 1.0 / D                                    # a dimension of d_model draws as 1.0
    lane = 1.9                                        # lane height
    gap = 0.35
    order = tuple(m.field for m in LAYER_MATRICES)   # w_qkv, wo, w_gate_up, w_down: the x positions below name them
    widths = {f: max(r["shapes"][f][1] for r in data["ranks"]) * unit for f in order}
    x_state = 0.0
    x = {"w_qkv": x_state + 0.35 + 2.5 * gap}                  # room for the labels of x and w_qkv side by side
    x["wo"] = x["w_qkv"] + widths["w_qkv"] + 0.9
    x["reduce1"] = x["wo"] + widths["wo"] + gap
    x["w_gate_up"] = x["reduce1"] + 0.5 + gap
    x["w_down"] = x["w_gate_up"] + widths["w_gate_up"] + 0.9
    x["reduce2"] = x["w_down"] + widths["w_down"] + gap
    right = x["reduce2"] + 0.5
    fig, ax = plt.subplots(figsize=(min(1.4 * right + 1.5, 16), 1.6 + 1.75 * size))
    for r in data["ranks"]:
        colour = RANK_COLOURS[r["rank"] % len(RANK_COLOURS)]
        top = (size - 1 - r["rank"]) * (lane + 0.4) + lane
        ax.text(x_state - 0.15, top - 0.5, f"rank {r['rank']}", ha="right", va="center", fontsize=9, color=colour,
                weight="bold")
        ax.add_patch(Rectangle((x_state, top - 1.0), 0.3, 1.0, facecolor="#dddddd", edgecolor="grey"))
        ax.text(x_state + 0.15, top - 1.12, f"x (T, {D})\nevery rank", ha="center", va="top", fontsize=6.5)
        for field in order:
            rows, cols = r["shapes"][field]
            w, h = cols * unit, rows * unit
            split = r["split"][field]
            ax.add_patch(Rectangle((x[field], top - h), w, h, facecolor=colour, alpha=0.35 if split == "row" else 0.6,
                                   edgecolor=colour))
            if field == "w_qkv":                      # the q | k | v boundaries inside the shard
                local_q = (r["q_heads"][1] - r["q_heads"][0]) * config.head_dim
                local_kv = (r["kv_heads"][1] - r["kv_heads"][0]) * config.head_dim
                for edge in (local_q, local_q + local_kv):
                    ax.plot([x[field] + edge * unit] * 2, [top - h, top], color="white", lw=1.2)
            label = {"w_qkv": f"w_qkv ({rows}, {cols})\nq heads {_span(r['q_heads'])}, KV {_span(r['kv_heads'])}",
                     "wo": f"wo ({rows}, {cols})\nrows of its q heads",
                     "w_gate_up": f"w_gate_up ({rows}, {cols})\nFFN cols {_span(r['ffn_columns'])} x gate, up",
                     "w_down": f"w_down ({rows}, {cols})\nrows {_span(r['ffn_columns'])}"}[field]
            ax.text(x[field] + w / 2, top - max(h, 0.02) - 0.06, label, ha="center", va="top", fontsize=6.5)
        ax.annotate("", (x["wo"] - 0.05, top - 0.5), (x["w_qkv"] + widths["w_qkv"] + 0.05, top - 0.5),
                    arrowprops={"arrowstyle": "-|>", "color": "grey"})
        ax.text((x["w_qkv"] + widths["w_qkv"] + x["wo"]) / 2, top - 0.42, "attention\nits heads only",
                ha="center", va="bottom", fontsize=6)
        ax.annotate("", (x["w_down"] - 0.05, top - 0.5), (x["w_gate_up"] + widths["w_gate_up"] + 0.05, top - 0.5),
                    arrowprops={"arrowstyle": "-|>", "color": "grey"})
        ax.text((x["w_gate_up"] + widths["w_gate_up"] + x["w_down"]) / 2, top - 0.42, "silu(gate)\n* up",
                ha="center", va="bottom", fontsize=6)
    height = size * (lane + 0.4) - 0.4
    for key, name in (("reduce1", "all-reduce 1"), ("reduce2", "all-reduce 2")):
        ax.add_patch(FancyBboxPatch((x[key], 0.05), 0.5, height - 0.1, boxstyle="round,pad=0.02", facecolor=REDUCE,
                                    edgecolor="#b58b00"))
        ax.text(x[key] + 0.25, height / 2, f"{name}: sum of (T, {D}) partials\n{data['all_reduce_bytes_per_token']:,}"
                " bytes per token", rotation=90, ha="center", va="center", fontsize=7)
    whole = data["whole"]
    replicated = f"; each KV head on {data['kv_replicas']} ranks (vLLM's rule)" if data["kv_replicas"] > 1 else ""
    ax.set_title(f"One layer of {model_name or config.name} split over {size} ranks (Megatron-style tensor "
                 f"parallelism)\n"
                 f"whole: w_qkv {whole['w_qkv']}, wo {whole['wo']}, w_gate_up {whole['w_gate_up']}, "
                 f"w_down {whole['w_down']}; darker: column-parallel (split outputs), lighter: row-parallel (split "
                 f"inputs, partial sums){replicated}", fontsize=9)
    ax.set_xlim(-1.0, right + 0.2)
    ax.set_ylim(-0.9, height + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data


def _span(bounds: list[int]) -> str:
    start, stop = bounds
    return f"{start}" if stop - start == 1 else f"{start}-{stop - 1}"
