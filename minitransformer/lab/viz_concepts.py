"""Two concept diagrams drawn from the real objects of a real run, not by hand (lessons 09 and 12).

    paged_attention.png     three requests on serving.Engine, stopped after a few steps: each one's logical blocks,
                            its block table, and the physical pool row they point into (a prefix block in two tables)
    draft_and_verify.png    a greedy n-gram speculative run: per target pass the drafts, which were kept, the first
                            one rejected, and the token the target supplied itself

Each draw_* function runs the engine (or generate), reads what it recorded, draws it and returns that data, so a test
can check that every number in the picture is the run's own. `minitransformer figures` calls both.
"""

from __future__ import annotations

from pathlib import Path

from ..core.generate import generate
from ..core.sampling_params import SamplingParams
from ..serving import Engine
from ..speculative import speculative_runner

# Paged attention: two requests share a system text longer than two blocks, so prefix caching maps their first
# blocks to the same physical blocks; the third request shares nothing. A small pool keeps the whole row readable.
BLOCK_SIZE, NUM_BLOCKS, PAGED_STEPS = 16, 24, 4
SHARED = ("You are a helpful assistant for a cooking school. Answer briefly and politely, use metric units, name the "
          "utensils needed, and warn about hot surfaces and sharp knives when they matter.")       # 36 tokens
PAGED_PROMPTS = {"A": SHARED + " Question: how do I boil an egg?",
                 "B": SHARED + " Question: how long should pasta cook?",
                 "C": "The history of the printing press begins in the fifteenth century."}
PAGED_PARAMS = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
# Earlier traffic: on a fresh pool the free list hands out blocks 0, 1, 2, ... and every table would look contiguous.
# These three decode side by side until they fill the whole pool, then finish; the blocks come back to the free list
# interleaved, as a server's do after a while, so the tables drawn afterwards are scattered over the pool.
EARLIER_PROMPTS = ("Tell me about the ocean.", "Describe a forest in winter.", "Explain how bread rises.")

# Draft and verify: lesson 12's "repeat" prompt, where the n-gram drafter finds the list it is asked to repeat, at
# lesson 12's default length and one of its k, so the picture is one row of that lesson's table 2 (lesson 12 imports
# these three: one run, one set of counts).
SPEC_PROMPT = ("Here is a list of fruits: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum.\n"
               "The same list again, comma-separated: apple, banana,")
SPEC_PARAMS, SPEC_K = SamplingParams(max_tokens=32, temperature=0.0), 4

SEQ_COLOURS = ("tab:blue", "tab:purple", "tab:olive")
FREE, USED, SHARED_COLOUR = "#f2f2f2", "#bcd8f0", "#f5a623"
ACCEPTED, REJECTED, TARGET, DISCARDED = "#7ccf7c", "#f08080", "#7fb2f0", "#e0e0e0"


def run_earlier_traffic(engine: Engine, model) -> None:
    """EARLIER_PROMPTS to the end, each growing to an equal share of the pool (its prompt + max_tokens - 1 tokens:
    the last sampled token is never stored), so that together they hold every block once."""
    share = NUM_BLOCKS // len(EARLIER_PROMPTS) * BLOCK_SIZE
    for i, prompt in enumerate(EARLIER_PROMPTS):
        fill = share + 1 - len(model.tokenizer.encode(prompt))
        engine.add_request(prompt, SamplingParams(max_tokens=fill, temperature=0.0, ignore_eos=True),
                           request_id=f"earlier {i}")
    engine.run()


