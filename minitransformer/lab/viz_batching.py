"""Why batching pays, and where it stops: decode tokens/s and ITL against the batch size (lessons 02 and 08).

    batching_sweep.png   one decode step of B sequences, each with CONTEXT tokens cached, timed on this machine for
                         B = 1 .. 64 (the fastest of a few steps after a warm-up): tokens/s = B / step time, and the
                         step time itself, which is every sequence's ITL; next to them the roofline projection of the
                         same steps on an H200 (lab/machine.py's datasheet peaks: a lower bound on time, no launch
                         costs). A marker shows the batch size from which no doubling gains STOPS_PAYING in tokens/s
                         any more

Decode reads every weight once per step whatever B is, so while the step is bound by memory a bigger batch is more
tokens for nearly the same time: tokens/s grows almost linearly and ITL hardly moves. Once the arithmetic of B rows
takes longer than reading the weights, time grows with B and tokens/s flattens, while every sequence waits longer
per token. On a 2-core CPU that point comes early; on an H200 its ridge (~200 FLOP/byte) puts it at a batch in the
hundreds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.decode import decode_step
from ..core.kv_cache import KVCache
from ..core.prefill import prefill
from .machine import H200
from .measure import time_calls
from .viz_concepts import pyplot

BATCHES = (1, 2, 4, 8, 16, 32, 64)
QUICK_BATCHES = (1, 4)
CONTEXT = 128                    # tokens cached per sequence before the timed steps
STEP_REPEATS = 5                 # timed steps per batch size, after one warm-up step
STOPS_PAYING = 1.2               # a doubling that gains less than this much in tokens/s: batching has stopped paying


@dataclass
class BatchSweep:
    batches: tuple[int, ...]
    step_s: list[float]          # fastest decode step per batch size (= each sequence's ITL)
    slowest_s: list[float]
    h200_step_s: list[float]     # roofline time of the same step on an H200 (bf16)
    context: int

    @property
    def tokens_per_s(self) -> list[float]:
        return [b / s for b, s in zip(self.batches, self.step_s)]

    @property
    def h200_tokens_per_s(self) -> list[float]:
        return [b / s for b, s in zip(self.batches, self.h200_step_s)]


def stops_paying(batches, tokens_per_s, factor: float = STOPS_PAYING) -> int | None:
    """The batch size from which no doubling in the sweep gains `factor` in tokens/s any more (None: the last
    doubling still did, so batching had not stopped paying by the end of the sweep)."""
    doublings = [(b0, t1 / t0 >= factor) for (b0, t0), (b1, t1)
                 in zip(zip(batches, tokens_per_s), zip(batches[1:], tokens_per_s[1:])) if b1 == 2 * b0]
    if not doublings or doublings[-1][1]:
        return None
    after_last_paid = max((i + 1 for i, (_, paid) in enumerate(doublings) if paid), default=0)
    return doublings[after_last_paid][0]


def measure_batch_sweep(model, batches=BATCHES, context: int = CONTEXT, repeats: int = STEP_REPEATS,
                        tick=lambda: None) -> BatchSweep:
    """Time decode_step at each batch size on a KVCache holding `context` tokens of every sequence."""
    ids = model.tokenizer.encode("The weather today is " * context)[:context]
    fastest, slowest = [], []
    for batch in batches:
        cache = KVCache(model.config, context + 1 + repeats, batch=batch, xp=model.xp)
        prefill(model, [ids] * batch, cache)                                   # (B, context) prompts
        tokens = [ids[-1]] * batch                                             # (B,) the step's input tokens
        timing = time_calls(functools.partial(decode_step, model, tokens, cache), repeats=repeats, warmup=1)
        fastest.append(timing.min)
        slowest.append(timing.max)
        cache.release()
        tick()
    h200 = [H200.seconds(H200.cost(model.config, 1, context, batch=b)) for b in batches]
    return BatchSweep(tuple(batches), fastest, slowest, h200, context)


def draw_batching_sweep(model, sweep: BatchSweep, where: str, path) -> int | None:
    """Tokens/s and ITL against the batch size, this machine measured and the H200 projected; returns where
    batching stopped paying here (None if it never did in this sweep)."""
    plt = pyplot()
    here = stops_paying(sweep.batches, sweep.tokens_per_s)
    fig, (rate_ax, itl_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    b = np.array(sweep.batches)
    rate_ax.plot(b, sweep.tokens_per_s, "o-", color="tab:blue", label="this machine, measured (fastest step)")
    rate_ax.plot(b, sweep.h200_tokens_per_s, "s--", color="tab:green", label="H200, roofline projection (bf16)")
    itl_ax.plot(b, np.array(sweep.step_s) * 1e3, "o-", color="tab:blue", label="this machine, measured")
    itl_ax.vlines(b, np.array(sweep.step_s) * 1e3, np.array(sweep.slowest_s) * 1e3, color="grey", lw=1)
    itl_ax.plot(b, np.array(sweep.h200_step_s) * 1e3, "s--", color="tab:green", label="H200, roofline projection")
    rates = sweep.tokens_per_s
    if here is not None:
        i = sweep.batches.index(here)
        rate_ax.annotate(f"from batch {here} on, no doubling gains x{STOPS_PAYING}:\nbatching stops paying here",
                         (here, rates[i]), textcoords="axes fraction", xytext=(0.45, 0.25), fontsize=8,
                         color="tab:red", arrowprops=dict(arrowstyle="->", color="red"))
    else:
        sizes = sweep.batches
        rate_ax.text(0.02, 0.03, f"the last doubling ({sizes[-2]} -> {sizes[-1]}) still gained "
                     f"x{rates[-1] / rates[-2]:.2f} (>= x{STOPS_PAYING}):\nbatching had not stopped paying by batch "
                     f"{sizes[-1]}",
                     transform=rate_ax.transAxes, fontsize=7.5, color="tab:red")
    if len(rates) > 1 and sweep.batches[:2] == (1, 2) and rates[1] < rates[0]:
        rate_ax.annotate(f"batch 2 gives fewer tokens/s than batch 1 (x{rates[1] / rates[0]:.2f}): one row takes\n"
                         f"BLAS's matrix-vector path; two or more its matrix-matrix path, which re-packs\n"
                         f"the weights at every call (docs/ARCHITECTURE.md, \"Where the time goes\")",
                         (2, rates[1]), textcoords="axes fraction", xytext=(0.03, 0.42), fontsize=7.5,
                         arrowprops=dict(arrowstyle="->", color="grey"))
    for ax in (rate_ax, itl_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (sequences decoded in one step)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    rate_ax.set_ylabel("decode tokens/s (batch / step time)")
    itl_ax.set_ylabel("step time = each sequence's ITL (ms)")
    rate_ax.set_title("throughput grows with the batch while the step reads the same weights", fontsize=9.5)
    itl_ax.set_title("each sequence waits one step per token", fontsize=9.5)
    fig.suptitle(f"Batching: decode tokens/s and ITL against the batch size, {sweep.context} tokens cached per "
                 f"sequence ({model.path.stem})\n{where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return here