def run_paged_engine(model) -> Engine:
    """The paged scenario, stopped mid-run: after the earlier traffic, A is prefilled alone first so its full blocks
    are cached (hashed) when B arrives; then B (prefix hit) and C join, and the engine runs a few more steps. Returns
    the engine at that point."""
    engine = Engine(model, max_num_seqs=4, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    run_earlier_traffic(engine, model)
    engine.add_request(PAGED_PROMPTS["A"], PAGED_PARAMS, request_id="A")
    engine.step()
    for rid in ("B", "C"):
        engine.add_request(PAGED_PROMPTS[rid], PAGED_PARAMS, request_id=rid)
    for _ in range(PAGED_STEPS - 1):
        engine.step()
    return engine


def paged_snapshot(engine: Engine) -> dict:
    """What the diagram shows, read from the engine's snapshot(): per request its tokens, computed tokens and block
    table; the pool's reference counts; the blocks held by more than one table."""
    state = engine.snapshot()
    sequences = [{"request_id": seq.request_id, "num_tokens": seq.num_tokens,
                  "num_computed_tokens": seq.num_computed_tokens, "block_table": list(seq.block_table)}
                 for seq in state.running + state.waiting]
    return {"block_size": state.config.block_size, "num_blocks": state.config.num_blocks, "steps": state.step,
            "sequences": sequences, "ref_counts": list(state.ref_counts),
            "shared_blocks": [b for b, count in enumerate(state.ref_counts) if count > 1],
            "prefix_cache_hits": state.stats.prefix_cache_hits}


def pyplot():
    import matplotlib
    matplotlib.use("Agg")                                         # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def draw_paged_attention(model, path) -> dict:
    """Run the paged scenario and draw logical blocks -> block table -> physical pool; return the drawn data."""
    from matplotlib.patches import FancyArrowPatch, Rectangle
    plt = pyplot()
    data = paged_snapshot(run_paged_engine(model))
    B, N, counts = data["block_size"], data["num_blocks"], data["ref_counts"]
    fig, ax = plt.subplots(figsize=(12, 6.4))
    pool_y, row_gap = 0.0, 1.6
    # the physical pool: one cell per block, coloured by how many block tables hold it
    for b in range(N):
        colour = FREE if counts[b] == 0 else SHARED_COLOUR if counts[b] > 1 else USED
        ax.add_patch(Rectangle((b, pool_y), 0.92, 0.8, facecolor=colour, edgecolor="black", lw=0.8))
        ax.text(b + 0.46, pool_y + 0.5, str(b), ha="center", va="center", fontsize=8, weight="bold")
        ax.text(b + 0.46, pool_y + 0.18, f"ref {counts[b]}", ha="center", va="center", fontsize=6)
    ax.text(-0.3, pool_y + 0.4, f"physical KV pool\n({N} blocks x {B} tokens)", ha="right", va="center", fontsize=9)
    # each sequence: its logical blocks (positions they hold), then an arrow from each to its physical block
    for i, seq in enumerate(data["sequences"]):
        y, colour = pool_y + 2.2 + (len(data["sequences"]) - 1 - i) * row_gap, SEQ_COLOURS[i % len(SEQ_COLOURS)]
        x0 = 1.0 + i * 7.5                                         # rows offset so the arrows fan out, not overlap
        ax.text(x0 - 0.3, y + 0.4, f"request {seq['request_id']}\n{seq['num_computed_tokens']} tokens cached",
                ha="right", va="center", fontsize=9, color=colour, weight="bold")
        for j, block in enumerate(seq["block_table"]):
            start, end = j * B, min((j + 1) * B, seq["num_computed_tokens"]) - 1
            shared = counts[block] > 1
            ax.add_patch(Rectangle((x0 + j * 1.2, y), 1.1, 0.8, facecolor=SHARED_COLOUR if shared else USED,
                                   edgecolor=colour, lw=1.6))
            positions = f"{start}-{end}" if end >= start else "(empty)"
            ax.text(x0 + j * 1.2 + 0.55, y + 0.55, f"L{j}", ha="center", va="center", fontsize=8)
            ax.text(x0 + j * 1.2 + 0.55, y + 0.22, positions, ha="center", va="center", fontsize=6.5)
            ax.add_patch(FancyArrowPatch((x0 + j * 1.2 + 0.55, y), (block + 0.46, pool_y + 0.8), arrowstyle="-|>",
                                         mutation_scale=9, color=colour, lw=1.0, alpha=0.8))
        ax.text(x0 + len(seq["block_table"]) * 1.2 + 0.1, y + 0.4, f"block table {seq['block_table']}",
                va="center", fontsize=8, family="monospace", color=colour)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black") for c in (FREE, USED, SHARED_COLOUR)]
    ax.legend(handles, ["free (ref 0)", "used by one table", "shared by several tables (prefix cache)"],
              loc="lower center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"Paged attention: block tables map each request's logical blocks to physical blocks\n"
                 f"serving.Engine on {model.path.stem}, {PAGED_STEPS} steps after A arrived, on a pool that earlier "
                 f"requests had filled and emptied (so the tables are scattered)\nA and B share a "
                 f"{len(data['shared_blocks'])}-block prompt prefix (prefix-cache hits: "
                 f"{data['prefix_cache_hits']} tokens)", fontsize=10)
    ax.set_xlim(-4.5, N + 0.5)
    ax.set_ylim(-0.3, pool_y + 2.2 + len(data["sequences"]) * row_gap)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data


def run_speculative(model):
    """The greedy n-gram run of lesson 12's "repeat" prompt; its Result carries the per-pass record."""
    return generate(model, SPEC_PROMPT, SPEC_PARAMS, runner=speculative_runner("ngram", SPEC_K))


def token_piece(tokenizer, token: int) -> str:
    return repr(tokenizer.decode([token]))[1:-1].replace(" ", "\u2423")      # newlines and spaces stay visible


def draw_draft_and_verify(model, path) -> dict:
    """Run the speculative request and draw each target pass: drafts kept (green), the first rejected (red),
    drafts after it discarded (grey), the target's own token (blue). Returns the run's token ids and passes."""
    from matplotlib.patches import Rectangle
    plt = pyplot()
    result = run_speculative(model)
    spec, tok = result.speculative, model.tokenizer
    passes = [{"drafted": d, "accepted": a, "target_token": t} for d, a, t in spec["passes"]]
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.42 * len(passes)))
    width = 1.5
    for i, p in enumerate(passes):
        y = len(passes) - 1 - i
        label = "prefill" if i == 0 else f"pass {i}"
        ax.text(-0.2, y + 0.4, label, ha="right", va="center", fontsize=8)
        for j, token in enumerate(p["drafted"]):
            colour = ACCEPTED if j < p["accepted"] else REJECTED if j == p["accepted"] else DISCARDED
            ax.add_patch(Rectangle((j * width, y), width * 0.95, 0.8, facecolor=colour, edgecolor="grey", lw=0.6))
            ax.text(j * width + width * 0.47, y + 0.4, token_piece(tok, token), ha="center", va="center", fontsize=7,
                    family="monospace")
        x = SPEC_K * width + 0.4
        if p["target_token"] is not None:
            ax.add_patch(Rectangle((x, y), width * 0.95, 0.8, facecolor=TARGET, edgecolor="grey", lw=0.6))
            ax.text(x + width * 0.47, y + 0.4, token_piece(tok, p["target_token"]), ha="center", va="center",
                    fontsize=7, family="monospace")
        gained = p["accepted"] + (p["target_token"] is not None)
        plural = "s" * (gained != 1)
        note = (f"{p['accepted']}/{len(p['drafted'])} drafts kept, +{gained} token{plural}" if p["drafted"] else
                "the first token" if i == 0 else "no n-gram match: a plain decode step, +1 token")
        ax.text(x + width + 0.2, y + 0.4, note, va="center", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c) for c in (ACCEPTED, REJECTED, DISCARDED, TARGET)]
    ax.legend(handles, ["draft accepted", "first draft rejected", "draft discarded (after a rejection)",
                        "token from the target's own logits"], loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=4, fontsize=8, frameon=False)
    ax.set_title(f"Draft and verify: greedy n-gram speculation, k={SPEC_K}, on {model.path.stem}\n"
                 f"{len(result.token_ids)} tokens in {spec['target_passes']} target passes; "
                 f"{spec['accepted_tokens']}/{spec['draft_tokens']} checked drafts accepted (grey ones are never "
                 "checked)", fontsize=10, pad=22)
    ax.set_xlim(-1.6, SPEC_K * width + 0.4 + width + 4.2)
    ax.set_ylim(-0.2, len(passes))
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return {"token_ids": list(result.token_ids), "speculative": {k: v for k, v in spec.items() if k != "passes"},
            "passes": passes}
